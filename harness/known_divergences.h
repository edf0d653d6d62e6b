// Known divergences: data files listing where a backend (a real engine, e.g. `mlx`) is
// known to differ from kvlab's oracle, each classified and explained, so a check over a
// whole tier can pass while every difference stays written down — and fails again the
// day it is not written down, or no longer reproduces.
//
// One entry per line (`#` comments):
//   <backend> | <op> key=value[,value...] ... | <class> | <note>
// A problem matches when its op is <op> and, for each listed key, its canonical value is
// one of the listed values (keys not listed match anything); `key~=REGEX` instead matches
// when the regex (ECMAScript, no spaces, no '|') is found in the value, e.g.
// `script~=\bs\b` for every cache script with a save-reload. <class> is one of
//   upstream-bug      the engine is wrong (a crash, a non-finite result for finite input,
//                     a read of memory the contract says is never read)
//   representation    both are right under their own contract (arithmetic in T where
//                     the oracle rounds once, NaN payloads, unspecified rows)
//   kvlab-bug         kvlab is wrong and is being fixed (should not stay long)
// A FAILED case of that backend matching an entry becomes SKIPPED with the reason
// "known divergence (<class>, file:line): <note>"; an entry that matched cases in a run
// over a whole tier but none of them failed is stale, and the run fails naming it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "harness/problem.h"
#include "harness/spine.h"

namespace kvlab::harness {

struct KnownDivergence {
  std::string where;  // file:line
  std::string backend, op, klass, note;
  std::vector<std::pair<std::string, std::vector<std::string>>> match;
  std::vector<std::pair<std::string, std::string>> patterns;  // key~=REGEX (compiled in the .cc)
  std::uint64_t matched = 0, failed = 0;  // counts of the current run
};

class KnownDivergences {
 public:
  KnownDivergences() = default;
  // Throws Error(invalid_argument) naming file:line for a malformed entry, an unknown op
  // or key, or an unknown class.
  explicit KnownDivergences(const std::vector<std::filesystem::path>& files);
  bool empty() const { return entries_.empty(); }
  // The first entry matching `p` for backend `backend` (its base name before ':'), or null.
  KnownDivergence* match(const Problem& p, std::string_view backend);
  // Counts `r` against the first entry matching `p` for `backend`; a FAILED result the
  // entry explains becomes SKIPPED with the entry's class, place and note.
  void apply(const Problem& p, std::string_view backend, CaseResult& r);
  // Entries that matched cases of this run without a single failure.
  std::vector<const KnownDivergence*> stale() const;
  // "N known divergences over M entries (...); stale: ..." lines. judged: whether stale
  // entries fail this run (a whole tier) or are only noted (a partial selection).
  void summarize(std::ostream& out, bool judged = true) const;

 private:
  std::vector<KnownDivergence> entries_;
};

}  // namespace kvlab::harness

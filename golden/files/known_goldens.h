// Registers of known golden divergences (golden/known/<backend or engine>): goldens that
// fail on a backend for a reason written down, in the format of
// harness/known_divergences.h with the op `golden`:
//   <backend> | golden [model=a,b] [scenario=x,y] [raise~=REGEX] | <class> | <note>
// model= and scenario= filter by name; raise~= searches (ECMAScript, no spaces, no '|')
// the failure's reasons and first divergence. `kvlab golden check --backend B` reads
// golden/known/B: a failing golden an entry explains is reported KNOWN with the entry's
// class, place and note instead of failing; a failure no entry explains fails; an entry
// whose model and scenario ran but whose goldens all passed is stale and fails the run,
// so the register stays true. (golden/known/mlx-lm is the mlx-lm replay's register, read
// by tools/golden_table.py with the same rules.)
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kvlab::golden {

struct KnownGolden {
  std::string where, backend, klass, note;  // where: file:line
  std::vector<std::string> models, scenarios;  // empty: any
  std::string raise;                           // the pattern as written; empty: any failure
  int ran = 0, explained = 0;                  // counts of this run
};

class KnownGoldens {
 public:
  KnownGoldens();
  // Error(invalid_argument) naming file:line for a malformed entry; Error(io) for a file
  // that is not a regular file.
  explicit KnownGoldens(const std::filesystem::path& file);
  ~KnownGoldens();
  KnownGoldens(KnownGoldens&&) noexcept;
  KnownGoldens& operator=(KnownGoldens&&) noexcept;

  // Counts a golden of model.scenario run on `backend` (base name, before ':') against
  // every entry naming it; returns the first entry that explains it when it failed with
  // `finding`, else null.
  const KnownGolden* judge(const std::string& backend, const std::string& model, const std::string& scenario,
                           bool failed, const std::string& finding);
  std::vector<const KnownGolden*> stale() const;
  std::size_t size() const { return entries_.size(); }

 private:
  struct Patterns;
  std::vector<KnownGolden> entries_;
  std::unique_ptr<Patterns> patterns_;
};

}  // namespace kvlab::golden

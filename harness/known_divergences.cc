// GCC 12 at -O1 with ASan reports -Wmaybe-uninitialized inside <regex>'s std::function
// members (a false positive in libstdc++'s regex compiler); <regex> is used in this file
// only, so the warning is silenced here alone.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>

#include "harness/known_divergences.h"

#include <algorithm>
#include <map>
#include <fstream>
#include <ostream>
#include <sstream>

#include "harness/op.h"
#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

// Each pattern compiled once (registers are read once per run; matching is per case).
const std::regex& compiled(const std::string& pattern) {
  static std::map<std::string, std::regex> cache;
  auto it = cache.find(pattern);
  if (it == cache.end()) it = cache.emplace(pattern, std::regex(pattern)).first;
  return it->second;
}

constexpr std::string_view kClasses[] = {"upstream-bug", "representation", "kvlab-bug"};

KnownDivergence parse_entry(const std::string& line, const std::string& where) {
  const std::vector<std::string> fields = split(line, '|');
  KVLAB_REQUIRE(fields.size() == 4, invalid_argument, where, ": a known divergence has 4 fields "
                "'backend | op key=value... | class | note', got ", fields.size());
  KnownDivergence d;
  d.where = where;
  d.backend = fields[0];
  d.klass = fields[2];
  d.note = fields[3];
  KVLAB_REQUIRE(std::find(std::begin(kClasses), std::end(kClasses), d.klass) != std::end(kClasses), invalid_argument,
                where, ": unknown class '", d.klass, "' (upstream-bug, representation, kvlab-bug)");
  KVLAB_REQUIRE(!d.note.empty(), invalid_argument, where, ": a known divergence needs a note saying why");
  std::istringstream words(fields[1]);
  words >> d.op;
  const OpInfo* op = nullptr;
  try {
    op = &find_op(d.op);
  } catch (const Error& e) {
    fail(ErrorKind::invalid_argument, cat(where, ": ", e.what()));
  }
  const std::vector<ParamSpec>& params = op->params();
  for (std::string w; words >> w;) {
    const auto eq = w.find('=');
    KVLAB_REQUIRE(eq != std::string::npos && eq > 0, invalid_argument, where, ": '", w, "' is not key=value");
    std::string key = w.substr(0, eq);
    const bool pattern = key.back() == '~';
    if (pattern) key.pop_back();
    KVLAB_REQUIRE(std::any_of(params.begin(), params.end(), [&](const ParamSpec& s) { return s.key == key; }),
                  invalid_argument, where, ": op ", d.op, " has no parameter '", key, "'");
    if (!pattern) {
      d.match.emplace_back(std::move(key), split(w.substr(eq + 1), ','));
      continue;
    }
    try {
      compiled(w.substr(eq + 1));
    } catch (const std::regex_error& e) {
      fail(ErrorKind::invalid_argument, cat(where, ": '", w, "' is not a valid regex: ", e.what()));
    }
    d.patterns.emplace_back(std::move(key), w.substr(eq + 1));
  }
  return d;
}

}  // namespace

KnownDivergences::KnownDivergences(const std::vector<std::filesystem::path>& files) {
  for (const std::filesystem::path& f : files) {
    std::ifstream in(f);
    KVLAB_REQUIRE(in.good(), io, "cannot read known-divergence file ", f.string());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      KVLAB_REQUIRE(line.size() <= 4096, invalid_argument, f.string(), ":", n, ": line longer than 4096 bytes");
      const std::string text = trim(line.substr(0, line.find('#')));
      if (!text.empty()) entries_.push_back(parse_entry(text, cat(f.string(), ":", n)));
    }
  }
}

KnownDivergence* KnownDivergences::match(const Problem& p, std::string_view backend) {
  const std::string_view base = backend.substr(0, backend.find(':'));
  for (KnownDivergence& d : entries_) {
    if (d.backend != base || d.op != p.op()) continue;
    const bool all = std::all_of(d.match.begin(), d.match.end(), [&](const auto& kv) {
      const std::string& value = p.word(kv.first);
      return std::find(kv.second.begin(), kv.second.end(), value) != kv.second.end();
    });
    const bool found = std::all_of(d.patterns.begin(), d.patterns.end(), [&](const auto& kv) {
      return std::regex_search(p.word(kv.first), compiled(kv.second));
    });
    if (all && found) return &d;
  }
  return nullptr;
}

void KnownDivergences::apply(const Problem& p, std::string_view backend, CaseResult& r) {
  KnownDivergence* d = match(p, backend);
  if (d == nullptr) return;
  ++d->matched;
  if (r.status != Status::failed) return;
  ++d->failed;
  r.status = Status::skipped;
  r.reason = cat("known divergence (", d->klass, ", ", d->where, "): ", d->note, " [was: ", r.reason, "]");
}

std::vector<const KnownDivergence*> KnownDivergences::stale() const {
  std::vector<const KnownDivergence*> out;
  for (const KnownDivergence& d : entries_) {
    if (d.matched > 0 && d.failed == 0) out.push_back(&d);
  }
  return out;
}

void KnownDivergences::summarize(std::ostream& out, bool judged) const {
  std::uint64_t failed = 0, used = 0;
  for (const KnownDivergence& d : entries_) {
    failed += d.failed;
    used += d.failed > 0;
  }
  out << "known divergences: " << failed << " failing cases explained by " << used << " of " << entries_.size()
      << " entries\n";
  for (const KnownDivergence& d : entries_) {
    if (d.failed > 0) out << "  " << d.failed << "/" << d.matched << " cases  " << d.klass << "  " << d.where << "\n";
  }
  for (const KnownDivergence* d : stale()) {
    if (!judged) {
      out << "  (not judged on a partial selection) " << d->where << ": matched " << d->matched
          << " cases, none failed\n";
      continue;
    }
    out << "  STALE " << d->where << ": matched " << d->matched << " cases and none failed (" << d->backend << " | "
        << d->op << "): the divergence no longer reproduces; remove or narrow the entry\n";
  }
}

}  // namespace kvlab::harness

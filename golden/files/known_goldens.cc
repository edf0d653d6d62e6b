// GCC 12 at -O1 with ASan reports -Wmaybe-uninitialized inside <regex>'s std::function
// members (a false positive in libstdc++'s regex compiler, as in
// harness/known_divergences.cc); silenced in this file alone.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>

#include "golden/files/known_goldens.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "golden/files/inputs.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

std::string trimmed(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\r") - b + 1));
}

std::vector<std::string> split_on(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(trimmed(s.substr(start, i - start)));
      start = i + 1;
    }
  return out;
}

bool listed(const std::vector<std::string>& list, const std::string& name) {
  return list.empty() || std::find(list.begin(), list.end(), name) != list.end();
}

constexpr std::string_view kGoldenClasses[] = {"upstream-bug", "representation", "kvlab-bug"};

}  // namespace

struct KnownGoldens::Patterns {
  std::vector<std::regex> raise;  // per entry; unused where the entry has none
};

KnownGoldens::KnownGoldens() = default;
KnownGoldens::~KnownGoldens() = default;
KnownGoldens::KnownGoldens(KnownGoldens&&) noexcept = default;
KnownGoldens& KnownGoldens::operator=(KnownGoldens&&) noexcept = default;

KnownGoldens::KnownGoldens(const std::filesystem::path& file) : patterns_(std::make_unique<Patterns>()) {
  require_regular_file(file, "register of known golden divergences");
  std::ifstream in(file);
  KVLAB_REQUIRE(in, io, "cannot open '", file.string(), "'");
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = cat(file.string(), ":", number);
    const std::string text = trimmed(line);
    if (text.empty() || text[0] == '#') continue;
    const auto fields = split_on(text, '|');
    KVLAB_REQUIRE(fields.size() == 4, invalid_argument, where,
                  ": an entry has 4 fields 'backend | golden key=value... | class | note', got ", fields.size());
    KnownGolden e;
    e.where = where, e.backend = fields[0], e.klass = fields[2], e.note = fields[3];
    KVLAB_REQUIRE(std::find(std::begin(kGoldenClasses), std::end(kGoldenClasses), e.klass) != std::end(kGoldenClasses),
                  invalid_argument, where, ": unknown class '", e.klass, "' (upstream-bug, representation, kvlab-bug)");
    KVLAB_REQUIRE(!e.backend.empty() && !e.note.empty(), invalid_argument, where, ": an entry needs a backend and a note");
    std::istringstream words(fields[1]);
    std::string op;
    words >> op;
    KVLAB_REQUIRE(op == "golden", invalid_argument, where, ": the op of a golden register is 'golden', not '", op, "'");
    std::regex pattern;
    for (std::string w; words >> w;) {
      const auto eq = w.find('=');
      KVLAB_REQUIRE(eq != std::string::npos && eq > 0 && eq + 1 < w.size(), invalid_argument, where, ": '", w,
                    "' is not key=value");
      const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
      if (key == "model" || key == "scenario") {
        (key == "model" ? e.models : e.scenarios) = split_on(value, ',');
      } else if (key == "raise~") {
        e.raise = value;
        try {
          pattern = std::regex(value);
        } catch (const std::regex_error& err) {
          fail(ErrorKind::invalid_argument, cat(where, ": raise~=", value, " is not a regex: ", err.what()));
        }
      } else {
        fail(ErrorKind::invalid_argument, cat(where, ": unknown key '", key, "' (model=, scenario=, raise~=)"));
      }
    }
    entries_.push_back(std::move(e));
    patterns_->raise.push_back(std::move(pattern));
  }
}

const KnownGolden* KnownGoldens::judge(const std::string& backend, const std::string& model,
                                       const std::string& scenario, bool failed, const std::string& finding) {
  const std::string base = backend.substr(0, backend.find(':'));
  const KnownGolden* first = nullptr;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    KnownGolden& e = entries_[i];
    if (e.backend != base || !listed(e.models, model) || !listed(e.scenarios, scenario)) continue;
    ++e.ran;
    if (first != nullptr || !failed || (!e.raise.empty() && !std::regex_search(finding, patterns_->raise[i]))) continue;
    ++e.explained;  // the first entry that explains a failure takes it, as in the harness
    first = &e;
  }
  return first;
}

std::vector<const KnownGolden*> KnownGoldens::stale() const {
  std::vector<const KnownGolden*> out;
  for (const KnownGolden& e : entries_)
    if (e.ran > 0 && e.explained == 0) out.push_back(&e);
  return out;
}

}  // namespace kvlab::golden

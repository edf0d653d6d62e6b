// Problems are data: one canonical line per problem, `op key=value ... seed=N`.
//
// Every op declares its parameters (ParamSpec) in a fixed order with defaults, so a
// line written with any subset of keys, in any order, canonicalizes to the one line
// that names every parameter; that line parses back to the same Problem, and it is
// also the key of the random fill (harness/rng.h), so printing it is a complete repro.
//
// Case files (harness/cases/<op>/<role>) hold such lines, `#` comments, and a product
// syntax: `bits=2,3,4 group=32,64` expands to the cartesian product (first key varies
// slowest), so shape matrices are data rather than nested loops.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlab::harness {

enum class ParamKind : std::uint8_t { integer, real, word };

struct ParamSpec {
  std::string key;
  ParamKind kind = ParamKind::integer;
  std::string default_value;
  std::vector<std::string> choices;  // word params: the legal values (first = simplest);
                                     // empty: any one token, validated by the op
  // Shrinking: integers shrink toward `shrink_min` (when shrink_min <= value); words
  // shrink to choices[0]. shrink = false keeps the parameter (dtype, seed, ...).
  bool shrink = false;
  std::int64_t shrink_min = 1;
  // A key added after case files and repro lines were written: the canonical line names it
  // only when its value differs from the default, so every older line (and the random fill
  // keyed by it) stays exactly what it was.
  bool quiet_default = false;
};

class Problem {
 public:
  Problem() = default;
  Problem(std::string op, std::vector<std::pair<std::string, std::string>> params);

  const std::string& op() const { return op_; }
  const std::vector<std::pair<std::string, std::string>>& params() const { return params_; }

  // Typed reads; throw kvlab::Error (invalid_argument) naming the key when missing or
  // not of the right form.
  const std::string& word(std::string_view key) const;
  std::int64_t integer(std::string_view key) const;
  int int32(std::string_view key) const;  // integer() checked to fit an int
  double real(std::string_view key) const;
  bool flag(std::string_view key) const { return integer(key) != 0; }
  std::uint64_t seed() const { return static_cast<std::uint64_t>(integer("seed")); }

  // Returns a copy with one parameter replaced (value canonicalized).
  Problem with(std::string_view key, std::string_view value) const;

  // The canonical one-line form: `op k1=v1 k2=v2 ... seed=N` in declared order; a
  // quiet_default key at its default is left out.
  std::string line() const;
  friend bool operator==(const Problem& a, const Problem& b) = default;

 private:
  std::string op_;
  std::vector<std::pair<std::string, std::string>> params_;  // declared order, complete
};

// The parameter list of an op (its declared params plus `seed`, always last).
const std::vector<ParamSpec>& op_params(std::string_view op);

// One line without product syntax -> the canonical Problem. Unknown ops/keys, repeated
// keys, malformed values and unknown words throw kvlab::Error naming the culprit.
Problem parse_problem(std::string_view line);

// One line with product syntax, parsed and validated once; its problems are made one at
// a time (at(k)), so a line whose product is huge is counted, never materialized.
class LineExpansion {
 public:
  explicit LineExpansion(std::string_view line);  // throws like parse_problem
  const std::string& op() const { return op_; }
  // Number of problems of the product (saturates at UINT64_MAX; duplicates included).
  std::uint64_t size() const { return size_; }
  // The k-th problem, k < size(), in odometer order (the first listed key varies slowest).
  Problem at(std::uint64_t k) const;

 private:
  std::string op_;
  std::vector<std::string> keys_;                 // declared order
  std::vector<std::vector<std::string>> values_;  // canonical values per declared key
  std::vector<std::size_t> order_;                // keys as listed in the line
  std::uint64_t size_ = 1;
};

// The most problems expand_line() and load_case_file() materialize; larger products
// are an Error telling to stream them (kvlab check does).
inline constexpr std::uint64_t kMaxMaterializedProblems = 100000;

// One line, possibly with comma lists, -> every Problem of the cartesian product.
std::vector<Problem> expand_line(std::string_view line);

// A case file's lines, parsed but not expanded. Comments stripped; errors name file and
// line. The file must be a readable regular file of at most kMaxCaseFileBytes with lines
// of at most kMaxCaseLineBytes (a case file is text someone wrote, not a data dump).
inline constexpr std::uintmax_t kMaxCaseFileBytes = 64u << 20;
inline constexpr std::size_t kMaxCaseLineBytes = 1u << 20;
struct CaseLine {
  std::string where;  // "file:line"
  LineExpansion expansion;
};
std::vector<CaseLine> read_case_file(const std::filesystem::path& path);

// A case file, every line expanded (at most kMaxMaterializedProblems problems).
std::vector<Problem> load_case_file(const std::filesystem::path& path);

// Canonical text of a value of the given kind (throws on a malformed value).
std::string canonical_value(const ParamSpec& spec, std::string_view value);

}  // namespace kvlab::harness

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

  // The canonical one-line form: `op k1=v1 k2=v2 ... seed=N` in declared order.
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

// One line, possibly with comma lists, -> every Problem of the cartesian product.
std::vector<Problem> expand_line(std::string_view line);

// A case file: comments stripped, each line expanded. Errors name file and line.
std::vector<Problem> load_case_file(const std::filesystem::path& path);

// Canonical text of a value of the given kind (throws on a malformed value).
std::string canonical_value(const ParamSpec& spec, std::string_view value);

}  // namespace kvlab::harness

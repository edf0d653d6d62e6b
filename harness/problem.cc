#include "harness/problem.h"

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>

#include "harness/op.h"
#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

std::vector<std::string_view> tokens(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\r' && s[j] != '\n') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

const ParamSpec& spec_of(std::string_view op, std::string_view key) {
  for (const ParamSpec& p : op_params(op)) {
    if (p.key == key) return p;
  }
  fail(ErrorKind::invalid_argument, cat("op '", op, "' has no parameter '", key, "'"));
}

const std::string* find_value(const std::vector<std::pair<std::string, std::string>>& params, std::string_view key) {
  for (const auto& [k, v] : params) {
    if (k == key) return &v;
  }
  return nullptr;
}

}  // namespace

const std::vector<ParamSpec>& op_params(std::string_view op) { return find_op(op).params(); }

std::string canonical_value(const ParamSpec& spec, std::string_view value) {
  const char* first = value.data();
  const char* last = value.data() + value.size();
  switch (spec.kind) {
    case ParamKind::integer: {
      std::int64_t v = 0;
      const auto [ptr, ec] = std::from_chars(first, last, v);
      KVLAB_REQUIRE(ec == std::errc() && ptr == last && !value.empty(), invalid_argument, "parameter ", spec.key,
                    "=", value, " is not an integer");
      return std::to_string(v);
    }
    case ParamKind::real: {
      double v = 0;
      const auto [ptr, ec] = std::from_chars(first, last, v);
      KVLAB_REQUIRE(ec == std::errc() && ptr == last && !value.empty(), invalid_argument, "parameter ", spec.key,
                    "=", value, " is not a number");
      // Shortest round-trip form, so the canonical line reproduces the exact double.
      char buf[64];
      const auto res = std::to_chars(buf, buf + sizeof buf, v);
      return std::string(buf, res.ptr);
    }
    case ParamKind::word:
      if (spec.choices.empty()) {
        // A free-form word (an op's own grammar, e.g. the cache op's script): one token
        // without '=' (whitespace, ',' and '#' never reach here); the op validates it.
        KVLAB_REQUIRE(!value.empty() && value.find('=') == std::string_view::npos, invalid_argument, "parameter ",
                      spec.key, "=", value, " is not a word");
        return std::string(value);
      }
      for (const std::string& c : spec.choices) {
        if (c == value) return c;
      }
      {
        std::string all;
        for (const std::string& c : spec.choices) all += (all.empty() ? "" : "|") + c;
        fail(ErrorKind::invalid_argument, cat("parameter ", spec.key, "=", value, " is not one of ", all));
      }
  }
  fail(ErrorKind::internal, "unknown parameter kind");
}

Problem::Problem(std::string op, std::vector<std::pair<std::string, std::string>> params)
    : op_(std::move(op)), params_(std::move(params)) {}

const std::string& Problem::word(std::string_view key) const {
  const std::string* v = find_value(params_, key);
  KVLAB_REQUIRE(v != nullptr, invalid_argument, "problem '", op_, "' has no parameter '", key, "'");
  return *v;
}

std::int64_t Problem::integer(std::string_view key) const {
  const std::string& s = word(key);
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KVLAB_REQUIRE(ec == std::errc() && ptr == s.data() + s.size(), invalid_argument, key, "=", s,
                " is not an integer");
  return v;
}

int Problem::int32(std::string_view key) const {
  const std::int64_t v = integer(key);
  KVLAB_REQUIRE(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), invalid_argument,
                key, "=", v, " does not fit an int");
  return static_cast<int>(v);
}

double Problem::real(std::string_view key) const {
  const std::string& s = word(key);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KVLAB_REQUIRE(ec == std::errc() && ptr == s.data() + s.size(), invalid_argument, key, "=", s,
                " is not a number");
  return v;
}

Problem Problem::with(std::string_view key, std::string_view value) const {
  Problem p = *this;
  const ParamSpec& spec = spec_of(op_, key);
  for (auto& [k, v] : p.params_) {
    if (k == key) v = canonical_value(spec, value);
  }
  return p;
}

std::string Problem::line() const {
  std::string out = op_;
  for (const auto& [k, v] : params_) out += cat(" ", k, "=", v);
  return out;
}

std::vector<Problem> expand_line(std::string_view line) {
  const std::vector<std::string_view> toks = tokens(line);
  KVLAB_REQUIRE(!toks.empty(), invalid_argument, "empty problem line");
  const std::string op(toks[0]);
  const std::vector<ParamSpec>& specs = op_params(op);  // throws for an unknown op
  // Given values per declared key (one or more); keys not given take the default.
  std::vector<std::vector<std::string>> values(specs.size());
  for (std::size_t t = 1; t < toks.size(); ++t) {
    const std::size_t eq = toks[t].find('=');
    KVLAB_REQUIRE(eq != std::string_view::npos && eq > 0, invalid_argument, "token '", toks[t],
                  "' is not key=value");
    const std::string_view key = toks[t].substr(0, eq);
    std::size_t index = specs.size();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].key == key) index = i;
    }
    KVLAB_REQUIRE(index < specs.size(), invalid_argument, "op '", op, "' has no parameter '", key, "'");
    KVLAB_REQUIRE(values[index].empty(), invalid_argument, "parameter '", key, "' given twice");
    for (std::string_view v : split(toks[t].substr(eq + 1), ',')) {
      values[index].push_back(canonical_value(specs[index], v));
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (values[i].empty()) values[i].push_back(canonical_value(specs[i], specs[i].default_value));
  }
  // Odometer over the value lists in the order the keys appear in the line (the first
  // listed key varies slowest), so a case file reads like the loop nest it replaces.
  std::vector<std::size_t> order;
  for (std::size_t t = 1; t < toks.size(); ++t) {
    const std::string_view key = toks[t].substr(0, toks[t].find('='));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].key == key) order.push_back(i);
    }
  }
  std::vector<std::size_t> at(specs.size(), 0);
  std::vector<Problem> out;
  while (true) {
    std::vector<std::pair<std::string, std::string>> params;
    for (std::size_t i = 0; i < specs.size(); ++i) params.emplace_back(specs[i].key, values[i][at[i]]);
    out.emplace_back(op, std::move(params));
    std::size_t pos = order.size();
    while (pos > 0) {
      const std::size_t i = order[pos - 1];
      if (++at[i] < values[i].size()) break;
      at[i] = 0;
      --pos;
    }
    if (pos == 0) return out;
  }
}

Problem parse_problem(std::string_view line) {
  std::vector<Problem> all = expand_line(line);
  KVLAB_REQUIRE(all.size() == 1, invalid_argument, "line '", line, "' expands to ", all.size(),
                " problems; a single problem was expected");
  return all.front();
}

std::vector<Problem> load_case_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  KVLAB_REQUIRE(in.good(), io, "cannot read case file ", path.string());
  std::vector<Problem> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    if (tokens(line).empty()) continue;
    try {
      for (Problem& p : expand_line(line)) out.push_back(std::move(p));
    } catch (const Error& e) {
      fail(e.kind(), cat(path.string(), ":", number, ": ", e.what()));
    }
  }
  return out;
}

}  // namespace kvlab::harness

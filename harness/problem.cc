#include "harness/problem.h"

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>

#include "harness/op.h"
#include "core/stream_file.h"
#include "core/split.h"
#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

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
        // without '=' or '#' (whitespace and ',' never reach here; a '#' would start a
        // comment in a case file, so the printed line would not read back); the op
        // validates the rest.
        KVLAB_REQUIRE(!value.empty() && value.find_first_of("=#") == std::string_view::npos, invalid_argument,
                      "parameter ", spec.key, "=", value, " is not a word");
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
  const std::vector<ParamSpec>* specs = nullptr;
  for (const OpInfo* op : all_ops()) {
    if (op->name() == op_) specs = &op->params();
  }
  std::string out = op_;
  for (const auto& [k, v] : params_) {
    bool quiet = false;
    if (specs != nullptr) {
      for (const ParamSpec& s : *specs) {
        if (s.key == k && s.quiet_default) quiet = v == canonical_value(s, s.default_value);
      }
    }
    if (!quiet) out += cat(" ", k, "=", v);
  }
  return out;
}

LineExpansion::LineExpansion(std::string_view line) {
  const std::vector<std::string_view> toks = tokens(line);
  KVLAB_REQUIRE(!toks.empty(), invalid_argument, "empty problem line");
  op_ = std::string(toks[0]);
  const std::vector<ParamSpec>& specs = op_params(op_);  // throws for an unknown op
  for (const ParamSpec& s : specs) keys_.push_back(s.key);
  // Given values per declared key (one or more); keys not given take the default.
  values_.resize(specs.size());
  for (std::size_t t = 1; t < toks.size(); ++t) {
    const std::size_t eq = toks[t].find('=');
    KVLAB_REQUIRE(eq != std::string_view::npos && eq > 0, invalid_argument, "token '", toks[t],
                  "' is not key=value");
    const std::string_view key = toks[t].substr(0, eq);
    std::size_t index = specs.size();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].key == key) index = i;
    }
    KVLAB_REQUIRE(index < specs.size(), invalid_argument, "op '", op_, "' has no parameter '", key, "'");
    KVLAB_REQUIRE(values_[index].empty(), invalid_argument, "parameter '", key, "' given twice");
    for (std::string_view v : split_fields(toks[t].substr(eq + 1), ',')) {
      values_[index].push_back(canonical_value(specs[index], v));
    }
    order_.push_back(index);
    const std::uint64_t n = values_[index].size();
    size_ = size_ > std::numeric_limits<std::uint64_t>::max() / n ? std::numeric_limits<std::uint64_t>::max()
                                                                   : size_ * n;
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (values_[i].empty()) values_[i].push_back(canonical_value(specs[i], specs[i].default_value));
  }
}

Problem LineExpansion::at(std::uint64_t k) const {
  KVLAB_REQUIRE(k < size_, internal, "problem ", k, " of a line of ", size_);
  // Mixed radix over the listed keys, the last listed varying fastest: the odometer a
  // case file reads like, the loop nest it replaces.
  std::vector<std::size_t> at(values_.size(), 0);
  for (std::size_t pos = order_.size(); pos > 0; --pos) {
    const std::size_t i = order_[pos - 1];
    at[i] = static_cast<std::size_t>(k % values_[i].size());
    k /= values_[i].size();
  }
  std::vector<std::pair<std::string, std::string>> params;
  params.reserve(keys_.size());
  for (std::size_t i = 0; i < keys_.size(); ++i) params.emplace_back(keys_[i], values_[i][at[i]]);
  return Problem(op_, std::move(params));
}

std::vector<Problem> expand_line(std::string_view line) {
  const LineExpansion e(line);
  KVLAB_REQUIRE(e.size() <= kMaxMaterializedProblems, invalid_argument, "line expands to ", e.size(),
                " problems, over the ", kMaxMaterializedProblems,
                " that are expanded at once; put it in a case file for kvlab check, which streams them");
  std::vector<Problem> out;
  out.reserve(static_cast<std::size_t>(e.size()));
  for (std::uint64_t k = 0; k < e.size(); ++k) out.push_back(e.at(k));
  return out;
}

Problem parse_problem(std::string_view line) {
  const LineExpansion e(line);
  KVLAB_REQUIRE(e.size() == 1, invalid_argument, "line '", line, "' expands to ", e.size(),
                " problems; a single problem was expected");
  return e.at(0);
}

std::vector<CaseLine> read_case_file(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  KVLAB_REQUIRE(!ec && std::filesystem::exists(st), io, "cannot read case file ", path.string(),
                ": no such file");
  KVLAB_REQUIRE(!std::filesystem::is_directory(st), io, "case file ", path.string(),
                " is a directory (name the files in it)");
  if (std::filesystem::is_regular_file(st)) {
    const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
    KVLAB_REQUIRE(!ec, io, "cannot read case file ", path.string(), ": ", ec.message());
    KVLAB_REQUIRE(bytes <= kMaxCaseFileBytes, invalid_argument, "case file ", path.string(), " has ", bytes,
                  " bytes, over the cap of ", kMaxCaseFileBytes);
  }
  // A FIFO (`--cases <(generate)`) is read whole, bounded, with a bounded wait for its
  // writer; a device or socket is refused before anything blocks on it.
  std::ifstream file;
  std::istringstream piped;
  if (input_kind(path, "case file") == InputKind::fifo)
    piped.str(read_fifo(path, "case file", kMaxCaseFileBytes, kFifoWaitSeconds));
  else
    file.open(path, std::ios::binary);
  std::istream& in = file.is_open() ? static_cast<std::istream&>(file) : piped;
  KVLAB_REQUIRE(in.good(), io, "cannot read case file ", path.string());
  std::vector<CaseLine> out;
  std::uintmax_t total = 0;
  int number = 0;
  std::string line;
  // Reads at most kMaxCaseLineBytes + 1 characters of a line, so neither a line without
  // an end nor a FIFO that never ends can grow memory without bound.
  while (true) {
    line.clear();
    char c = 0;
    bool any = false;
    while (in.get(c) && c != '\n') {
      any = true;
      KVLAB_REQUIRE(line.size() < kMaxCaseLineBytes, invalid_argument, path.string(), ":", number + 1,
                    ": line longer than ", kMaxCaseLineBytes, " bytes");
      line.push_back(c);
    }
    if (!any && !in) break;
    ++number;
    total += line.size() + 1;
    KVLAB_REQUIRE(total <= kMaxCaseFileBytes + 1, invalid_argument, "case file ", path.string(),
                  " is longer than ", kMaxCaseFileBytes, " bytes");
    KVLAB_REQUIRE(line.find('\0') == std::string::npos, invalid_argument, path.string(), ":", number,
                  ": NUL byte in a case file");
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    if (tokens(line).empty()) continue;
    try {
      out.push_back({cat(path.string(), ":", number), LineExpansion(line)});
    } catch (const Error& e) {
      fail(e.kind(), cat(path.string(), ":", number, ": ", e.message()));
    }
  }
  KVLAB_REQUIRE(!in.bad(), io, "error reading case file ", path.string());
  return out;
}

std::vector<Problem> load_case_file(const std::filesystem::path& path) {
  std::vector<Problem> out;
  for (const CaseLine& l : read_case_file(path)) {
    KVLAB_REQUIRE(out.size() + l.expansion.size() <= kMaxMaterializedProblems, invalid_argument, l.where,
                  ": the file expands to more than ", kMaxMaterializedProblems,
                  " problems; kvlab check streams such files");
    for (std::uint64_t k = 0; k < l.expansion.size(); ++k) out.push_back(l.expansion.at(k));
  }
  return out;
}

}  // namespace kvlab::harness

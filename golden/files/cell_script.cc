#include "golden/files/cell_script.h"

#include <charconv>

#include "kvlab/error.h"

namespace kvlab::cell_script {
namespace {

// Reads a canonical unsigned integer (no sign, no leading zero) from the front of s.
bool read_uint(std::string_view& s, std::int64_t& out) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  if (s[0] == '0' && s.size() > 1 && s[1] >= '0' && s[1] <= '9') return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  if (r.ec != std::errc{} || out > 1'000'000'000) return false;
  s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
  return true;
}

[[noreturn]] void bad(std::string_view cmd, const std::string& why) {
  fail(ErrorKind::invalid_argument, cat("cell script command '", cmd, "': ", why));
}

int read_seq(std::string_view cmd, std::string_view& s) {
  std::int64_t v = 0;
  if (!read_uint(s, v)) bad(cmd, "expected a sequence id");
  if (v >= kMaxSequences) bad(cmd, cat("sequence ", v, " outside [0, ", kMaxSequences, ")"));
  return static_cast<int>(v);
}

void expect(std::string_view cmd, std::string_view& s, char c) {
  if (s.empty() || s[0] != c) bad(cmd, cat("expected '", c, "'"));
  s.remove_prefix(1);
}

// A-B: either end may be empty (-1).
void read_range(std::string_view cmd, std::string_view& s, Command& c) {
  std::int64_t v = 0;
  if (!s.empty() && s[0] != '-') {
    if (!read_uint(s, v)) bad(cmd, "expected a range A-B");
    c.p0 = static_cast<std::int32_t>(v);
  }
  expect(cmd, s, '-');
  if (!s.empty() && s[0] != ':') {
    if (!read_uint(s, v)) bad(cmd, "expected a range A-B");
    c.p1 = static_cast<std::int32_t>(v);
    if (c.p0 >= 0 && c.p1 <= c.p0) bad(cmd, cat("empty range ", c.p0, "-", c.p1));
  }
}

Command parse_one(std::string_view cmd) {
  std::string_view s = cmd;
  Command c;
  auto starts = [&](std::string_view w) {
    if (s.substr(0, w.size()) != w) return false;
    s.remove_prefix(w.size());
    return true;
  };
  std::int64_t v = 0;
  if (starts("keep")) {
    c.verb = Verb::keep;
    c.seqs = {read_seq(cmd, s)};
  } else if (starts("rm")) {
    c.verb = Verb::rm;
    c.seqs = {read_seq(cmd, s)};
    expect(cmd, s, ':');
    read_range(cmd, s, c);
  } else if (starts("cp")) {
    c.verb = Verb::cp;
    c.seqs = {read_seq(cmd, s)};
    expect(cmd, s, '_');
    c.seqs.push_back(read_seq(cmd, s));
    if (c.seqs[0] == c.seqs[1]) bad(cmd, "a sequence copied onto itself");
    expect(cmd, s, ':');
    read_range(cmd, s, c);
  } else if (starts("add") || starts("div")) {
    c.verb = cmd.substr(0, 3) == "add" ? Verb::add : Verb::div;
    c.seqs = {read_seq(cmd, s)};
    expect(cmd, s, ':');
    read_range(cmd, s, c);
    expect(cmd, s, ':');
    const bool negative = !s.empty() && s[0] == '-';
    if (negative) s.remove_prefix(1);
    if (!read_uint(s, v) || v == 0) bad(cmd, "expected a nonzero integer");
    if (c.verb == Verb::div && (negative || v < 2)) bad(cmd, "a divisor must be >= 2");
    c.n = static_cast<std::int32_t>(negative ? -v : v);
  } else if (starts("p")) {
    c.verb = Verb::prompt;
    c.seqs = {read_seq(cmd, s)};
    expect(cmd, s, ':');
    if (!read_uint(s, v) || v < 1 || v > 4096) bad(cmd, "expected a token count in [1, 4096]");
    c.n = static_cast<std::int32_t>(v);
  } else if (starts("d")) {
    c.verb = Verb::decode;
    c.seqs = {read_seq(cmd, s)};
    while (!s.empty() && s[0] == '_') {
      s.remove_prefix(1);
      c.seqs.push_back(read_seq(cmd, s));
      if (c.seqs.back() <= c.seqs[c.seqs.size() - 2]) bad(cmd, "decode lists are strictly ascending");
    }
  } else {
    bad(cmd, "unknown verb (p, d, rm, cp, keep, add, div)");
  }
  if (!s.empty()) bad(cmd, cat("trailing '", s, "'"));
  return c;
}

std::string range(const Command& c) {
  return cat(c.p0 >= 0 ? std::to_string(c.p0) : "", "-", c.p1 >= 0 ? std::to_string(c.p1) : "");
}

}  // namespace

std::vector<Command> parse(std::string_view script) {
  std::vector<Command> out;
  KVLAB_REQUIRE(!script.empty(), invalid_argument, "an empty cell script");
  while (true) {
    const auto dot = script.find('.');
    out.push_back(parse_one(script.substr(0, dot)));
    if (dot == std::string_view::npos) break;
    script.remove_prefix(dot + 1);
  }
  return out;
}

std::string to_string(const std::vector<Command>& script) {
  std::string out;
  for (const Command& c : script) {
    if (!out.empty()) out += '.';
    switch (c.verb) {
      case Verb::prompt: out += cat("p", c.seqs[0], ":", c.n); break;
      case Verb::decode:
        out += "d";
        for (std::size_t i = 0; i < c.seqs.size(); ++i) out += cat(i ? "_" : "", c.seqs[i]);
        break;
      case Verb::rm: out += cat("rm", c.seqs[0], ":", range(c)); break;
      case Verb::cp: out += cat("cp", c.seqs[0], "_", c.seqs[1], ":", range(c)); break;
      case Verb::keep: out += cat("keep", c.seqs[0]); break;
      case Verb::add: out += cat("add", c.seqs[0], ":", range(c), ":", c.n); break;
      case Verb::div: out += cat("div", c.seqs[0], ":", range(c), ":", c.n); break;
    }
  }
  return out;
}

}  // namespace kvlab::cell_script

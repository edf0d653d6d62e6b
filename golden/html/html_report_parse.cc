// The diff JSON validated into html_report_internal.h's structs (see html_report.h for
// the limits and golden/README.md for the schema).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "golden/html/html_report.h"
#include "golden/html/html_report_internal.h"
#include "kvlab/error.h"

namespace kvlab::golden::html {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  fail(ErrorKind::invalid_argument, cat("golden diff HTML report: field '", field, "' ", what));
}

[[noreturn]] void bad_type(const std::string& field, const json& j, std::string_view expected) {
  bad(field, cat("must be ", expected, ", got ", j.type_name()));
}

// The member `key` of `obj` (an object), or nullptr when absent or null.
const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& expect_object(const json& j, const std::string& field) {
  if (!j.is_object()) bad_type(field, j, "an object");
  return j;
}

const json& expect_array(const json& j, const std::string& field, std::size_t max_size,
                         std::string_view what) {
  if (!j.is_array()) bad_type(field, j, "an array");
  if (j.size() > max_size) {
    bad(field, cat("has ", j.size(), " ", what, "; the HTML report draws at most ", max_size));
  }
  return j;
}

// A number, or one of the strings the diff writes for non-finite values.
double as_number(const json& j, const std::string& field) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (s == "inf" || s == "+inf" || s == "infinity" || s == "+infinity") {
      return std::numeric_limits<double>::infinity();
    }
    if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
    if (s == "nan" || s == "+nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
    bad(field, cat("must be a number, \"inf\" or \"nan\", got the string \"", j.get<std::string>().substr(0, 40), "\""));
  }
  bad_type(field, j, "a number");
}

std::optional<double> as_number_or_null(const json& j, const std::string& field) {
  if (j.is_null()) return std::nullopt;
  return as_number(j, field);
}

std::int64_t as_int(const json& j, const std::string& field) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) bad(field, "is out of range");
    return static_cast<std::int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<std::int64_t>();
  bad_type(field, j, "an integer");
}

std::int64_t as_index(const json& j, const std::string& field) {
  const std::int64_t v = as_int(j, field);
  if (v < 0) bad(field, cat("must be ≥ 0, got ", v));
  return v;
}

std::string as_string(const json& j, const std::string& field) {
  if (!j.is_string()) bad_type(field, j, "a string");
  return j.get<std::string>();
}

// A metadata value: strings as they are; numbers and booleans as JSON writes them.
std::string as_meta_text(const json& j, const std::string& field) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number() || j.is_boolean()) return j.dump();
  bad_type(field, j, "a string");
}

Side parse_side(const json& diff, const char* key) {
  Side side;
  const json* j = member(diff, key);
  if (j == nullptr) return side;
  expect_object(*j, key);
  if (const json* p = member(*j, "path")) side.path = as_meta_text(*p, cat(key, ".path"));
  if (const json* m = member(*j, "meta")) {
    expect_object(*m, cat(key, ".meta"));
    for (const auto& [k, v] : m->items()) {
      if (v.is_null()) continue;
      side.meta[k] = as_meta_text(v, cat(key, ".meta.", k));
    }
  }
  return side;
}

OptNum opt_number(const json& obj, const char* key, const std::string& prefix) {
  const json* j = member(obj, key);
  return j == nullptr ? std::nullopt : OptNum(as_number(*j, prefix + key));
}

std::optional<std::vector<OptNum>> parse_series(const json& seq, const char* key, const std::string& prefix) {
  const json* j = member(seq, key);
  if (j == nullptr) return std::nullopt;
  const std::string field = prefix + key;
  expect_array(*j, field, kHtmlMaxSteps, "steps");
  std::vector<OptNum> out;
  out.reserve(j->size());
  for (std::size_t s = 0; s < j->size(); ++s) out.push_back(as_number_or_null((*j)[s], cat(field, "[", s, "]")));
  return out;
}

std::vector<std::int64_t> parse_tokens(const json& seq, const char* key, const std::string& prefix) {
  std::vector<std::int64_t> out;
  const json* j = member(seq, key);
  if (j == nullptr) return out;
  const std::string field = prefix + key;
  expect_array(*j, field, kHtmlMaxSteps, "tokens");
  for (std::size_t s = 0; s < j->size(); ++s) out.push_back(as_int((*j)[s], cat(field, "[", s, "]")));
  return out;
}

Sequence parse_sequence(const json& j, std::size_t position) {
  const std::string prefix = cat("sequences[", position, "].");
  expect_object(j, cat("sequences[", position, "]"));
  Sequence seq;
  seq.index = static_cast<std::int64_t>(position);
  if (const json* i = member(j, "index")) seq.index = as_index(*i, prefix + "index");
  if (const json* s = member(j, "status_a")) seq.status_a = as_string(*s, prefix + "status_a");
  if (const json* s = member(j, "status_b")) seq.status_b = as_string(*s, prefix + "status_b");
  seq.tokens_a = parse_tokens(j, "tokens_a", prefix);
  seq.tokens_b = parse_tokens(j, "tokens_b", prefix);
  if (const json* d = member(j, "first_token_divergence")) {
    const std::int64_t step = as_index(*d, prefix + "first_token_divergence");
    const std::size_t longest = std::max(seq.tokens_a.size(), seq.tokens_b.size());
    if (static_cast<std::uint64_t>(step) >= longest) {
      bad(prefix + "first_token_divergence", cat("is ", step, " but the token streams have ", longest, " steps"));
    }
    seq.first_token_divergence = step;
  }
  seq.kld = parse_series(j, "kld", prefix);
  seq.dlogit = parse_series(j, "max_abs_dlogit", prefix);
  if (const json* t = member(j, "top1_same")) {
    const std::string field = prefix + "top1_same";
    expect_array(*t, field, kHtmlMaxSteps, "steps");
    std::vector<std::optional<bool>> top1;
    for (std::size_t s = 0; s < t->size(); ++s) {
      const json& v = (*t)[s];
      if (v.is_null()) {
        top1.emplace_back();
      } else if (v.is_boolean()) {
        top1.emplace_back(v.get<bool>());
      } else {
        bad_type(cat(field, "[", s, "]"), v, "a boolean");
      }
    }
    seq.top1 = std::move(top1);
  }
  // The compared steps: steps_compared when given, else the first per-step array's length.
  if (const json* n = member(j, "steps_compared")) {
    const std::int64_t steps = as_index(*n, prefix + "steps_compared");
    if (static_cast<std::uint64_t>(steps) > kHtmlMaxSteps) {
      bad(prefix + "steps_compared", cat("is ", steps, "; the HTML report draws at most ", kHtmlMaxSteps, " steps"));
    }
    seq.steps = static_cast<std::size_t>(steps);
  } else if (seq.kld) {
    seq.steps = seq.kld->size();
  } else if (seq.dlogit) {
    seq.steps = seq.dlogit->size();
  } else if (seq.top1) {
    seq.steps = seq.top1->size();
  }
  auto check_length = [&](const char* key, std::size_t size) {
    if (size != seq.steps) {
      bad(prefix + key, cat("has ", size, " entries but ", seq.steps, " steps were compared"));
    }
  };
  if (seq.kld) check_length("kld", seq.kld->size());
  if (seq.dlogit) check_length("max_abs_dlogit", seq.dlogit->size());
  if (seq.top1) check_length("top1_same", seq.top1->size());
  if (const json* lr = member(j, "layer_rel")) {
    const std::string field = prefix + "layer_rel";
    expect_array(*lr, field, kHtmlMaxLayers, "layers");
    for (std::size_t l = 0; l < lr->size(); ++l) {
      const std::string row_field = cat(field, "[", l, "]");
      const json& row = expect_array((*lr)[l], row_field, kHtmlMaxSteps, "steps");
      if (row.size() != seq.steps) {
        bad(row_field, cat("has ", row.size(), " entries but ", seq.steps, " steps were compared"));
      }
      std::vector<OptNum> values;
      values.reserve(row.size());
      for (std::size_t s = 0; s < row.size(); ++s) {
        values.push_back(as_number_or_null(row[s], cat(row_field, "[", s, "]")));
      }
      seq.layer_rel.push_back(std::move(values));
    }
  }
  return seq;
}

}  // namespace

Diff parse_diff(const json& j) {
  expect_object(j, "(the diff)");
  Diff d;
  d.a = parse_side(j, "a");
  d.b = parse_side(j, "b");
  if (const json* t = member(j, "tolerance")) {
    expect_object(*t, "tolerance");
    d.tol = {opt_number(*t, "max_dlogit", "tolerance."), opt_number(*t, "max_mean_kld", "tolerance."),
             opt_number(*t, "min_top1", "tolerance."), opt_number(*t, "attn_rel", "tolerance.")};
  }
  const json* v = member(j, "verdict");
  if (v == nullptr) bad("verdict", "is missing");
  const std::string verdict = as_string(*v, "verdict");
  if (verdict != "pass" && verdict != "fail") bad("verdict", "must be \"pass\" or \"fail\"");
  d.pass = verdict == "pass";
  if (const json* r = member(j, "reasons")) {
    expect_array(*r, "reasons", 4096, "reasons");
    for (std::size_t i = 0; i < r->size(); ++i) d.reasons.push_back(as_string((*r)[i], cat("reasons[", i, "]")));
  }
  if (const json* f = member(j, "first_divergence")) {
    expect_object(*f, "first_divergence");
    FirstDivergence fd;
    const json* s = member(*f, "sequence");
    const json* st = member(*f, "step");
    if (s == nullptr) bad("first_divergence.sequence", "is missing");
    if (st == nullptr) bad("first_divergence.step", "is missing");
    fd.sequence = as_index(*s, "first_divergence.sequence");
    fd.step = as_index(*st, "first_divergence.step");
    if (const json* l = member(*f, "layer")) fd.layer = as_index(*l, "first_divergence.layer");
    if (const json* w = member(*f, "what")) fd.what = as_string(*w, "first_divergence.what");
    d.first = fd;
  }
  if (const json* s = member(j, "summary")) {
    expect_object(*s, "summary");
    Summary sum;
    if (const json* n = member(*s, "steps")) sum.steps = as_index(*n, "summary.steps");
    sum.top1_agreement = opt_number(*s, "top1_agreement", "summary.");
    sum.max_abs_dlogit = opt_number(*s, "max_abs_dlogit", "summary.");
    sum.rms_dp = opt_number(*s, "rms_dp", "summary.");
    if (const json* k = member(*s, "kld")) {
      expect_object(*k, "summary.kld");
      sum.kld_mean = opt_number(*k, "mean", "summary.kld.");
      sum.kld_median = opt_number(*k, "median", "summary.kld.");
      sum.kld_p99 = opt_number(*k, "p99", "summary.kld.");
      sum.kld_p999 = opt_number(*k, "p999", "summary.kld.");
      sum.kld_max = opt_number(*k, "max", "summary.kld.");
    }
    d.summary = sum;
  }
  if (const json* s = member(j, "sequences")) {
    expect_array(*s, "sequences", kHtmlMaxSequences, "sequences");
    std::set<std::int64_t> seen;
    std::size_t cells = 0;
    for (std::size_t i = 0; i < s->size(); ++i) {
      Sequence seq = parse_sequence((*s)[i], i);
      if (!seen.insert(seq.index).second) {
        bad(cat("sequences[", i, "].index"), cat("repeats the index ", seq.index));
      }
      cells += seq.layer_rel.size() * seq.steps;
      if (cells > kHtmlMaxCells) {
        bad("sequences", cat("hold more than ", kHtmlMaxCells, " layer × step cells; the HTML report draws at most that many"));
      }
      d.sequences.push_back(std::move(seq));
    }
  }
  return d;
}

}  // namespace kvlab::golden::html

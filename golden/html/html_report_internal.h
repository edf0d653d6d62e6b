// What the HTML report renders (html_report.cc, html_report_sequence.cc): the diff JSON
// (golden/README.md "--json schema") validated into plain structs by html_report_parse.cc,
// and the formatting and section renderers those files share. Not part of the library's
// interface.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvlab::golden::html {

using OptNum = std::optional<double>;

struct Side {
  std::optional<std::string> path;
  std::map<std::string, std::string> meta;
};

struct FirstDivergence {
  std::int64_t sequence = 0, step = 0;
  std::optional<std::int64_t> layer;
  std::optional<std::string> what;
};

struct Tolerance {
  OptNum max_dlogit, max_mean_kld, min_top1, attn_rel;
};

struct Summary {
  std::optional<std::int64_t> steps;
  OptNum top1_agreement, max_abs_dlogit, kld_mean, kld_median, kld_p99, kld_p999, kld_max, rms_dp;
};

struct Sequence {
  std::int64_t index = 0;
  std::optional<std::string> status_a, status_b;
  std::vector<std::int64_t> tokens_a, tokens_b;
  std::optional<std::int64_t> first_token_divergence;
  std::size_t steps = 0;  // compared steps: the columns of the heat map and the plots
  std::optional<std::vector<OptNum>> kld, dlogit;
  std::optional<std::vector<std::optional<bool>>> top1;
  std::vector<std::vector<OptNum>> layer_rel;  // [layer][step]; empty: no records
};

struct Diff {
  Side a, b;
  Tolerance tol;
  bool pass = false;
  std::vector<std::string> reasons;
  std::optional<FirstDivergence> first;
  std::optional<Summary> summary;
  std::vector<Sequence> sequences;
};

// Every type check names its field: a malformed diff throws kvlab::Error
// (invalid_argument) before any output exists; limits as html_report.h states them.
Diff parse_diff(const nlohmann::json& j);

// Formatting shared by the page's sections (html_report.cc).
inline constexpr const char* kNone = "\xe2\x80\x94";  // "—": a value that is absent
std::string esc(std::string_view s);  // markup-escaped text
std::string num(double v);            // three significant digits ("1e-8", "8.73e-3", "2.5e5")
std::string num(const OptNum& v);     // kNone when absent
std::string str(std::int64_t v);
std::string str(std::size_t v);

// One sequence's section of the page: status, heat map, plots, top-1 strip and tokens
// (html_report_sequence.cc).
void render_sequence(std::string& o, const Diff& d, const Sequence& seq);

}  // namespace kvlab::golden::html

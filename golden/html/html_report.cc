// The HTML report of a golden diff; see html_report.h for the page's structure.
//
// Two stages: parse_diff() (html_report_parse.cc) validates the JSON into plain structs
// (every type check names its field, so a malformed diff throws kvlab::Error before any
// output exists), then the render_* functions write the page from those structs: the
// page's frame, verdict, metadata and summary here, each sequence's section in
// html_report_sequence.cc.
#include "golden/html/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "core/markup.h"
#include "golden/html/html_report_internal.h"
#include "kvlab/error.h"

namespace kvlab::golden {

// ---------------------------------------------------------------------------------------
// Formatting (shared with html_report_sequence.cc through html_report_internal.h)
// ---------------------------------------------------------------------------------------

namespace html {

std::string esc(std::string_view s) { return escape_markup(s); }

// Three significant digits; scientific below 1e-2 and from 1e5 on, without padding or
// trailing zeros ("1e-8", "8.73e-3", "2.5e5").
std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  char buf[64];
  const double a = std::fabs(v);
  std::snprintf(buf, sizeof buf, a < 1e-2 || a >= 1e5 ? "%.2e" : "%.3g", v);
  std::string s = buf;
  const auto e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  if (mant.find('.') != std::string::npos) {
    mant.erase(mant.find_last_not_of('0') + 1);
    if (mant.back() == '.') mant.pop_back();
  }
  std::string sign;
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) {
    if (exp[0] == '-') sign = "-";
    exp.erase(0, 1);
  }
  exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
  return mant + "e" + sign + exp;
}

std::string num(const OptNum& v) { return v ? num(*v) : std::string(kNone); }

std::string str(std::int64_t v) { return std::to_string(v); }
std::string str(std::size_t v) { return std::to_string(v); }

}  // namespace html

namespace {

using nlohmann::json;

using namespace html;  // NOLINT: the structs of html_report_internal.h

std::string percent(double v) {
  if (!std::isfinite(v)) return num(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * v);
  return buf;
}

// ---------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------

const char* const kCss = R"css(
:root { --pass: #1e7b34; --fail: #b3261e; --muted: #667; --line: #d5d8de; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1d22;
       margin: 0 auto; padding: 20px 28px 60px; max-width: 1500px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 12px; }
h2 { font-size: 19px; margin: 28px 0 10px; border-bottom: 2px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
h4 { font-size: 13px; margin: 12px 0 4px; color: #333; font-weight: 600; }
code, .mono, td.tok, td.v { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.verdict { border-radius: 8px; padding: 14px 18px; color: #fff; margin-bottom: 14px; }
.verdict.pass { background: var(--pass); }
.verdict.fail { background: var(--fail); }
.verdict .word { font-size: 28px; font-weight: 800; letter-spacing: 1px; }
.verdict .sub { font-size: 14px; opacity: .95; margin-left: 12px; }
.verdict ul { margin: 8px 0 0; padding-left: 22px; }
.verdict p { margin: 8px 0 0; }
.verdict a { color: #fff; }
.verdict .none { color: #fff; opacity: .85; }
.subtitle { color: var(--muted); margin: -6px 0 12px; }
.none { color: var(--muted); }
table { border-collapse: collapse; }
table.kv td, table.kv th { border: 1px solid var(--line); padding: 4px 10px; text-align: left; vertical-align: top; }
table.kv th { background: #f3f4f6; }
table.kv td.v { word-break: break-word; max-width: 560px; }
table.kv tr.differs td { background: #fff6d6; }
table.kv td.over { background: #fde2df; color: var(--fail); font-weight: 700; }
section.sequence { border: 1px solid var(--line); border-radius: 8px; padding: 4px 16px 16px; margin: 18px 0; }
.statuses p { margin: 4px 0; font-family: ui-monospace, Menlo, Consolas, monospace; }
.status.ok { color: var(--pass); }
.status.error { color: #fff; background: var(--fail); padding: 6px 10px; border-radius: 4px; font-weight: 700; }
.scroll { overflow-x: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .axis { stroke: #888; stroke-width: 1; }
svg .grid { stroke: #e6e8ec; stroke-width: 1; }
svg .tol { stroke: #b3261e; stroke-width: 1; stroke-dasharray: 5 4; }
svg .divline { stroke: #1f4fff; stroke-width: 1.5; stroke-dasharray: 3 3; }
svg .series { fill: none; stroke-width: 1.8; }
svg.kld-plot .series { stroke: #6a3d9a; }
svg.kld-plot circle { fill: #6a3d9a; }
svg.dlogit-plot .series { stroke: #1f78b4; }
svg.dlogit-plot circle { fill: #1f78b4; }
svg rect.top1.same { fill: #2e9d4f; }
svg rect.top1.differ { fill: #d33b2c; }
svg rect.top1.unknown { fill: #bbb; }
svg rect.first-divergent { fill: none; stroke: #1f4fff; stroke-width: 3; }
svg rect.divergent-step { fill: none; stroke: #1f4fff; stroke-width: 2; stroke-dasharray: 4 3; }
.tokens table { margin: 6px 0 10px; }
.tokens th, .tokens td { border: 1px solid var(--line); padding: 2px 5px; text-align: right; min-width: 38px; font-size: 12px; }
.tokens tr.steps th { background: #f3f4f6; color: var(--muted); font-weight: 400; }
.tokens tr th:first-child { text-align: left; background: #f3f4f6; }
.tokens td.after { opacity: .35; }
.tokens td.diverged { background: #fde2df; color: var(--fail); font-weight: 800; outline: 2px solid var(--fail); outline-offset: -2px; opacity: 1; }
.tokens td.missing { color: #aaa; background: repeating-linear-gradient(45deg, #f4f4f4, #f4f4f4 3px, #e3e3e3 3px, #e3e3e3 6px); }
.legend-note { color: var(--muted); font-size: 12px; margin: 2px 0 0; }
)css";


std::string meta_value(const Side& side, const std::string& key) {
  auto it = side.meta.find(key);
  return it == side.meta.end() ? std::string() : it->second;
}

void render_metadata(std::string& o, const Diff& d) {
  o += "<h2>The two goldens</h2><table class=\"kv\" id=\"metadata\"><tr><th>field</th><th>A</th><th>B</th></tr>";
  auto row = [&](const std::string& field, const std::optional<std::string>& a, const std::optional<std::string>& b) {
    const bool differs = a.value_or("") != b.value_or("");
    o += std::string("<tr") + (differs ? " class=\"differs\"" : "") + "><th>" + esc(field) + "</th><td class=\"v\">" +
         (a ? esc(*a) : std::string(kNone)) + "</td><td class=\"v\">" + (b ? esc(*b) : std::string(kNone)) + "</td></tr>";
  };
  auto meta = [](const Side& side, const std::string& key) -> std::optional<std::string> {
    auto it = side.meta.find(key);
    if (it == side.meta.end()) return std::nullopt;
    return it->second;
  };
  row("path", d.a.path, d.b.path);
  static const char* const kKeys[] = {"engine", "engine_version", "backend", "model", "scenario", "kvlab_commit", "cache_classes"};
  std::set<std::string> shown(std::begin(kKeys), std::end(kKeys));
  for (const char* key : kKeys) row(key, meta(d.a, key), meta(d.b, key));
  for (const Sequence& seq : d.sequences) {
    row("seq." + str(seq.index) + ".status", seq.status_a, seq.status_b);
    shown.insert("seq." + str(seq.index) + ".status");
  }
  // Everything else either side recorded, in key order.
  std::set<std::string> rest;
  for (const auto& [k, v] : d.a.meta) rest.insert(k);
  for (const auto& [k, v] : d.b.meta) rest.insert(k);
  for (const std::string& k : rest) {
    if (!shown.count(k)) row(k, meta(d.a, k), meta(d.b, k));
  }
  o += "</table>";
}

void render_summary(std::string& o, const Diff& d) {
  o += "<h2>Summary</h2><table class=\"kv\" id=\"summary\"><tr><th>metric</th><th>value</th><th>tolerance</th></tr>";
  const Summary s = d.summary.value_or(Summary{});
  auto row = [&](const std::string& name, const std::string& value, const std::string& tol, bool over) {
    o += "<tr><th>" + name + "</th><td class=\"v" + (over ? " over" : "") + "\">" + value + "</td><td class=\"v\">" + tol + "</td></tr>";
  };
  auto above = [](const OptNum& v, const OptNum& limit) { return v && limit && (std::isnan(*v) || *v > *limit); };
  row("compared steps", s.steps ? str(*s.steps) : std::string(kNone), kNone, false);
  row("top-1 agreement", s.top1_agreement ? percent(*s.top1_agreement) : std::string(kNone),
      d.tol.min_top1 ? "≥ " + percent(*d.tol.min_top1) : std::string(kNone),
      s.top1_agreement && d.tol.min_top1 && (std::isnan(*s.top1_agreement) || *s.top1_agreement < *d.tol.min_top1));
  row("max |Δlogit|", num(s.max_abs_dlogit), d.tol.max_dlogit ? "≤ " + num(*d.tol.max_dlogit) : std::string(kNone),
      above(s.max_abs_dlogit, d.tol.max_dlogit));
  row("KLD mean", num(s.kld_mean), d.tol.max_mean_kld ? "≤ " + num(*d.tol.max_mean_kld) : std::string(kNone),
      above(s.kld_mean, d.tol.max_mean_kld));
  row("KLD median", num(s.kld_median), kNone, false);
  row("KLD p99", num(s.kld_p99), kNone, false);
  row("KLD p99.9", num(s.kld_p999), kNone, false);
  row("KLD max", num(s.kld_max), kNone, false);
  row("RMS Δp", num(s.rms_dp), kNone, false);
  // The largest layer delta over every sequence (not in the summary object: computed here).
  OptNum max_rel;
  for (const Sequence& seq : d.sequences) {
    for (const auto& layer : seq.layer_rel) {
      for (const OptNum& v : layer) {
        if (!v) continue;
        if (!max_rel || std::isnan(*v) || (!std::isnan(*max_rel) && *v > *max_rel)) max_rel = *v;
      }
    }
  }
  row("max layer relative Δ", num(max_rel), d.tol.attn_rel ? "≤ " + num(*d.tol.attn_rel) : std::string(kNone),
      above(max_rel, d.tol.attn_rel));
  o += "</table>";
}

void render_verdict(std::string& o, const Diff& d) {
  o += std::string("<div class=\"verdict ") + (d.pass ? "pass" : "fail") + "\" id=\"verdict\"><span class=\"word\">" +
       (d.pass ? "PASS" : "FAIL") + "</span><span class=\"sub\">" +
       (d.pass ? "the two goldens agree within tolerance" : "the two goldens differ beyond tolerance") + "</span>";
  if (d.reasons.empty()) {
    o += "<p id=\"reasons\" class=\"none\">Reasons: ";
    o += kNone;
    o += "</p>";
  } else {
    o += "<ul id=\"reasons\">";
    for (const std::string& r : d.reasons) o += "<li>" + esc(r) + "</li>";
    o += "</ul>";
  }
  o += "<p id=\"first-divergence\">First divergence: ";
  if (d.first) {
    const FirstDivergence& f = *d.first;
    o += "<a href=\"#seq-" + str(f.sequence) + "\">sequence " + str(f.sequence) + "</a>, step " + str(f.step) + ", layer " +
         (f.layer ? str(*f.layer) : std::string(kNone) + " (no layer over attn_rel)") + (f.what ? ": " + esc(*f.what) : std::string());
  } else {
    o += kNone;
  }
  o += "</p></div>";
}

}  // namespace

std::string render_diff_html(const nlohmann::json& diff) {
  const Diff d = parse_diff(diff);
  std::string o;
  o.reserve(1 << 16);
  const std::string model = meta_value(d.a, "model").empty() ? meta_value(d.b, "model") : meta_value(d.a, "model");
  const std::string scenario = meta_value(d.a, "scenario").empty() ? meta_value(d.b, "scenario") : meta_value(d.a, "scenario");
  std::string title = "golden diff";
  if (!model.empty()) title += " " + model;
  if (!scenario.empty()) title += " / " + scenario;
  title += std::string(": ") + (d.pass ? "PASS" : "FAIL");
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
       esc(title) + "</title>\n<style>" + kCss + "</style>\n</head>\n<body>\n";
  o += "<h1>" + esc(title) + "</h1>\n";
  std::string engines = std::string("A = ") + (meta_value(d.a, "engine").empty() ? std::string("?") : meta_value(d.a, "engine")) + " (" +
                        (meta_value(d.a, "backend").empty() ? kNone : meta_value(d.a, "backend")) + "), B = " +
                        (meta_value(d.b, "engine").empty() ? std::string("?") : meta_value(d.b, "engine")) + " (" +
                        (meta_value(d.b, "backend").empty() ? kNone : meta_value(d.b, "backend")) + ")";
  o += "<p class=\"subtitle\">" + esc(engines) + "</p>\n";
  render_verdict(o, d);
  o += "\n";
  render_metadata(o, d);
  o += "\n";
  render_summary(o, d);
  o += "\n<section id=\"sequences\"><h2>Sequences</h2>\n";
  if (d.sequences.empty()) {
    o += "<p class=\"none\">";
    o += kNone;
    o += " no sequence in both goldens</p>\n";
  }
  for (const Sequence& seq : d.sequences) {
    render_sequence(o, d, seq);
    o += "\n";
  }
  o += "</section>\n</body>\n</html>\n";
  return o;
}

}  // namespace kvlab::golden

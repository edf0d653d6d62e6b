// One sequence's section of the golden diff's HTML report (html_report.h describes the
// page): the layer heat map, the KL divergence and |Δlogit| plots, the top-1 strip and the
// token table, drawn from the structs html_report_parse.cc validated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "golden/html/html_report_internal.h"

namespace kvlab::golden::html {
namespace {

// SVG coordinates: one decimal.
std::string px(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

// The heat map's colour scale: log10 of the relative delta from -8 (light) to 0 (dark
// red); 1e-4, the default attn_rel tolerance, sits at the middle (light orange).
constexpr double kScaleLo = -8, kScaleHi = 0;

std::string colour(double v) {
  if (std::isnan(v)) return "#000000";
  double t = 0;
  if (std::isinf(v) && v > 0) {
    t = 1;
  } else if (v > 0) {
    t = std::clamp((std::log10(v) - kScaleLo) / (kScaleHi - kScaleLo), 0.0, 1.0);
  }
  static constexpr double stops[5][3] = {
      {247, 251, 255}, {158, 202, 225}, {253, 212, 158}, {239, 101, 72}, {127, 0, 0}};
  const double x = t * 4;
  const int i = std::min(static_cast<int>(x), 3);
  const double f = x - i;
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(stops[i][c] + (stops[i + 1][c] - stops[i][c]) * f));
  }
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", rgb[0] & 0xff, rgb[1] & 0xff, rgb[2] & 0xff);
  return buf;
}

struct Layout {
  double left = 70;   // the left margin of every per-sequence SVG (labels)
  double cw = 20;     // the width of one step column
  std::size_t steps = 0;
  double x(std::size_t s) const { return left + cw * static_cast<double>(s); }
  double width() const { return left + cw * static_cast<double>(steps) + 70; }
};

Layout layout_for(std::size_t steps) {
  Layout lay;
  lay.steps = steps;
  lay.cw = steps == 0 ? 20 : std::clamp(std::floor(1000.0 / static_cast<double>(steps)), 3.0, 36.0);
  return lay;
}

// Labels every k steps so that labels are at least 34 px apart.
std::size_t tick_every(double cw) {
  for (const std::size_t k : {1u, 2u, 5u, 10u, 20u, 50u, 100u, 200u, 500u, 1000u}) {
    if (cw * static_cast<double>(k) >= 34) return k;
  }
  return 2000;
}

void step_axis(std::string& o, const Layout& lay, double y) {
  const std::size_t k = tick_every(lay.cw);
  for (std::size_t s = 0; s < lay.steps; s += k) {
    const double cx = lay.x(s) + lay.cw / 2;
    o += "<text x=\"" + px(cx) + "\" y=\"" + px(y) + "\" text-anchor=\"middle\">" + str(s) + "</text>";
  }
}

// The step (column) of this sequence to mark, and the layer of the first divergent cell.
struct Marks {
  std::optional<std::size_t> step;
  std::optional<std::size_t> layer;
};

Marks marks_for(const Diff& d, const Sequence& seq) {
  Marks m;
  if (d.first && d.first->sequence == seq.index) {
    if (static_cast<std::uint64_t>(d.first->step) < seq.steps) {
      m.step = static_cast<std::size_t>(d.first->step);
      if (d.first->layer && static_cast<std::uint64_t>(*d.first->layer) < seq.layer_rel.size()) {
        m.layer = static_cast<std::size_t>(*d.first->layer);
      }
    }
  } else if (seq.first_token_divergence && static_cast<std::uint64_t>(*seq.first_token_divergence) < seq.steps) {
    m.step = static_cast<std::size_t>(*seq.first_token_divergence);
  }
  return m;
}

void render_heatmap(std::string& o, const Diff& d, const Sequence& seq, const Layout& lay, const Marks& marks) {
  const std::string id = "seq-" + str(seq.index);
  o += "<h4>Relative delta of each layer's attention output (layer_rel)</h4>";
  if (seq.layer_rel.empty() || seq.steps == 0) {
    o += "<p class=\"none\">";
    o += kNone;
    o += " no attention records to compare</p>";
    return;
  }
  const std::size_t layers = seq.layer_rel.size();
  const double rh = std::clamp(std::floor(400.0 / static_cast<double>(layers)), 4.0, 26.0);
  const double top = 6, height = top + rh * static_cast<double>(layers) + 22;
  o += "<div class=\"scroll\"><svg class=\"heatmap\" id=\"" + id + "-heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
       px(lay.width()) + "\" height=\"" + px(height) + "\" role=\"img\" aria-label=\"layer relative delta heat map\">";
  o += "<defs><pattern id=\"" + id +
       "-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
       "<rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#b8b8b8\" stroke-width=\"3\"/>"
       "</pattern></defs>";
  const std::size_t label_every = rh >= 11 ? 1 : static_cast<std::size_t>(std::ceil(11.0 / rh));
  for (std::size_t l = 0; l < layers; ++l) {
    const double y = top + rh * static_cast<double>(l);
    if (l % label_every == 0) {
      o += "<text x=\"" + px(lay.left - 6) + "\" y=\"" + px(y + rh / 2 + 4) + "\" text-anchor=\"end\">layer " + str(l) + "</text>";
    }
    for (std::size_t s = 0; s < seq.steps; ++s) {
      const OptNum& v = seq.layer_rel[l][s];
      o += "<rect class=\"cell\" data-layer=\"" + str(l) + "\" data-step=\"" + str(s) + "\" x=\"" + px(lay.x(s)) + "\" y=\"" +
           px(y) + "\" width=\"" + px(lay.cw) + "\" height=\"" + px(rh) + "\" fill=\"" +
           (v ? colour(*v) : "url(#" + id + "-hatch)") + "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>layer " + str(l) +
           ", step " + str(s) + ": " + (v ? num(*v) : std::string("no record")) + "</title></rect>";
    }
  }
  if (marks.step) {
    const double x = lay.x(*marks.step);
    if (marks.layer) {
      o += "<rect class=\"first-divergent\" id=\"" + id + "-first-divergent\" x=\"" + px(x + 1.5) + "\" y=\"" +
           px(top + rh * static_cast<double>(*marks.layer) + 1.5) + "\" width=\"" + px(std::max(lay.cw - 3, 1.0)) +
           "\" height=\"" + px(std::max(rh - 3, 1.0)) + "\"><title>first divergence: layer " + str(*marks.layer) + ", step " +
           str(*marks.step) + "</title></rect>";
    } else {
      o += "<rect class=\"divergent-step\" x=\"" + px(x + 1) + "\" y=\"" + px(top + 1) + "\" width=\"" +
           px(std::max(lay.cw - 2, 1.0)) + "\" height=\"" + px(rh * static_cast<double>(layers) - 2) +
           "\"><title>first divergence: step " + str(*marks.step) + "</title></rect>";
    }
  }
  step_axis(o, lay, top + rh * static_cast<double>(layers) + 15);
  o += "</svg></div>";

  // The legend: the fixed scale, the tolerance, no record, NaN.
  const double lw = 300, lx = lay.left;
  o += "<svg class=\"heatmap-legend\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(lx + lw + 340) +
       "\" height=\"44\"><defs><linearGradient id=\"" + id + "-scale\">";
  for (int i = 0; i <= 16; ++i) {
    const double t = i / 16.0;
    o += "<stop offset=\"" + px(100 * t) + "%\" stop-color=\"" + colour(std::pow(10.0, kScaleLo + t * (kScaleHi - kScaleLo))) + "\"/>";
  }
  o += "</linearGradient></defs>";
  o += "<text x=\"" + px(lx - 6) + "\" y=\"15\" text-anchor=\"end\">rel. Δ</text>";
  o += "<rect x=\"" + px(lx) + "\" y=\"4\" width=\"" + px(lw) + "\" height=\"14\" fill=\"url(#" + id + "-scale)\" stroke=\"#999\" stroke-width=\"0.5\"/>";
  for (int e = static_cast<int>(kScaleLo); e <= static_cast<int>(kScaleHi); e += 2) {
    const double x = lx + lw * (e - kScaleLo) / (kScaleHi - kScaleLo);
    o += "<line class=\"axis\" x1=\"" + px(x) + "\" y1=\"18\" x2=\"" + px(x) + "\" y2=\"22\"/>";
    o += "<text x=\"" + px(x) + "\" y=\"34\" text-anchor=\"middle\">" + (e == 0 ? std::string("≥1") : "1e" + std::to_string(e)) + "</text>";
  }
  if (d.tol.attn_rel && *d.tol.attn_rel > 0 && std::isfinite(*d.tol.attn_rel)) {
    const double t = std::clamp((std::log10(*d.tol.attn_rel) - kScaleLo) / (kScaleHi - kScaleLo), 0.0, 1.0);
    const double x = lx + lw * t;
    o += "<line x1=\"" + px(x) + "\" y1=\"1\" x2=\"" + px(x) + "\" y2=\"21\" stroke=\"#1b1d22\" stroke-width=\"2\"/>";
    o += "<text x=\"" + px(x) + "\" y=\"44\" text-anchor=\"middle\" font-weight=\"600\">tolerance " + num(*d.tol.attn_rel) + "</text>";
  }
  const double sx = lx + lw + 24;
  o += "<rect x=\"" + px(sx) + "\" y=\"4\" width=\"14\" height=\"14\" fill=\"url(#" + id + "-hatch)\" stroke=\"#999\" stroke-width=\"0.5\"/>";
  o += "<text x=\"" + px(sx + 19) + "\" y=\"15\">no record</text>";
  o += "<rect x=\"" + px(sx + 90) + "\" y=\"4\" width=\"14\" height=\"14\" fill=\"#000\"/>";
  o += "<text x=\"" + px(sx + 109) + "\" y=\"15\">nan</text>";
  o += "<rect x=\"" + px(sx + 145) + "\" y=\"4\" width=\"14\" height=\"14\" fill=\"none\" stroke=\"#1f4fff\" stroke-width=\"3\"/>";
  o += "<text x=\"" + px(sx + 164) + "\" y=\"15\">first divergence</text>";
  o += "</svg>";
}

// A log-y line plot of one per-step series.
void render_plot(std::string& o, const std::string& cls, const std::string& id, const std::string& title,
                 const std::optional<std::vector<OptNum>>& series, const OptNum& tol, const Layout& lay, const Marks& marks) {
  o += "<h4>" + title + "</h4>";
  if (!series || series->empty()) {
    o += "<p class=\"none\">";
    o += kNone;
    o += "</p>";
    return;
  }
  constexpr double kFloorExp = -12;
  double max_exp = -6;
  for (const OptNum& v : *series) {
    if (v && std::isfinite(*v) && *v > 0) max_exp = std::max(max_exp, std::ceil(std::log10(*v)));
  }
  if (tol && std::isfinite(*tol) && *tol > 0) max_exp = std::max(max_exp, std::ceil(std::log10(*tol)));
  max_exp = std::min(max_exp, 300.0);
  // Labelled decades every `every` from the floor; the top is the next labelled decade.
  const int every = max_exp - kFloorExp > 12 ? static_cast<int>(std::ceil((max_exp - kFloorExp) / 6)) : 2;
  max_exp = kFloorExp + every * std::ceil((max_exp - kFloorExp) / every);
  const double top = 10, h = 130, height = top + h + 24;
  auto y_of = [&](double v) {
    if (std::isinf(v) && v > 0) return top;
    const double e = v > 0 ? std::clamp(std::log10(v), kFloorExp, max_exp) : kFloorExp;
    return top + h * (max_exp - e) / (max_exp - kFloorExp);
  };
  o += "<div class=\"scroll\"><svg class=\"" + cls + "\" id=\"" + id + "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
       px(lay.width()) + "\" height=\"" + px(height) + "\" role=\"img\" aria-label=\"" + cls + "\">";
  const double x0 = lay.left, x1 = lay.x(lay.steps);
  // Decades from the floor up (the floor is labelled "≤1e-12": it holds every smaller value).
  const int top_exp = static_cast<int>(max_exp), floor_exp = static_cast<int>(kFloorExp);
  for (int e = floor_exp; e <= top_exp; e += every) {
    const double y = y_of(std::pow(10.0, e));
    o += "<line class=\"grid\" x1=\"" + px(x0) + "\" y1=\"" + px(y) + "\" x2=\"" + px(x1) + "\" y2=\"" + px(y) + "\"/>";
    o += "<text x=\"" + px(x0 - 6) + "\" y=\"" + px(y + 4) + "\" text-anchor=\"end\">" +
         (e == floor_exp ? std::string("≤1e") : std::string("1e")) + std::to_string(e) + "</text>";
  }
  o += "<line class=\"axis\" x1=\"" + px(x0) + "\" y1=\"" + px(top) + "\" x2=\"" + px(x0) + "\" y2=\"" + px(top + h) + "\"/>";
  o += "<line class=\"axis\" x1=\"" + px(x0) + "\" y1=\"" + px(top + h) + "\" x2=\"" + px(x1) + "\" y2=\"" + px(top + h) + "\"/>";
  if (tol && std::isfinite(*tol) && *tol > 0) {
    const double y = y_of(*tol);
    o += "<line class=\"tol\" x1=\"" + px(x0) + "\" y1=\"" + px(y) + "\" x2=\"" + px(x1) + "\" y2=\"" + px(y) + "\"/>";
    o += "<text x=\"" + px(x1 + 4) + "\" y=\"" + px(y + 4) + "\" fill=\"#b3261e\">tol " + num(*tol) + "</text>";
  }
  if (marks.step) {
    const double x = lay.x(*marks.step) + lay.cw / 2;
    o += "<line class=\"divline\" x1=\"" + px(x) + "\" y1=\"" + px(top) + "\" x2=\"" + px(x) + "\" y2=\"" + px(top + h) + "\"/>";
  }
  // The line, broken at NaN and missing values.
  std::string path;
  bool pen = false;
  for (std::size_t s = 0; s < series->size(); ++s) {
    const OptNum& v = (*series)[s];
    if (!v || std::isnan(*v)) {
      pen = false;
      continue;
    }
    path += (pen ? "L" : "M") + px(lay.x(s) + lay.cw / 2) + " " + px(y_of(*v));
    pen = true;
  }
  if (!path.empty()) o += "<path class=\"series\" d=\"" + path + "\"/>";
  if (series->size() <= 512) {
    for (std::size_t s = 0; s < series->size(); ++s) {
      const OptNum& v = (*series)[s];
      if (!v) continue;
      const double cx = lay.x(s) + lay.cw / 2;
      if (std::isnan(*v)) {
        o += "<text x=\"" + px(cx) + "\" y=\"" + px(top + h - 4) + "\" text-anchor=\"middle\" fill=\"#b3261e\">nan</text>";
        continue;
      }
      o += "<circle cx=\"" + px(cx) + "\" cy=\"" + px(y_of(*v)) + "\" r=\"" + px(std::min(2.8, lay.cw / 3)) +
           "\"><title>step " + str(s) + ": " + num(*v) + "</title></circle>";
    }
  }
  step_axis(o, lay, top + h + 16);
  o += "</svg></div>";
}

void render_top1(std::string& o, const Sequence& seq, const Layout& lay, const Marks& marks) {
  o += "<h4>Top-1 token agreement per step</h4>";
  if (!seq.top1 || seq.top1->empty()) {
    o += "<p class=\"none\">";
    o += kNone;
    o += "</p>";
    return;
  }
  o += "<div class=\"scroll\"><svg class=\"top1-strip\" id=\"seq-" + str(seq.index) +
       "-top1\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(lay.width()) + "\" height=\"38\">";
  o += "<text x=\"" + px(lay.left - 6) + "\" y=\"15\" text-anchor=\"end\">top-1</text>";
  for (std::size_t s = 0; s < seq.top1->size(); ++s) {
    const std::optional<bool>& v = (*seq.top1)[s];
    const char* cls = !v ? "top1 unknown" : *v ? "top1 same" : "top1 differ";
    o += "<rect class=\"" + std::string(cls) + "\" x=\"" + px(lay.x(s)) + "\" y=\"3\" width=\"" + px(lay.cw) +
         "\" height=\"16\" stroke=\"#fff\" stroke-width=\"0.5\"><title>step " + str(s) + ": " +
         (!v ? "unknown" : *v ? "same top-1" : "different top-1") + "</title></rect>";
  }
  if (marks.step) {
    o += "<rect class=\"divergent-step\" x=\"" + px(lay.x(*marks.step) + 1) + "\" y=\"2\" width=\"" + px(std::max(lay.cw - 2, 1.0)) +
         "\" height=\"18\"/>";
  }
  step_axis(o, lay, 33);
  o += "</svg></div>";
}

void render_tokens(std::string& o, const Sequence& seq) {
  const std::string id = "seq-" + str(seq.index);
  o += "<h4>Generated tokens</h4><div class=\"tokens\" id=\"" + id + "-tokens\">";
  const std::size_t n = std::max(seq.tokens_a.size(), seq.tokens_b.size());
  if (n == 0) {
    o += "<p class=\"none\">";
    o += kNone;
    o += "</p></div>";
    return;
  }
  auto cell = [&](const std::vector<std::int64_t>& tokens, std::size_t s) {
    std::string cls = "tok";
    if (seq.first_token_divergence) {
      const auto d = static_cast<std::size_t>(*seq.first_token_divergence);
      if (s == d) cls += " diverged";
      if (s > d) cls += " after";
    }
    if (s >= tokens.size()) return "<td class=\"" + cls + " missing\">" + kNone + "</td>";
    return "<td class=\"" + cls + "\">" + str(tokens[s]) + "</td>";
  };
  constexpr std::size_t kPerRow = 32;
  for (std::size_t begin = 0; begin < n; begin += kPerRow) {
    const std::size_t end = std::min(n, begin + kPerRow);
    o += "<table class=\"token-table\"><tr class=\"steps\"><th>step</th>";
    for (std::size_t s = begin; s < end; ++s) o += "<th>" + str(s) + "</th>";
    o += "</tr><tr class=\"side-a\"><th>A</th>";
    for (std::size_t s = begin; s < end; ++s) o += cell(seq.tokens_a, s);
    o += "</tr><tr class=\"side-b\"><th>B</th>";
    for (std::size_t s = begin; s < end; ++s) o += cell(seq.tokens_b, s);
    o += "</tr></table>";
  }
  if (seq.first_token_divergence) {
    o += "<p class=\"legend-note\">The tokens first differ at step " + str(*seq.first_token_divergence) +
         " (outlined); later steps are dimmed: their inputs differ.</p>";
  }
  o += "</div>";
}

void render_status(std::string& o, const char* side, const std::optional<std::string>& status) {
  const bool ok = status && *status == "ok";
  o += std::string("<p class=\"status ") + (ok ? "ok" : status ? "error" : "none") + "\">" + side + ": " +
       (status ? esc(*status) : std::string(kNone)) + "</p>";
}

}  // namespace

void render_sequence(std::string& o, const Diff& d, const Sequence& seq) {
  const std::string id = "seq-" + str(seq.index);
  const Layout lay = layout_for(seq.steps);
  const Marks marks = marks_for(d, seq);
  o += "<section class=\"sequence\" id=\"" + id + "\"><h3>Sequence " + str(seq.index) + "</h3>";
  o += "<div class=\"statuses\">";
  render_status(o, "A", seq.status_a);
  render_status(o, "B", seq.status_b);
  o += "</div>";
  o += "<p>Compared steps: <b>" + str(seq.steps) + "</b>; tokens: A " + str(seq.tokens_a.size()) + ", B " +
       str(seq.tokens_b.size()) + "; first differing token: " +
       (seq.first_token_divergence ? "step " + str(*seq.first_token_divergence) : std::string(kNone)) + ".";
  if (d.first && d.first->sequence == seq.index) {
    o += " <b>The first divergence of the diff is here</b> (step " + str(d.first->step) + ", layer " +
         (d.first->layer ? str(*d.first->layer) : std::string(kNone)) + ").";
  }
  o += "</p>";
  render_heatmap(o, d, seq, lay, marks);
  render_plot(o, "kld-plot", id + "-kld", "KL divergence KLD(A‖B) per step (log scale, floor 1e-12)", seq.kld,
              d.tol.max_mean_kld, lay, marks);
  render_plot(o, "dlogit-plot", id + "-dlogit", "max |Δlogit| per step (log scale, floor 1e-12)", seq.dlogit,
              d.tol.max_dlogit, lay, marks);
  render_top1(o, seq, lay, marks);
  render_tokens(o, seq);
  o += "</section>";
}

}  // namespace kvlab::golden::html

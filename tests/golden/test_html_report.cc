// The HTML report of a golden diff (golden/html/html_report.h): structure, markings of the
// first divergence, escaping, non-finite numbers, missing fields, malformed input.
//
// KVLAB_HTML_REPORT_EXAMPLE=<path> makes HtmlReport.RealisticExample also write its page
// there (for a look in a browser).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "golden/html/html_report.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

using nlohmann::json;

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

// The text of <section ... id="ID"> ... </section> (sections do not nest inside one).
std::string section(const std::string& html, const std::string& id) {
  const std::size_t begin = html.find("<section class=\"sequence\" id=\"" + id + "\"");
  if (begin == std::string::npos) return {};
  const std::size_t end = html.find("</section>", begin);
  return html.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The text from `open` to the next `close`.
std::string between(const std::string& html, const std::string& open, const std::string& close) {
  const std::size_t begin = html.find(open);
  if (begin == std::string::npos) return {};
  const std::size_t end = html.find(close, begin);
  return html.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Balanced tags and one document.
void expect_well_formed(const std::string& html) {
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "<html"), 1u);
  EXPECT_EQ(count(html, "</html>"), 1u);
  EXPECT_EQ(count(html, "<body>"), 1u);
  EXPECT_EQ(count(html, "</body>"), 1u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_GT(html.find("</html>"), html.find("</body>"));
  for (const char* tag : {"svg", "section", "table", "tr", "div", "ul", "p", "title", "text", "pattern", "defs"}) {
    EXPECT_EQ(count(html, std::string("<") + tag + ">") + count(html, std::string("<") + tag + " "),
              count(html, std::string("</") + tag + ">"))
        << tag;
  }
  // The stylesheet is a list of rules `selector { property: value; ... }`: a stray token
  // between rules makes a browser drop the rule after it (a mutation survivor: a line
  // added inside it went unseen).
  const std::string css = between(html, "<style>", "</style>");
  ASSERT_FALSE(css.empty());
  std::size_t rules = 0;
  for (std::size_t at = 0, close; (close = css.find('}', at)) != std::string::npos; at = close + 1, ++rules) {
    const std::string rule = css.substr(at, close - at);
    const std::size_t open = rule.find('{');
    ASSERT_NE(open, std::string::npos) << "a '}' without its '{': " << rule;
    const std::string selector = rule.substr(0, open), body = rule.substr(open + 1);
    EXPECT_EQ(selector.find_first_of(";{"), std::string::npos) << "not a selector: " << selector;
    EXPECT_NE(selector.find_first_not_of(" \n"), std::string::npos) << "a rule without a selector: " << rule;
    EXPECT_EQ(body.find('{'), std::string::npos) << "a nested '{': " << rule;
    for (std::size_t d = 0, semi; d < body.size(); d = semi + 1) {
      semi = std::min(body.find(';', d), body.size());
      const std::string decl = body.substr(d, semi - d);
      if (decl.find_first_not_of(" \n") != std::string::npos) EXPECT_NE(decl.find(':'), std::string::npos) << decl;
    }
  }
  EXPECT_GT(rules, 10u);
  EXPECT_EQ(css.substr(css.rfind('}') + 1).find_first_not_of(" \n"), std::string::npos) << "text after the last rule";
  // Nothing external.
  EXPECT_EQ(html.find("http://") == std::string::npos ? 0u : count(html, "http://") - count(html, "http://www.w3.org/2000/svg"), 0u);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
}

json side(const std::string& engine, const std::string& backend) {
  return {{"path", "golden/data/llama_dense.decode." + engine + ".safetensors"},
          {"meta",
           {{"kvlab.golden", "1"},
            {"engine", engine},
            {"engine_version", engine == "kvlab" ? "0.9.0" : "0.32.2"},
            {"backend", backend},
            {"model", "llama_dense"},
            {"scenario", "decode"},
            {"kvlab_commit", "10791fd"},
            {"cache_classes", "KVCache,KVCache,KVCache,KVCache"},
            {"seq.0.status", "ok"}}}};
}

json tolerance() { return {{"max_dlogit", 1e-3}, {"max_mean_kld", 1e-6}, {"min_top1", 1.0}, {"attn_rel", 1e-4}}; }

json summary(int steps, double dlogit) {
  return {{"steps", steps},
          {"top1_agreement", 1.0},
          {"max_abs_dlogit", dlogit},
          {"kld", {{"mean", 0.0}, {"median", 0.0}, {"p99", 0.0}, {"p999", 0.0}, {"max", 0.0}}},
          {"rms_dp", 0.0}};
}

// One sequence of `layers` x `steps` small deltas, same tokens.
json agreeing_sequence(int index, int layers, int steps) {
  json tokens = json::array(), kld = json::array(), dl = json::array(), top1 = json::array(), rel = json::array();
  for (int s = 0; s < steps; ++s) {
    tokens.push_back(100 + s);
    kld.push_back(1e-13);
    dl.push_back(2e-7);
    top1.push_back(true);
  }
  for (int l = 0; l < layers; ++l) {
    json row = json::array();
    for (int s = 0; s < steps; ++s) row.push_back(1e-7 * (l + 1));
    rel.push_back(row);
  }
  return {{"index", index},       {"status_a", "ok"}, {"status_b", "ok"}, {"tokens_a", tokens},
          {"tokens_b", tokens},   {"first_token_divergence", nullptr},  {"steps_compared", steps},
          {"kld", kld},           {"max_abs_dlogit", dl},               {"top1_same", top1},
          {"layer_rel", rel}};
}

json passing_diff() {
  return {{"a", side("kvlab", "reference")},
          {"b", side("mlx-lm", "mlx-cpu")},
          {"tolerance", tolerance()},
          {"verdict", "pass"},
          {"reasons", json::array()},
          {"first_divergence", nullptr},
          {"summary", summary(4, 2e-7)},
          {"sequences", {agreeing_sequence(0, 2, 4)}}};
}

// Sequence 0: 3 layers, tokens differ at step 3 (compared steps 0..3), layer 1 over
// attn_rel there. Sequence 1: B raised after 2 steps.
json failing_diff() {
  json d = passing_diff();
  d["verdict"] = "fail";
  d["reasons"] = {"max |Δlogit| 0.3 > 1e-3", "top-1 agreement 85.7% < 100%"};
  d["first_divergence"] = {{"sequence", 0}, {"step", 3}, {"layer", 1}, {"what", "token 17 vs 93"}};
  d["summary"] = summary(7, 0.3);
  d["summary"]["top1_agreement"] = 6.0 / 7.0;
  json s0 = agreeing_sequence(0, 3, 4);
  s0["tokens_a"] = {5, 6, 7, 17, 8, 9};
  s0["tokens_b"] = {5, 6, 7, 93, 4};
  s0["first_token_divergence"] = 3;
  s0["kld"][3] = 0.02;
  s0["max_abs_dlogit"][3] = 0.3;
  s0["top1_same"][3] = false;
  s0["layer_rel"][1][3] = 3e-2;
  s0["layer_rel"][2][3] = 5e-1;
  json s1 = agreeing_sequence(1, 3, 3);
  s1["tokens_b"] = {100, 101};
  s1["steps_compared"] = 2;
  s1["kld"] = {0.0, 0.0};
  s1["max_abs_dlogit"] = {1e-7, 1e-7};
  s1["top1_same"] = {true, true};
  s1["layer_rel"] = {{1e-7, 1e-7}, {1e-7, nullptr}, {1e-7, 1e-7}};
  s1["status_b"] = "error: NotImplementedError: RotatingKVCache Quantization NYI";
  d["sequences"] = {s0, s1};
  return d;
}

TEST(HtmlReport, PassingDiff) {
  const std::string html = render_diff_html(passing_diff());
  expect_well_formed(html);
  EXPECT_NE(html.find("<div class=\"verdict pass\" id=\"verdict\"><span class=\"word\">PASS</span>"), std::string::npos);
  EXPECT_EQ(html.find("verdict fail"), std::string::npos);
  EXPECT_EQ(count(html, "<section class=\"sequence\""), 1u);
  const std::string s0 = section(html, "seq-0");
  ASSERT_FALSE(s0.empty());
  EXPECT_EQ(count(s0, "<svg class=\"heatmap\" id=\"seq-0-heatmap\""), 1u);
  EXPECT_EQ(count(s0, "<rect class=\"cell\""), 2u * 4u);
  EXPECT_EQ(count(s0, "<svg class=\"kld-plot\" id=\"seq-0-kld\""), 1u);
  EXPECT_EQ(count(s0, "<svg class=\"dlogit-plot\" id=\"seq-0-dlogit\""), 1u);
  EXPECT_EQ(count(s0, "<rect class=\"top1 same\""), 4u);
  EXPECT_EQ(count(s0, "<div class=\"tokens\" id=\"seq-0-tokens\""), 1u);
  EXPECT_EQ(count(s0, "diverged"), 0u);
  EXPECT_EQ(count(s0, "first-divergent"), 0u);
  EXPECT_NE(html.find("<p id=\"first-divergence\">First divergence: \xe2\x80\x94</p>"), std::string::npos);
  // Metadata: two columns, the engine row differs, the model row does not.
  const std::string meta = between(html, "<table class=\"kv\" id=\"metadata\">", "</table>");
  EXPECT_NE(meta.find("<tr class=\"differs\"><th>engine</th><td class=\"v\">kvlab</td><td class=\"v\">mlx-lm</td></tr>"),
            std::string::npos);
  EXPECT_NE(meta.find("<tr><th>model</th><td class=\"v\">llama_dense</td><td class=\"v\">llama_dense</td></tr>"),
            std::string::npos);
  EXPECT_NE(meta.find("<th>seq.0.status</th>"), std::string::npos);
  const std::string sum = between(html, "id=\"summary\"", "</table>");
  EXPECT_NE(sum.find("<th>top-1 agreement</th><td class=\"v\">100.00%</td>"), std::string::npos);
  EXPECT_NE(sum.find("<th>max |Δlogit|</th><td class=\"v\">2e-7</td><td class=\"v\">≤ 1e-3</td>"), std::string::npos);
  EXPECT_EQ(count(sum, "over"), 0u);
}

TEST(HtmlReport, FailingDiffMarksTheFirstDivergence) {
  const std::string html = render_diff_html(failing_diff());
  expect_well_formed(html);
  EXPECT_NE(html.find("<div class=\"verdict fail\" id=\"verdict\"><span class=\"word\">FAIL</span>"), std::string::npos);
  const std::string reasons = between(html, "<ul id=\"reasons\">", "</ul>");
  EXPECT_EQ(count(reasons, "<li>"), 2u);
  EXPECT_NE(reasons.find("<li>max |Δlogit| 0.3 &gt; 1e-3</li>"), std::string::npos);
  EXPECT_NE(html.find("First divergence: <a href=\"#seq-0\">sequence 0</a>, step 3, layer 1: token 17 vs 93</p>"),
            std::string::npos);
  EXPECT_EQ(count(html, "<section class=\"sequence\""), 2u);

  const std::string s0 = section(html, "seq-0");
  EXPECT_EQ(count(s0, "<rect class=\"cell\""), 3u * 4u);
  // The outline sits on the cell (layer 1, step 3): same x + 1.5 and y + 1.5.
  ASSERT_EQ(count(s0, "<rect class=\"first-divergent\" id=\"seq-0-first-divergent\""), 1u);
  const std::string cell = between(s0, "<rect class=\"cell\" data-layer=\"1\" data-step=\"3\"", "</rect>");
  ASSERT_FALSE(cell.empty());
  EXPECT_NE(cell.find("layer 1, step 3: 0.03"), std::string::npos);
  auto attr = [](const std::string& tag, const std::string& name) {
    const std::size_t at = tag.find(" " + name + "=\"");
    const std::size_t from = at + name.size() + 3;
    return std::stod(tag.substr(from, tag.find('"', from) - from));
  };
  const std::string outline = between(s0, "<rect class=\"first-divergent\"", ">");
  EXPECT_DOUBLE_EQ(attr(outline, "x"), attr(cell, "x") + 1.5);
  EXPECT_DOUBLE_EQ(attr(outline, "y"), attr(cell, "y") + 1.5);
  // Tokens: step 3 is marked in both rows, later steps are dimmed, B's missing step too.
  const std::string row_a = between(s0, "<tr class=\"side-a\">", "</tr>");
  const std::string row_b = between(s0, "<tr class=\"side-b\">", "</tr>");
  EXPECT_EQ(count(row_a.substr(0, row_a.find("diverged")), "</td>"), 3u);  // steps 0, 1, 2 before it
  EXPECT_NE(row_a.find("<td class=\"tok diverged\">17</td>"), std::string::npos);
  EXPECT_NE(row_b.find("<td class=\"tok diverged\">93</td>"), std::string::npos);
  EXPECT_EQ(count(row_a, "<td class=\"tok after\""), 2u);
  EXPECT_EQ(count(row_b, "<td class=\"tok after\""), 1u);
  EXPECT_EQ(count(row_b, "<td class=\"tok after missing\""), 1u);
  EXPECT_EQ(count(s0, "<rect class=\"top1 differ\""), 1u);
  EXPECT_EQ(count(s0, "<rect class=\"top1 same\""), 3u);

  // Sequence 1: no outline, the error status prominent, the null cell hatched.
  const std::string s1 = section(html, "seq-1");
  EXPECT_EQ(count(s1, "<rect class=\"cell\""), 3u * 2u);
  EXPECT_EQ(count(s1, "first-divergent"), 0u);
  EXPECT_NE(s1.find("<p class=\"status error\">B: error: NotImplementedError: RotatingKVCache Quantization NYI</p>"),
            std::string::npos);
  EXPECT_NE(s1.find("<p class=\"status ok\">A: ok</p>"), std::string::npos);
  EXPECT_EQ(count(s1, "fill=\"url(#seq-1-hatch)\""), 1u + 1u);  // the cell and the legend swatch
  EXPECT_NE(s1.find("layer 1, step 1: no record"), std::string::npos);
  // The legend marks the tolerance on its scale (a mutation survivor dropped the label).
  EXPECT_NE(s1.find("font-weight=\"600\">tolerance "), std::string::npos);
  // The summary flags the broken limits.
  const std::string sum = between(html, "id=\"summary\"", "</table>");
  EXPECT_NE(sum.find("<td class=\"v over\">0.3</td>"), std::string::npos);
  EXPECT_NE(sum.find("<td class=\"v over\">85.71%</td>"), std::string::npos);
}

TEST(HtmlReport, FirstDivergenceWithoutLayerMarksTheColumn) {
  json d = failing_diff();
  d["first_divergence"]["layer"] = nullptr;
  const std::string html = render_diff_html(d);
  expect_well_formed(html);
  EXPECT_NE(html.find("step 3, layer \xe2\x80\x94 (no layer over attn_rel): token 17 vs 93"), std::string::npos);
  const std::string s0 = section(html, "seq-0");
  EXPECT_EQ(count(s0, "first-divergent"), 0u);
  EXPECT_GE(count(s0, "<rect class=\"divergent-step\""), 1u);
}

TEST(HtmlReport, NoAttentionRecordsAndMissingFields) {
  json d = passing_diff();
  json s0 = agreeing_sequence(0, 2, 3);
  s0.erase("layer_rel");
  json s1 = agreeing_sequence(1, 2, 3);
  s1["layer_rel"] = json::array();
  json s2 = agreeing_sequence(2, 2, 0);  // an engine that raised before its first step
  s2["tokens_a"] = json::array();
  s2["tokens_b"] = json::array();
  s2["status_a"] = "error: RuntimeError: boom";
  d["sequences"] = {s0, s1, s2};
  d.erase("summary");
  d.erase("reasons");
  d.erase("tolerance");
  d["b"]["meta"].erase("engine");
  const std::string html = render_diff_html(d);
  expect_well_formed(html);
  EXPECT_EQ(count(html, "<section class=\"sequence\""), 3u);
  for (const char* id : {"seq-0", "seq-1"}) {
    const std::string s = section(html, id);
    EXPECT_EQ(count(s, "<svg class=\"heatmap\""), 0u) << id;
    EXPECT_EQ(count(s, "<rect class=\"cell\""), 0u) << id;
    EXPECT_NE(s.find("<p class=\"none\">\xe2\x80\x94 no attention records to compare</p>"), std::string::npos) << id;
    EXPECT_EQ(count(s, "<svg class=\"kld-plot\""), 1u) << id;
    EXPECT_EQ(count(s, "<div class=\"tokens\""), 1u) << id;
  }
  const std::string sec2 = section(html, "seq-2");
  EXPECT_EQ(count(sec2, "<svg"), 0u);
  EXPECT_EQ(count(sec2, "<div class=\"tokens\" id=\"seq-2-tokens\"><p class=\"none\">\xe2\x80\x94</p></div>"), 1u);
  EXPECT_NE(sec2.find("<p class=\"status error\">A: error: RuntimeError: boom</p>"), std::string::npos);
  EXPECT_NE(html.find("<p id=\"reasons\" class=\"none\">Reasons: \xe2\x80\x94</p>"), std::string::npos);
  const std::string sum = between(html, "id=\"summary\"", "</table>");
  EXPECT_NE(sum.find("<th>KLD p99.9</th><td class=\"v\">\xe2\x80\x94</td>"), std::string::npos);
  EXPECT_NE(html.find("<tr class=\"differs\"><th>engine</th><td class=\"v\">kvlab</td><td class=\"v\">\xe2\x80\x94</td></tr>"),
            std::string::npos);

  // No sequences at all: the section is there, with a dash.
  json empty = passing_diff();
  empty["sequences"] = json::array();
  const std::string e = render_diff_html(empty);
  expect_well_formed(e);
  EXPECT_EQ(count(e, "<section class=\"sequence\""), 0u);
  EXPECT_NE(e.find("<section id=\"sequences\"><h2>Sequences</h2>\n<p class=\"none\">\xe2\x80\x94"), std::string::npos);
  json absent = passing_diff();
  absent.erase("sequences");
  absent.erase("a");
  EXPECT_NO_THROW(expect_well_formed(render_diff_html(absent)));
}

TEST(HtmlReport, NonFiniteNumbersAndHostileStrings) {
  json d = failing_diff();
  const std::string hostile = "<script>alert(1)</script> & \"quoted\" 'single'";
  d["a"]["meta"]["engine"] = hostile;
  d["a"]["meta"]["<img src=x onerror=alert(2)>"] = hostile;
  d["b"]["path"] = hostile;
  d["reasons"] = {hostile};
  d["first_divergence"]["what"] = hostile;
  d["sequences"][0]["status_a"] = "error: " + hostile;
  d["summary"]["max_abs_dlogit"] = "inf";
  d["summary"]["kld"]["mean"] = "nan";
  d["summary"]["kld"]["max"] = "-inf";
  d["sequences"][0]["kld"][2] = "nan";
  d["sequences"][0]["kld"][3] = "inf";
  d["sequences"][0]["max_abs_dlogit"][3] = "inf";
  d["sequences"][0]["layer_rel"][0][0] = "nan";
  d["sequences"][0]["layer_rel"][2][3] = "inf";
  const std::string html = render_diff_html(d);
  expect_well_formed(html);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("'single'"), std::string::npos);
  EXPECT_EQ(html.find("\"quoted\""), std::string::npos);
  const std::string escaped = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot; &#39;single&#39;";
  EXPECT_GE(count(html, escaped), 5u);  // engine, extra meta value, path, reason, what, status
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(2)&gt;"), std::string::npos);
  EXPECT_NE(html.find("<p class=\"status error\">A: error: " + escaped + "</p>"), std::string::npos);
  const std::string sum = between(html, "id=\"summary\"", "</table>");
  EXPECT_NE(sum.find("<td class=\"v over\">inf</td>"), std::string::npos);
  EXPECT_NE(sum.find("<td class=\"v over\">nan</td>"), std::string::npos);
  EXPECT_NE(sum.find("<th>KLD max</th><td class=\"v\">-inf</td>"), std::string::npos);
  const std::string s0 = section(html, "seq-0");
  EXPECT_EQ(count(s0, "<rect class=\"cell\""), 12u);
  EXPECT_NE(between(s0, "data-layer=\"0\" data-step=\"0\"", "</rect>").find("fill=\"#000000\""), std::string::npos);
  EXPECT_NE(between(s0, "data-layer=\"2\" data-step=\"3\"", "</rect>").find("fill=\"#7f0000\""), std::string::npos);
  EXPECT_NE(s0.find("<title>step 3: inf</title>"), std::string::npos);
  EXPECT_NE(s0.find(">nan</text>"), std::string::npos);
  // Numbers never leak as "nan"/"inf" into SVG coordinates.
  for (const char* attr : {"x=\"nan", "y=\"nan", "cy=\"nan", "cy=\"inf", "cy=\"-inf", "x=\"inf", "y=\"inf"}) {
    EXPECT_EQ(html.find(attr), std::string::npos) << attr;
  }
}

void expect_invalid(const json& d, const std::string& field) {
  try {
    (void)render_diff_html(d);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
  }
}

TEST(HtmlReport, MalformedTypesThrowNamingTheField) {
  {
    json d = failing_diff();
    d["sequences"][0]["kld"] = {{"mean", 0}};
    expect_invalid(d, "sequences[0].kld");
  }
  {
    json d = failing_diff();
    d["sequences"][1]["kld"][1] = "infinite";
    expect_invalid(d, "sequences[1].kld[1]");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["kld"] = {0.0, 0.0};  // 2 entries, 4 steps compared
    expect_invalid(d, "sequences[0].kld");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["layer_rel"][1] = 0.5;
    expect_invalid(d, "sequences[0].layer_rel[1]");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["layer_rel"][2][0] = true;
    expect_invalid(d, "sequences[0].layer_rel[2][0]");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["top1_same"][0] = "yes";
    expect_invalid(d, "sequences[0].top1_same[0]");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["tokens_a"][0] = 1.5;
    expect_invalid(d, "sequences[0].tokens_a[0]");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["first_token_divergence"] = 6;
    expect_invalid(d, "sequences[0].first_token_divergence");
  }
  {
    json d = failing_diff();
    d["sequences"][1]["index"] = 0;
    expect_invalid(d, "sequences[1].index");
  }
  {
    json d = failing_diff();
    d["sequences"][0]["status_b"] = 3;
    expect_invalid(d, "sequences[0].status_b");
  }
  {
    json d = failing_diff();
    d["sequences"] = {{"index", 0}};
    expect_invalid(d, "sequences");
  }
  {
    json d = failing_diff();
    d["sequences"][0] = json::array();
    expect_invalid(d, "sequences[0]");
  }
  {
    json d = failing_diff();
    d["a"]["meta"]["engine"] = json::array();
    expect_invalid(d, "a.meta.engine");
  }
  {
    json d = failing_diff();
    d["b"] = "mlx";
    expect_invalid(d, "b");
  }
  {
    json d = failing_diff();
    d["verdict"] = "maybe";
    expect_invalid(d, "verdict");
    d.erase("verdict");
    expect_invalid(d, "verdict");
  }
  {
    json d = failing_diff();
    d["reasons"] = "too big";
    expect_invalid(d, "reasons");
  }
  {
    json d = failing_diff();
    d["first_divergence"]["step"] = "3";
    expect_invalid(d, "first_divergence.step");
    d["first_divergence"] = {{"step", 3}};
    expect_invalid(d, "first_divergence.sequence");
  }
  {
    json d = failing_diff();
    d["summary"]["kld"] = {1, 2};
    expect_invalid(d, "summary.kld");
  }
  {
    json d = failing_diff();
    d["tolerance"]["attn_rel"] = json::object();
    expect_invalid(d, "tolerance.attn_rel");
  }
  expect_invalid(json::array(), "(the diff)");
}

TEST(HtmlReport, OversizedInputIsRefused) {
  {
    json d = passing_diff();
    d["sequences"] = json::array({agreeing_sequence(0, 1, 0)});
    d["sequences"][0]["steps_compared"] = kHtmlMaxSteps + 1;
    d["sequences"][0].erase("kld");
    d["sequences"][0].erase("max_abs_dlogit");
    d["sequences"][0].erase("top1_same");
    d["sequences"][0].erase("layer_rel");
    expect_invalid(d, "sequences[0].steps_compared");
  }
  {
    json d = passing_diff();
    d["sequences"] = json::array({agreeing_sequence(0, static_cast<int>(kHtmlMaxLayers) + 1, 1)});
    expect_invalid(d, "sequences[0].layer_rel");
  }
  {
    json d = passing_diff();
    d["sequences"][0]["tokens_a"] = json(std::vector<int>(kHtmlMaxSteps + 1, 7));
    expect_invalid(d, "sequences[0].tokens_a");
  }
  {
    // Within each sequence's bounds, but too many cells in all.
    json d = passing_diff();
    d["sequences"] = json::array();
    for (int i = 0; i < 3; ++i) d["sequences"].push_back(agreeing_sequence(i, 256, 512));
    expect_invalid(d, "sequences");
  }
  {
    // At the bounds: fine.
    json d = passing_diff();
    d["sequences"] = json::array({agreeing_sequence(0, 32, static_cast<int>(kHtmlMaxSteps))});
    const std::string html = render_diff_html(d);
    EXPECT_EQ(count(html, "<rect class=\"cell\""), 32u * kHtmlMaxSteps);
    EXPECT_LT(html.size(), std::size_t{64} << 20);
  }
}

// 2 sequences, 4 layers, 24 steps; sequence 0 diverges at step 9, layer 2, with deltas
// growing from 1e-7 to 1e-1 after it and KLD growing; sequence 1 agrees but for an error
// on the B side after 20 steps.
json realistic_diff() {
  constexpr int kLayers = 4, kSteps = 24, kDiv = 9;
  json d = failing_diff();
  d["a"]["meta"]["scenario"] = "decode_q4";
  d["b"]["meta"]["scenario"] = "decode_q4";
  d["a"]["meta"]["cache_classes"] = "KVCache,RotatingKVCache,QuantizedKVCache,KVCache";
  d["b"]["meta"]["cache_classes"] = "KVCache,RotatingKVCache,KVCache,KVCache";
  d["reasons"] = {"max |Δlogit| 1.84 > 1e-3", "mean KLD 0.00873 > 1e-6", "top-1 agreement 97.7% < 100%",
                  "sequence 1: status ok vs error: NotImplementedError: RotatingKVCache Quantization NYI"};
  d["first_divergence"] = {{"sequence", 0}, {"step", kDiv}, {"layer", 2}, {"what", "max |Δlogit| 2.1e-3 > 1e-3"}};
  json seqs = json::array();
  for (int i = 0; i < 2; ++i) {
    const int steps = i == 0 ? kSteps : 20;
    json ta = json::array(), tb = json::array(), kld = json::array(), dl = json::array(), top1 = json::array(),
         rel = json::array();
    for (int s = 0; s < kSteps; ++s) {
      const int tok = (s * 37 + 11 + i * 5) % 256;
      ta.push_back(tok);
      if (s < steps) tb.push_back(i == 0 && s >= 21 ? (tok + 3) % 256 : tok);
    }
    for (int s = 0; s < steps; ++s) {
      const double grow = i == 0 && s >= kDiv ? std::pow(10.0, -6.0 + 5.0 * (s - kDiv) / (kSteps - 1 - kDiv)) : 0;
      kld.push_back(i == 0 && s >= kDiv ? grow * 1e-2 : 1e-14 * (1 + s % 3));
      dl.push_back(i == 0 && s >= kDiv ? std::min(2.0, 2e-3 * std::pow(1.6, s - kDiv)) : 3e-7 * (1 + s % 4));
      top1.push_back(!(i == 0 && s >= 21));
    }
    for (int l = 0; l < kLayers; ++l) {
      json row = json::array();
      for (int s = 0; s < steps; ++s) {
        double v = 1e-8 * (1 + l) * (1 + (s * 7 + l) % 5);
        if (i == 0 && l >= 2 && s >= kDiv) {
          v = std::pow(10.0, -7.0 + 6.0 * (s - kDiv) / (kSteps - 1 - kDiv)) * (l == 2 ? 1.0 : 0.5);
          if (s == kDiv) v = 3e-4 * (l == 2 ? 1.0 : 0.2);
        }
        if (i == 1 && l == 1) {
          row.push_back(nullptr);  // a shared layer: no record on one side
        } else {
          row.push_back(v);
        }
      }
      rel.push_back(row);
    }
    json seq = {{"index", i},
                {"status_a", "ok"},
                {"status_b", i == 0 ? "ok" : "error: NotImplementedError: RotatingKVCache Quantization NYI"},
                {"tokens_a", ta},
                {"tokens_b", tb},
                {"first_token_divergence", i == 0 ? json(21) : json(nullptr)},
                {"steps_compared", i == 0 ? 22 : steps},
                {"kld", kld},
                {"max_abs_dlogit", dl},
                {"top1_same", top1},
                {"layer_rel", rel}};
    if (i == 0) {  // compared steps: the common prefix plus the first differing step
      for (const char* key : {"kld", "max_abs_dlogit", "top1_same"}) seq[key].erase(seq[key].end() - 2, seq[key].end());
      for (auto& row : seq["layer_rel"]) row.erase(row.end() - 2, row.end());
    }
    seqs.push_back(seq);
  }
  d["sequences"] = seqs;
  d["summary"] = {{"steps", 42},
                  {"top1_agreement", 41.0 / 42.0},
                  {"max_abs_dlogit", 1.84},
                  {"kld", {{"mean", 0.00873}, {"median", 2e-14}, {"p99", 0.0951}, {"p999", 0.1}, {"max", 0.1}}},
                  {"rms_dp", 0.0213}};
  return d;
}

TEST(HtmlReport, RealisticExample) {
  const json d = realistic_diff();
  const std::string html = render_diff_html(d);
  expect_well_formed(html);
  EXPECT_EQ(count(section(html, "seq-0"), "<rect class=\"cell\""), 4u * 22u);
  EXPECT_EQ(count(section(html, "seq-1"), "<rect class=\"cell\""), 4u * 20u);
  EXPECT_EQ(count(section(html, "seq-0"), "id=\"seq-0-first-divergent\""), 1u);
  if (const char* out = std::getenv("KVLAB_HTML_REPORT_EXAMPLE")) {
    std::ofstream(out) << html;
  }
}

}  // namespace
}  // namespace kvlab::golden

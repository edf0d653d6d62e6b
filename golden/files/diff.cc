#include "golden/files/diff.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>

#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

using nlohmann::json;

// JSON has no NaN or infinity; the README writes them as strings.
json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double as_double(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v == "inf") return std::numeric_limits<double>::infinity();
  if (v == "-inf") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

std::string fmt(double v) {
  std::ostringstream o;
  o << std::setprecision(3) << v;
  return o.str();
}

struct StepStats {
  double kld = 0, max_abs = 0, dp = 0;
  bool top1_same = true;
};

// Log-softmax in double: exact enough that two identical rows give KLD 0 exactly.
std::vector<double> log_softmax(const float* row, std::int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(row[i]));
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(row[i]) - lse;
  return out;
}

std::int64_t argmax(const float* row, std::int64_t n) {
  return std::max_element(row, row + n, [](float x, float y) { return x < y; }) - row;
}

StepStats compare_step(const float* a, const float* b, std::int64_t vocab) {
  StepStats s;
  const auto la = log_softmax(a, vocab), lb = log_softmax(b, vocab);
  for (std::int64_t i = 0; i < vocab; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const double pa = std::exp(la[k]);
    if (pa > 0) s.kld += pa * (la[k] - lb[k]);
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    s.max_abs = std::isnan(d) ? d : std::max(s.max_abs, d);
  }
  const std::int64_t ta = argmax(a, vocab), tb = argmax(b, vocab);
  s.top1_same = ta == tb;
  s.dp = std::exp(la[static_cast<std::size_t>(ta)]) - std::exp(lb[static_cast<std::size_t>(ta)]);
  return s;
}

// ‖a − b‖₂ / max(‖a‖₂, tiny) of row t; nullopt when either side has no record.
std::optional<double> layer_rel(const SequenceRecord& a, const SequenceRecord& b, std::size_t layer, std::int64_t t) {
  if (layer >= a.attention.size() || layer >= b.attention.size()) return std::nullopt;
  const Tensor& ta = a.attention[layer];
  const Tensor& tb = b.attention[layer];
  if (ta.dim(1) != tb.dim(1)) return std::numeric_limits<double>::infinity();
  const std::int64_t w = ta.dim(1);
  const float* pa = ta.storage<float>().data() + t * w;
  const float* pb = tb.storage<float>().data() + t * w;
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < w; ++i) {
    const double d = static_cast<double>(pa[i]) - pb[i];
    num += d * d;
    den += static_cast<double>(pa[i]) * pa[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Nearest rank. A NaN anywhere makes every order statistic NaN (and keeps NaN out of
// std::sort, whose ordering it would break).
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  if (std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

ToleranceChoice scenario_tolerance(const Golden& a, const Golden& b,
                                   const std::function<std::filesystem::path(const Golden&)>& scenario_file_of) {
  ToleranceChoice out;
  std::vector<std::string> found, missing;
  bool any = false;
  for (const Golden* g : {&a, &b}) {
    const std::string name = g->get("scenario");
    const std::filesystem::path file = scenario_file_of(*g);
    std::error_code ec;
    std::optional<Scenario> hit;
    if (!name.empty() && !file.empty() && std::filesystem::exists(file, ec))
      for (Scenario& s : read_scenarios(file))
        if (s.name == name) hit = std::move(s);
    const std::string what = cat("scenario '", name, "' of model '", g->get("model"), "'");
    if (!hit) {
      missing.push_back(cat(what, file.empty() ? std::string() : cat(" (not in ", file.string(), ")")));
      continue;
    }
    const std::string place = cat(file.string(), " '", name, "'");
    if (std::find(found.begin(), found.end(), place) == found.end()) found.push_back(place);
    const Tolerance& t = hit->tolerance;
    Tolerance& m = out.tolerance;
    m = any ? Tolerance{std::min(m.max_dlogit, t.max_dlogit), std::min(m.max_mean_kld, t.max_mean_kld),
                        std::max(m.min_top1, t.min_top1), std::min(m.attn_rel, t.attn_rel)}
            : t;
    any = true;
  }
  for (const std::string& f : found) out.from += (out.from.empty() ? "from " : ", the stricter of it and ") + f;
  if (!any) {
    out.from = "the README defaults: no checked-in ";
    for (std::size_t i = 0; i < missing.size(); ++i) out.from += (i ? "; " : "") + missing[i];
  }
  return out;
}

json diff_goldens(const DiffInput& in_a, const DiffInput& in_b, const Tolerance& tol) {
  const Golden& A = *in_a.golden;
  const Golden& B = *in_b.golden;
  const auto model = [](const Golden& g) {
    return cat("model '", g.get("model"), "' (model_sha256 ", g.get("model_sha256").empty() ? "none" : g.get("model_sha256"),
               ")");
  };
  KVLAB_REQUIRE(A.get("model_sha256") == B.get("model_sha256"), invalid_argument,
                "the goldens are not comparable: A is of ", model(A), ", B of ", model(B),
                "; a diff compares runs over the same weights");
  const std::int64_t vocab = A.vocab();
  KVLAB_REQUIRE(vocab == B.vocab() || A.sequences.empty() || B.sequences.empty(), invalid_argument,
                "the goldens are not comparable: vocabulary ", vocab, " vs ", B.vocab());
  json report = {{"a", {{"path", in_a.path}, {"meta", A.meta}}},
                 {"b", {{"path", in_b.path}, {"meta", B.meta}}},
                 {"tolerance",
                  {{"max_dlogit", tol.max_dlogit}, {"max_mean_kld", tol.max_mean_kld}, {"min_top1", tol.min_top1},
                   {"attn_rel", tol.attn_rel}}}};
  json reasons = json::array();
  json first = nullptr;
  std::vector<double> klds, dps;
  double max_abs = 0;
  std::int64_t same = 0;
  const auto note_first = [&](std::size_t seq, std::int64_t step, json layer, const std::string& what) {
    if (!first.is_null()) return;
    first = {{"sequence", seq}, {"step", step}, {"layer", std::move(layer)}, {"what", what}};
  };
  if (A.sequences.size() != B.sequences.size())
    reasons.push_back(cat("sequence count ", A.sequences.size(), " vs ", B.sequences.size()));
  const bool forced = A.get("teacher_forced") == "1" || B.get("teacher_forced") == "1";
  json sequences = json::array();
  for (std::size_t i = 0; i < std::min(A.sequences.size(), B.sequences.size()); ++i) {
    const SequenceRecord& a = A.sequences[i];
    const SequenceRecord& b = B.sequences[i];
    KVLAB_REQUIRE(a.prompt == b.prompt, invalid_argument, "the goldens are not comparable: sequence ", i,
                  " has different prompts (", a.prompt.size(), " vs ", b.prompt.size(), " tokens)");
    const std::int64_t n = std::min(a.steps(), b.steps());
    std::int64_t token_div = -1;
    for (std::int64_t t = 0; t < n && token_div < 0; ++t)
      if (a.tokens[static_cast<std::size_t>(t)] != b.tokens[static_cast<std::size_t>(t)]) token_div = t;
    // After the streams part, the inputs differ and nothing is comparable — unless one
    // side was teacher-forced with the other's tokens: then every step had the same input.
    const std::int64_t compared = token_div >= 0 && !forced ? token_div + 1 : n;
    const std::size_t layers = std::max(a.attention.size(), b.attention.size());
    json kld = json::array(), dlogit = json::array(), top1 = json::array();
    json rel = json::array();
    for (std::size_t l = 0; l < layers; ++l) rel.push_back(json::array());
    std::int64_t limit_step = -1;  // first step over max_dlogit
    for (std::int64_t t = 0; t < compared; ++t) {
      const StepStats s = compare_step(a.logits.storage<float>().data() + t * vocab,
                                       b.logits.storage<float>().data() + t * vocab, vocab);
      kld.push_back(number(s.kld));
      dlogit.push_back(number(s.max_abs));
      top1.push_back(s.top1_same);
      klds.push_back(s.kld);
      dps.push_back(s.dp);
      max_abs = std::isnan(s.max_abs) ? s.max_abs : std::max(max_abs, s.max_abs);
      same += s.top1_same ? 1 : 0;
      if (limit_step < 0 && !(s.max_abs <= tol.max_dlogit)) limit_step = t;
      for (std::size_t l = 0; l < layers; ++l) {
        const auto r = layer_rel(a, b, l, t);
        rel[l].push_back(r ? number(*r) : json(nullptr));
      }
    }
    // The first step at which this sequence breaks, and what broke.
    std::int64_t step = -1;
    std::string what;
    const auto consider = [&](std::int64_t t, std::string w) {
      if (t >= 0 && (step < 0 || t < step)) step = t, what = std::move(w);
    };
    if (token_div >= 0)
      consider(token_div, cat("token ", a.tokens[static_cast<std::size_t>(token_div)], " vs ",
                              b.tokens[static_cast<std::size_t>(token_div)]));
    if (limit_step >= 0)
      consider(limit_step, cat("max |dlogit| ", fmt(as_double(dlogit[static_cast<std::size_t>(limit_step)])), " > ",
                               fmt(tol.max_dlogit)));
    if (a.status != b.status) {
      reasons.push_back(cat("sequence ", i, ": status '", a.status, "' vs '", b.status, "'"));
      consider(n, cat("status '", a.status, "' vs '", b.status, "'"));
    } else if (a.steps() != b.steps() && token_div < 0) {
      reasons.push_back(cat("sequence ", i, ": ", a.steps(), " vs ", b.steps(), " steps"));
      consider(n, cat(a.steps(), " vs ", b.steps(), " steps"));
    }
    if (step >= 0) {
      // The layer: the lowest over attn_rel at that step, else at the earliest step before it.
      json layer = nullptr;
      for (std::int64_t t = 0; t <= std::min(step, compared - 1) && layer.is_null(); ++t)
        for (std::size_t l = 0; l < layers && layer.is_null(); ++l) {
          const json& v = rel[l][static_cast<std::size_t>(t)];
          if (!v.is_null() && !(as_double(v) <= tol.attn_rel)) layer = l;
        }
      note_first(i, step, layer, what);
    }
    sequences.push_back({{"index", i},
                         {"status_a", a.status},
                         {"status_b", b.status},
                         {"tokens_a", a.tokens},
                         {"tokens_b", b.tokens},
                         {"first_token_divergence", token_div >= 0 ? json(token_div) : json(nullptr)},
                         {"steps_compared", compared},
                         {"kld", kld},
                         {"max_abs_dlogit", dlogit},
                         {"top1_same", top1},
                         {"layer_rel", rel}});
  }
  const auto steps = static_cast<std::int64_t>(klds.size());
  double kld_mean = 0, dp2 = 0;
  for (double k : klds) kld_mean += k;
  for (double d : dps) dp2 += d * d;
  if (steps > 0) kld_mean /= static_cast<double>(steps), dp2 /= static_cast<double>(steps);
  const double agreement = steps > 0 ? static_cast<double>(same) / static_cast<double>(steps) : 1.0;
  const double kld_max = percentile(klds, 1.0);
  if (agreement < tol.min_top1) reasons.push_back(cat("top-1 agreement ", fmt(100 * agreement), "% < ", fmt(100 * tol.min_top1), "%"));
  if (!(max_abs <= tol.max_dlogit)) reasons.push_back(cat("max |dlogit| ", fmt(max_abs), " > ", fmt(tol.max_dlogit)));
  if (!(kld_mean <= tol.max_mean_kld)) reasons.push_back(cat("mean KLD ", fmt(kld_mean), " > ", fmt(tol.max_mean_kld)));
  report["summary"] = {{"steps", steps},
                       {"top1_agreement", agreement},
                       {"max_abs_dlogit", number(max_abs)},
                       {"kld",
                        {{"mean", number(kld_mean)},
                         {"median", number(percentile(klds, 0.5))},
                         {"p99", number(percentile(klds, 0.99))},
                         {"p999", number(percentile(klds, 0.999))},
                         {"max", number(kld_max)}}},
                       {"rms_dp", number(std::sqrt(dp2))}};
  report["sequences"] = sequences;
  report["first_divergence"] = first;
  report["reasons"] = reasons;
  report["verdict"] = reasons.empty() ? "pass" : "fail";
  return report;
}

bool diff_passed(const json& report) { return report.at("verdict") == "pass"; }

std::string diff_line(const json& r) {
  const json& s = r.at("summary");
  std::string out = cat(diff_passed(r) ? "PASS" : "FAIL", "  top-1 ", fmt(100 * s.at("top1_agreement").get<double>()),
                        "%  max|dlogit| ", fmt(as_double(s.at("max_abs_dlogit"))), "  KLD mean ",
                        fmt(as_double(s.at("kld").at("mean"))), " max ", fmt(as_double(s.at("kld").at("max"))),
                        "  steps ", s.at("steps").get<std::int64_t>());
  const json& f = r.at("first_divergence");
  if (!f.is_null())
    out += cat("  first divergence: seq ", f.at("sequence").get<std::int64_t>(), " step ",
               f.at("step").get<std::int64_t>(),
               f.at("layer").is_null() ? std::string() : cat(" layer ", f.at("layer").get<std::int64_t>()), " (",
               f.at("what").get<std::string>(), ")");
  return out;
}

std::string diff_text(const json& r) {
  std::ostringstream o;
  const auto side = [&](const char* key) {
    const json& m = r.at(key).at("meta");
    const auto get = [&](const char* k) { return m.contains(k) ? m.at(k).get<std::string>() : std::string("?"); };
    return cat(r.at(key).at("path").get<std::string>(), " (", get("engine"), " ", get("engine_version"), ", ",
               get("backend"), "; model ", get("model"), " sha256 ", get("model_sha256"), ")");
  };
  o << "A: " << side("a") << "\nB: " << side("b") << "\n" << diff_line(r) << "\n";
  const json& t = r.at("tolerance");
  o << "  tolerance: max|dlogit| " << fmt(as_double(t.at("max_dlogit"))) << ", mean KLD "
    << fmt(as_double(t.at("max_mean_kld"))) << ", top-1 >= " << fmt(100 * as_double(t.at("min_top1"))) << "%, attn_rel "
    << fmt(as_double(t.at("attn_rel")));
  if (r.contains("tolerance_from")) o << " (" << r.at("tolerance_from").get<std::string>() << ")";
  o << "\n";
  for (const json& reason : r.at("reasons")) o << "  reason: " << reason.get<std::string>() << "\n";
  const json& s = r.at("summary");
  const json& k = s.at("kld");
  o << "  KLD mean " << fmt(as_double(k.at("mean"))) << " median " << fmt(as_double(k.at("median"))) << " p99 "
    << fmt(as_double(k.at("p99"))) << " p99.9 " << fmt(as_double(k.at("p999"))) << " max "
    << fmt(as_double(k.at("max"))) << "; same top token " << fmt(100 * s.at("top1_agreement").get<double>())
    << "%; RMS dp " << fmt(as_double(s.at("rms_dp"))) << "\n";
  for (const json& q : r.at("sequences")) {
    o << "  seq " << q.at("index").get<std::int64_t>() << ": " << q.at("steps_compared").get<std::int64_t>()
      << " steps compared, status " << q.at("status_a").get<std::string>();
    if (q.at("status_b") != q.at("status_a")) o << " vs " << q.at("status_b").get<std::string>();
    o << "; max layer rel:";
    const json& rel = q.at("layer_rel");
    for (std::size_t l = 0; l < rel.size(); ++l) {
      double m = 0;
      bool any = false;
      for (const json& v : rel[l])
        if (!v.is_null()) any = true, m = std::isnan(as_double(v)) || std::isnan(m) ? std::nan("") : std::max(m, as_double(v));
      o << " L" << l << " " << (any ? fmt(m) : std::string("-"));
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace kvlab::golden

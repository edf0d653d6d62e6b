#include "golden/files/scenario.h"

#include <charconv>
#include <fstream>
#include <map>
#include <set>

#include "golden/files/inputs.h"
#include "harness/rng.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

// Bounds that keep one scenario a few seconds on the reference backend and its golden
// small; a line asking for more is a mistake, not a wish.
constexpr int kMaxPromptLength = 4096;
constexpr int kMaxRequests = 16;
constexpr int kMaxSteps = 4096;
constexpr std::size_t kMaxLineBytes = 4096;
constexpr std::size_t kMaxScenarios = 1024;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  fail(ErrorKind::invalid_argument, cat(where, ": ", what));
}

long long parse_int(std::string_view text, const std::string& key, long long lo, long long hi, const std::string& where) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    bad(where, cat(key, "='", text, "' is not an integer"));
  if (v < lo || v > hi) bad(where, cat(key, "=", v, " is outside [", lo, ", ", hi, "]"));
  return v;
}

double parse_real(std::string_view text, const std::string& key, const std::string& where) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !(v >= 0) || v > 1e30)
    bad(where, cat(key, "='", text, "' is not a finite number >= 0"));
  return v;
}

// "A@B" → (A, B).
std::pair<long long, long long> parse_at(std::string_view text, const std::string& key, long long hi_a,
                                         long long hi_b, const std::string& where) {
  const auto at = text.find('@');
  if (at == std::string_view::npos) bad(where, cat(key, "='", text, "' is not of the form A@B"));
  return {parse_int(text.substr(0, at), key, 0, hi_a, where), parse_int(text.substr(at + 1), key, 0, hi_b, where)};
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

void check_combination(const Scenario& s, const std::string& where) {
  if (s.prompts.empty()) bad(where, "prompts= is required");
  if (s.steps == 0) bad(where, "steps= is required");
  if (s.finish && s.finish->request >= static_cast<int>(s.prompts.size()))
    bad(where, cat("finish=", s.finish->request, "@", s.finish->after, " names request ", s.finish->request, " of ",
                   s.prompts.size()));
  if (s.finish && (s.finish->after < 1 || s.finish->after >= s.steps))
    bad(where, cat("finish=...@", s.finish->after, " must be in [1, steps)"));
  if (s.join && s.join->after_step >= s.steps) bad(where, cat("join=...@", s.join->after_step, " must be < steps"));
  if (s.join && s.join->prompt < 1) bad(where, "join= needs a prompt of at least 1 token");
  // One mechanism per scenario: each golden isolates one way a cache can go wrong, and
  // the runners implement the combinations mlx-lm's own machinery offers one at a time.
  const int mechanisms = (s.is_batch() ? 1 : 0) + (s.kv_bits ? 1 : 0) + (s.max_kv_size ? 1 : 0) + (s.prefix ? 1 : 0) +
                         (s.save_at ? 1 : 0);
  if (mechanisms > 1)
    bad(where, "combines more than one of batch (several prompts, finish, join), kv_bits, max_kv_size, prefix, save_at");
  if (s.prefix && (s.prefix->shared < 1 || s.prefix->shared > s.prompts[0] || s.prefix->fresh < 1))
    bad(where, cat("prefix=", s.prefix->shared, " must be in [1, ", s.prompts[0], "] and second= >= 1"));
  if (s.save_at && *s.save_at >= s.steps - 1) bad(where, cat("save_at=", *s.save_at, " must be < steps - 1"));
  // DeviceBatchKVCache has no filter or extend (its offsets would need device-side
  // rewinds no engine step performs), so a device batch keeps its rows to the end.
  if (s.batch_cache == BatchCache::device && (s.finish || s.join))
    bad(where, cat("batch_cache=device cannot run ", s.finish ? "finish=" : "join=",
                   ": DeviceBatchKVCache has no filter/extend (use batch_cache=host)"));
}

}  // namespace

Scenario parse_scenario(std::string_view raw, const std::string& where) {
  if (raw.size() > kMaxLineBytes) bad(where, cat("line of ", raw.size(), " bytes (at most ", kMaxLineBytes, ")"));
  Scenario s;
  s.line = std::string(trim(raw.substr(0, raw.find('#'))));
  std::set<std::string> seen;
  std::optional<int> second;
  bool batch_cache_given = false;
  std::size_t pos = 0;
  bool first = true;
  const std::string_view line = s.line;
  while (pos < line.size()) {
    const auto next = line.find_first_of(" \t", pos);
    const std::string_view word = line.substr(pos, next == std::string_view::npos ? line.size() - pos : next - pos);
    pos = next == std::string_view::npos ? line.size() : line.find_first_not_of(" \t", next);
    if (pos == std::string_view::npos) pos = line.size();
    if (first) {
      first = false;
      if (word.find('=') != std::string_view::npos) bad(where, cat("the line starts with '", word, "', not a name"));
      s.name = std::string(word);
      continue;
    }
    const auto eq = word.find('=');
    if (eq == std::string_view::npos) bad(where, cat("'", word, "' is not key=value"));
    const std::string key(word.substr(0, eq));
    const std::string_view value = word.substr(eq + 1);
    if (!seen.insert(key).second) bad(where, cat("key ", key, " given twice"));
    if (key == "prompts") {
      std::size_t p = 0;
      while (p <= value.size()) {
        const auto comma = value.find(',', p);
        const auto item = value.substr(p, comma == std::string_view::npos ? value.size() - p : comma - p);
        s.prompts.push_back(static_cast<int>(parse_int(item, key, 1, kMaxPromptLength, where)));
        if (s.prompts.size() > kMaxRequests) bad(where, cat("prompts= lists more than ", kMaxRequests, " requests"));
        if (comma == std::string_view::npos) break;
        p = comma + 1;
      }
    } else if (key == "steps") {
      s.steps = static_cast<int>(parse_int(value, key, 1, kMaxSteps, where));
    } else if (key == "seed") {
      s.seed = static_cast<std::uint64_t>(parse_int(value, key, 0, 1ll << 53, where));
    } else if (key == "kv_bits") {
      const int b = static_cast<int>(parse_int(value, key, 2, 8, where));
      if (b == 7) bad(where, "kv_bits=7 is not an affine width (2, 3, 4, 5, 6, 8)");
      s.kv_bits = b;
    } else if (key == "kv_group_size") {
      s.kv_group_size = static_cast<int>(parse_int(value, key, 32, 128, where));
      if (s.kv_group_size != 32 && s.kv_group_size != 64 && s.kv_group_size != 128)
        bad(where, cat("kv_group_size=", s.kv_group_size, " is not 32, 64 or 128"));
    } else if (key == "quantized_kv_start") {
      s.quantized_kv_start = static_cast<int>(parse_int(value, key, 0, 1 << 30, where));
    } else if (key == "max_kv_size") {
      s.max_kv_size = static_cast<int>(parse_int(value, key, 5, 1 << 20, where));  // > keep=4
    } else if (key == "finish") {
      const auto [r, k] = parse_at(value, key, kMaxRequests, kMaxSteps, where);
      s.finish = Scenario::Finish{static_cast<int>(r), static_cast<int>(k)};
    } else if (key == "join") {
      const auto [p, step] = parse_at(value, key, kMaxPromptLength, kMaxSteps, where);
      s.join = Scenario::Join{static_cast<int>(p), static_cast<int>(step)};
    } else if (key == "prefix") {
      s.prefix = Scenario::Prefix{static_cast<int>(parse_int(value, key, 1, kMaxPromptLength, where)), 0};
    } else if (key == "second") {
      second = static_cast<int>(parse_int(value, key, 1, kMaxPromptLength, where));
    } else if (key == "save_at") {
      s.save_at = static_cast<int>(parse_int(value, key, 0, kMaxSteps, where));
    } else if (key == "batch_cache") {
      if (value == "device") s.batch_cache = BatchCache::device;
      else if (value != "host") bad(where, cat("batch_cache='", value, "' is not host or device"));
      batch_cache_given = true;
    } else if (key == "max_dlogit") {
      s.tolerance.max_dlogit = parse_real(value, key, where);
    } else if (key == "max_mean_kld") {
      s.tolerance.max_mean_kld = parse_real(value, key, where);
    } else if (key == "min_top1") {
      s.tolerance.min_top1 = parse_real(value, key, where);
      if (s.tolerance.min_top1 > 1) bad(where, cat("min_top1=", value, " is above 1"));
    } else if (key == "attn_rel") {
      s.tolerance.attn_rel = parse_real(value, key, where);
    } else {
      bad(where, cat("unknown key '", key,
                     "' (keys: prompts steps seed kv_bits kv_group_size quantized_kv_start max_kv_size finish join "
                     "prefix second save_at batch_cache max_dlogit max_mean_kld min_top1 attn_rel)"));
    }
  }
  if (s.name.empty()) bad(where, "empty scenario line");
  if (s.prefix.has_value() != second.has_value()) bad(where, "prefix= and second= go together");
  if (s.prefix) s.prefix->fresh = *second;
  check_combination(s, where);
  // A key that could not act would be a silent default: the class choice needs a batch.
  if (batch_cache_given && !s.is_batch())
    bad(where, "batch_cache= applies to a batch (several prompts, finish, join); this line runs one request");
  return s;
}

std::vector<Scenario> read_scenarios(const std::filesystem::path& path) {
  require_regular_file(path, "scenario file");
  std::ifstream in(path);
  if (!in) fail(ErrorKind::io, cat("cannot open scenario file '", path.string(), "'"));
  std::vector<Scenario> out;
  std::set<std::string> names;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = cat(path.string(), ":", number);
    if (trim(std::string_view(line).substr(0, line.find('#'))).empty()) continue;
    Scenario s = parse_scenario(line, where);
    if (!names.insert(s.name).second) bad(where, cat("scenario '", s.name, "' defined twice"));
    if (out.size() == kMaxScenarios) bad(where, cat("more than ", kMaxScenarios, " scenarios"));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::int32_t> prompt_tokens(std::uint64_t seed, int prompt_index, int length, std::int64_t vocab) {
  KVLAB_REQUIRE(vocab > 0, invalid_argument, "vocab ", vocab, " must be positive");
  std::vector<std::int32_t> out(static_cast<std::size_t>(length));
  for (int j = 0; j < length; ++j) {
    const std::uint64_t key = seed * std::uint64_t{1000003} +
                              static_cast<std::uint64_t>(prompt_index) * std::uint64_t{10007} +
                              static_cast<std::uint64_t>(j);
    out[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(harness::splitmix64(key) % static_cast<std::uint64_t>(vocab));
  }
  return out;
}

}  // namespace kvlab::golden

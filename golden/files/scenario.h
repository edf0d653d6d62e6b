// Golden scenarios (golden/README.md "Scenarios"): one line each, `<name> key=value ...`,
// parsed strictly — an unknown key, a malformed or out-of-range value, or a combination
// the runner does not support is a kvlab::Error naming it, never a silent default.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::golden {

// The diff's limits for a scenario (README "Tolerance"). The defaults are sized for two
// runs of an f32 model: logits are sums of ~100 products of O(1) terms rounded to f32
// (relative error ~1e-6 each), so two correct engines agree to ~1e-5 in a logit and to
// ~1e-10 in KLD; 1e-3 / 1e-6 leave two orders of margin and still catch a cache bug, whose
// first wrong step moves logits by O(0.1). attn_rel only localizes (not a verdict).
struct Tolerance {
  double max_dlogit = 1e-3;
  double max_mean_kld = 1e-6;
  double min_top1 = 1.0;
  double attn_rel = 1e-4;
};

// Which class holds a batch's full-attention layers (README "Batch"): BatchKVCache, whose
// offsets live on the host, or DeviceBatchKVCache, whose offsets live in backend memory
// and are snapshotted and advanced there. Sliding layers stay BatchRotatingKVCache
// either way: it has no device-resident counterpart.
enum class BatchCache : std::uint8_t { host, device };

struct Scenario {
  std::string name;
  std::string line;                  // as written, without comment and outer blanks
  std::vector<int> prompts;          // lengths of the requests that start together
  int steps = 0;
  std::uint64_t seed = 1;
  std::optional<int> kv_bits;
  int kv_group_size = 64;
  int quantized_kv_start = 5000;
  std::optional<int> max_kv_size;
  struct Finish { int request = 0, after = 0; };
  std::optional<Finish> finish;      // request leaves after `after` generated tokens
  struct Join { int prompt = 0, after_step = 0; };
  std::optional<Join> join;          // a request of `prompt` tokens joins after this batch step
  struct Prefix { int shared = 0, fresh = 0; };
  std::optional<Prefix> prefix;      // second request: prompt 0's first `shared` + `fresh` new
  std::optional<int> save_at;
  BatchCache batch_cache = BatchCache::host;
  Tolerance tolerance;

  bool is_batch() const { return prompts.size() > 1 || finish || join; }
};

// One line; `where` prefixes every message ("golden/scenarios/llama_dense:3").
Scenario parse_scenario(std::string_view line, const std::string& where);
// Every scenario of a file, in order; names must be unique.
std::vector<Scenario> read_scenarios(const std::filesystem::path& path);

// Token j of prompt p (README "Prompt tokens").
std::vector<std::int32_t> prompt_tokens(std::uint64_t seed, int prompt_index, int length, std::int64_t vocab);

}  // namespace kvlab::golden

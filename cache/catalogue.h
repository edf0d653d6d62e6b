// The one list of cache kinds: for each, its name in problem lines, its state class name,
// what it is (traits), how to build an empty one and how to rebuild one from its state.
// The harness cache op, the property suite and the state-file loader all read it, so a
// new cache type is added here once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cache/cache.h"
#include "cache/turboquant_kv_cache.h"

namespace kvlab {

// In catalogue order: simplest first (the harness lists and shrinks kinds in this order).
enum class CacheKind : std::uint8_t {
  kv, rotating, quantized, chunked, batch_kv, batch_rotating, batch_quantized, turboquant, device_batch_kv
};

// The one setup of a cache: everything a kind's constructor may need (each kind reads its
// own fields), and what a command script (cache/cache_script.h) runs it with: the
// shape of its inputs, its attention and the padding rules of the rows it adds.
struct CacheSetup {
  CacheKind kind = CacheKind::kv;
  // ---- the constructor's
  std::vector<std::int32_t> left_padding{0};  // batch kinds: one entry per row
  std::int64_t max_size = 16, keep = 0;       // rotating kinds (the batch ring has no keep)
  std::int64_t chunk = 16;                    // chunked
  QuantSpec spec;                             // quantized kinds (and kind kv converted by a script)
  Rounding rounding = Rounding::mlx_cpu;
  double tq_bits = 4;  // turboquant: TurboQuantKVCache(tq_bits, seed, key, value bits, meaning)
  std::uint64_t seed = 0;
  std::optional<double> tq_key_bits, tq_value_bits;
  FractionalBits tq_meaning = FractionalBits::split_channels;
  // ---- a script's
  std::int64_t batch = 1, hq = 4, hkv = 2, dim = 64;  // rows, query and kv heads, head dim
  DType dtype = DType::f32;
  bool rope = true;
  int window = 0;
  bool quantizes = false;           // kind kv whose script converts it (`q`): packed from then on
  std::int64_t lpad = 0, rpad = 0;  // the largest padding the rules spread over the rows
};

struct CacheKindInfo {
  CacheKind kind;
  std::string_view name;        // in problem lines: "kv", "batch_rotating", ...
  std::string_view class_name;  // CacheState::class_name and Cache::class_name()
  bool batch;     // one sequence per row (the verbs of Cache::batch(), where the kind has them)
  bool packed;    // K/V stored as codes (content() parts are codes, not float rows)
  bool quantized; // written through update_quantized() (Cache::is_quantized())
  std::unique_ptr<Cache> (*make)(Backend&, const CacheSetup&);
  std::unique_ptr<Cache> (*from_state)(Backend&, const CacheState&);
  // Batch kinds with a merge: single caches of the row kind (KVCache, RotatingKVCache,
  // QuantizedKVCache) right-aligned into one batch; nullptr for the others.
  std::unique_ptr<Cache> (*merge)(Backend&, std::span<const Cache* const>);
};

const std::vector<CacheKindInfo>& cache_catalogue();  // in CacheKind order
const CacheKindInfo& cache_kind_info(CacheKind kind);
// By problem-line name or by class name; nullptr when unknown.
const CacheKindInfo* find_cache_kind(std::string_view name);
const CacheKindInfo* find_cache_class(std::string_view class_name);
// An empty cache of `kind`.
std::unique_ptr<Cache> make_cache(Backend& backend, CacheKind kind, const CacheSetup& setup);
// The batch of `kind` merged from `rows` (the kind's merge). Error{misuse} naming the kind
// when it has no merge, or a row that is not exactly the kind's single-sequence class.
std::unique_ptr<Cache> merge_caches(Backend& backend, CacheKind kind, std::span<const Cache* const> rows);

// The row of `cache`'s class (by its class name); nullptr for a class the catalogue
// does not list. The verbs only some kinds have are Cache's own virtuals (batch(),
// quantized_form(), maybe_trim_front()), so no driver needs the concrete class.
const CacheKindInfo* kind_of(const Cache& cache);
bool is_kind(const Cache& cache, CacheKind kind);

}  // namespace kvlab

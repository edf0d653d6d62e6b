#include "cache/catalogue.h"

#include <typeinfo>

#include "cache/batch_kv_cache.h"
#include "cache/batch_quantized_kv_cache.h"
#include "cache/batch_rotating_kv_cache.h"
#include "cache/chunked_kv_cache.h"
#include "cache/device_batch_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"

namespace kvlab {

namespace {

template <class T>
std::unique_ptr<Cache> restore(Backend& be, const CacheState& s) {
  return T::from_state(be, s);
}

std::unique_ptr<Cache> make_kv(Backend& be, const CacheSetup&) { return std::make_unique<KVCache>(be); }
std::unique_ptr<Cache> make_rotating(Backend& be, const CacheSetup& s) {
  return std::make_unique<RotatingKVCache>(be, s.max_size, s.keep);
}
std::unique_ptr<Cache> make_quantized(Backend& be, const CacheSetup& s) {
  return std::make_unique<QuantizedKVCache>(be, s.spec, s.rounding);
}
std::unique_ptr<Cache> make_chunked(Backend& be, const CacheSetup& s) {
  return std::make_unique<ChunkedKVCache>(be, s.chunk);
}
std::unique_ptr<Cache> make_batch_kv(Backend& be, const CacheSetup& s) {
  return std::make_unique<BatchKVCache>(be, s.left_padding);
}
std::unique_ptr<Cache> make_batch_rotating(Backend& be, const CacheSetup& s) {
  return std::make_unique<BatchRotatingKVCache>(be, s.max_size, s.left_padding);
}
std::unique_ptr<Cache> make_batch_quantized(Backend& be, const CacheSetup& s) {
  return std::make_unique<BatchQuantizedKVCache>(be, s.left_padding, s.spec, s.rounding);
}
std::unique_ptr<Cache> make_device_batch_kv(Backend& be, const CacheSetup& s) {
  return std::make_unique<DeviceBatchKVCache>(be, s.left_padding);
}
std::unique_ptr<Cache> make_turboquant(Backend& be, const CacheSetup& s) {
  return std::make_unique<TurboQuantKVCache>(be, s.tq_bits, s.seed, s.tq_key_bits, s.tq_value_bits, s.tq_meaning);
}

// `rows` as Single objects (exactly that class: a wrapper reporting its name is not one)
// for Batch::merge.
template <class Batch, class Single, CacheKind row>
std::unique_ptr<Cache> merge_as(Backend& be, std::span<const Cache* const> rows) {
  std::vector<const Single*> typed;
  for (const Cache* c : rows) {
    KVLAB_REQUIRE(c != nullptr, misuse, "merge of a null cache");
    KVLAB_REQUIRE(typeid(*c) == typeid(Single), misuse, "merge into a batch of ", cache_kind_info(row).class_name, " rows got a ",
                  c->class_name());
    typed.push_back(static_cast<const Single*>(c));
  }
  return Batch::merge(be, typed);
}

}  // namespace

const std::vector<CacheKindInfo>& cache_catalogue() {
  // name, class, batch, packed, quantized, make, from_state, merge
  static const std::vector<CacheKindInfo> table{
      {CacheKind::kv, "kv", "KVCache", false, false, false, make_kv, restore<KVCache>, nullptr},
      {CacheKind::rotating, "rotating", "RotatingKVCache", false, false, false, make_rotating,
       restore<RotatingKVCache>, nullptr},
      {CacheKind::quantized, "quantized", "QuantizedKVCache", false, true, true, make_quantized,
       restore<QuantizedKVCache>, nullptr},
      {CacheKind::chunked, "chunked", "ChunkedKVCache", false, false, false, make_chunked, restore<ChunkedKVCache>, nullptr},
      {CacheKind::batch_kv, "batch_kv", "BatchKVCache", true, false, false, make_batch_kv, restore<BatchKVCache>,
       merge_as<BatchKVCache, KVCache, CacheKind::kv>},
      {CacheKind::batch_rotating, "batch_rotating", "BatchRotatingKVCache", true, false, false, make_batch_rotating,
       restore<BatchRotatingKVCache>, merge_as<BatchRotatingKVCache, RotatingKVCache, CacheKind::rotating>},
      {CacheKind::batch_quantized, "batch_quantized", "BatchQuantizedKVCache", true, true, true,
       make_batch_quantized, restore<BatchQuantizedKVCache>, merge_as<BatchQuantizedKVCache, QuantizedKVCache, CacheKind::quantized>},
      {CacheKind::turboquant, "turboquant", "TurboQuantKVCache", false, true, false, make_turboquant,
       restore<TurboQuantKVCache>, nullptr},
      // Batch rows whose offsets live in backend memory; it has none of the batch verbs.
      {CacheKind::device_batch_kv, "device_batch_kv", "DeviceBatchKVCache", true, false, false,
       make_device_batch_kv, restore<DeviceBatchKVCache>, nullptr},
  };
  return table;
}

const CacheKindInfo& cache_kind_info(CacheKind kind) {
  const auto i = static_cast<std::size_t>(kind);
  KVLAB_REQUIRE(i < cache_catalogue().size(), internal, "cache kind ", i, " is not in the catalogue");
  return cache_catalogue()[i];
}

const CacheKindInfo* find_cache_kind(std::string_view name) {
  for (const CacheKindInfo& k : cache_catalogue())
    if (k.name == name) return &k;
  return nullptr;
}

const CacheKindInfo* find_cache_class(std::string_view class_name) {
  for (const CacheKindInfo& k : cache_catalogue())
    if (k.class_name == class_name) return &k;
  return nullptr;
}

std::unique_ptr<Cache> make_cache(Backend& backend, CacheKind kind, const CacheSetup& setup) {
  return cache_kind_info(kind).make(backend, setup);
}

std::unique_ptr<Cache> merge_caches(Backend& backend, CacheKind kind, std::span<const Cache* const> rows) {
  const CacheKindInfo& info = cache_kind_info(kind);
  KVLAB_REQUIRE(info.merge != nullptr, misuse, "a ", info.class_name, " has no merge");
  return info.merge(backend, rows);
}

const CacheKindInfo* kind_of(const Cache& cache) { return find_cache_class(cache.class_name()); }

bool is_kind(const Cache& cache, CacheKind kind) {
  const CacheKindInfo* k = kind_of(cache);
  return k != nullptr && k->kind == kind;
}

}  // namespace kvlab

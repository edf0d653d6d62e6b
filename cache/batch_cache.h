// The batch verbs every batch cache shares (docs/semantics.md §Batch cache,
// docs/lifecycle.md §Batch lifecycle): BatchKVCache, BatchQuantizedKVCache and
// BatchRotatingKVCache implement them, and `Cache::batch()` hands them out, so a driver
// holding a Cache& (the harness's scripts, the golden runner, the properties, a zoo
// wrapper) reaches them without knowing the class. Merge stays a static of each class:
// it builds a batch from single caches of one kind, before any batch cache exists.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <typeinfo>
#include <vector>

#include "cache/cache.h"
#include "kvlab/error.h"

namespace kvlab {

class BatchCache {
 public:
  virtual ~BatchCache() = default;

  virtual std::int64_t batch_size() const = 0;
  // mlx-lm's prepare(left_padding=, lengths=, right_padding=); an empty vector means "not
  // given". left_padding only while empty; a right padding is pending until finalize().
  // The caches without a ring ignore `lengths` (they need only the padding).
  virtual void prepare(const std::vector<std::int32_t>& left_padding, const std::vector<std::int32_t>& lengths,
                       const std::vector<std::int32_t>& right_padding) = 0;
  // Rolls the consumed right padding to the front of each row.
  virtual void finalize() = 0;
  // Keeps the given rows, in that order; each index once.
  virtual void filter(const std::vector<std::int32_t>& rows) = 0;
  // Appends other's rows after this cache's rows; other is not modified. `other` must be
  // a cache of the same class: anything else is Error{misuse} naming both classes.
  virtual void extend(const Cache& other) = 0;
  // Row i as the single-sequence cache of this kind (KVCache, QuantizedKVCache or
  // RotatingKVCache) holding its real tokens.
  virtual std::unique_ptr<Cache> extract_sequence(std::int64_t i) const = 0;

 protected:
  BatchCache() = default;
  BatchCache(const BatchCache&) = default;
  BatchCache& operator=(const BatchCache&) = default;
};

// A per-row list of BatchCache::prepare as the optional the layouts take (empty: none).
inline std::optional<std::vector<std::int32_t>> given_rows(const std::vector<std::int32_t>& rows) {
  if (rows.empty()) return std::nullopt;
  return rows;
}

// The batch verbs of `cache`; Error{misuse} naming its class and `verb` when it has none.
BatchCache& batch_verbs(Cache& cache, const char* verb);

// A chunk of `tokens` per row whose last right_padding[b] are padding: prepare with the
// real lengths tokens − right_padding[b] (the ring needs them) and that padding.
void prepare_right(BatchCache& batch, const std::vector<std::int32_t>& right_padding, std::int64_t tokens);

// `other` as a T, for T::extend. Only an object of exactly T's type qualifies: a wrapper
// that reports T's class name is not one (it would be reached through its own batch()).
template <class T>
const T& extend_operand(const T& self, const Cache& other) {
  KVLAB_REQUIRE(typeid(other) == typeid(T), misuse, "extend() of a ", self.class_name(), " with a ", other.class_name(),
                self.class_name() == other.class_name() ? " wrapper" : "");
  return static_cast<const T&>(other);
}

}  // namespace kvlab

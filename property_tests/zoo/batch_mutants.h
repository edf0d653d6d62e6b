// Batch-cache mutants of the bug zoo (see batch_mutants.cc and batch_lifecycle_mutants.cc).
// Test-only code: production has no fault-injection hooks, so each mutant re-creates its
// upstream bug from the public API, as the single-cache mutants do: a wrapper cache
// (BatchHooks::wrap) overriding the faulty member of a real batch cache, or a restore or
// merge (BatchHooks::restore / merge) that builds the state the buggy code would have
// left, mostly by rewriting a cache's state (CacheState).
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "cache/batch_cache.h"
#include "property_tests/properties.h"
#include "property_tests/zoo/mutants.h"

namespace kvlab::prop::zoo {

struct BatchMutant {
  std::string id;
  std::string upstream;
  BatchHooks batch;
};

// Every batch mutant: the seed bugs, attention and prefix-cache mutants (batch_mutants.cc)
// and the batch lifecycle mutants.
std::vector<BatchMutant> batch_mutants();
// The lifecycle mutants of BatchKVCache, BatchQuantizedKVCache and BatchRotatingKVCache
// (batch_lifecycle_mutants.cc).
std::vector<BatchMutant> batch_lifecycle_mutants();

// ---- wrappers of batch caches ---------------------------------------------------------------

// What every batch wrapper below is: the cache it forwards to (a real one, or another wrapper).
class WrappedBatch {
 public:
  virtual const Cache& wrapped() const = 0;

 protected:
  ~WrappedBatch() = default;
};

// The real cache under any number of batch wrappers.
inline const Cache& real_cache(const Cache& c) {
  const auto* w = dynamic_cast<const WrappedBatch*>(&c);
  return w == nullptr ? c : real_cache(w->wrapped());
}

// A batch cache that forwards everything, its batch verbs included, to the real batch
// cache it owns: a T (BatchKVCache, BatchRotatingKVCache, ...), or any batch cache for
// T = Cache. A mutant overrides the faulty member and may replace inner_ (rebuilt from a
// state, the way the buggy code left it). extend() hands the real cache under `other`
// (wrapped like this one, whose own extend would reject a wrapper) to the real extend.
template <class T>
class BatchForwardingCache : public BasicForwardingCache<std::unique_ptr<T>>, public BatchCache, public WrappedBatch {
 public:
  using Real = T;
  explicit BatchForwardingCache(std::unique_ptr<T> inner) : BasicForwardingCache<std::unique_ptr<T>>(std::move(inner)) {}
  const Cache& wrapped() const override { return *this->inner_; }
  BatchCache* batch() override { return this; }
  const BatchCache* batch() const override { return this; }
  std::int64_t batch_size() const override { return real_verbs().batch_size(); }
  void prepare(const std::vector<std::int32_t>& left, const std::vector<std::int32_t>& lengths,
               const std::vector<std::int32_t>& right) override {
    real_verbs().prepare(left, lengths, right);
  }
  void finalize() override { real_verbs().finalize(); }
  void filter(const std::vector<std::int32_t>& rows) override { real_verbs().filter(rows); }
  void extend(const Cache& other) override { real_verbs().extend(real_cache(other)); }
  std::unique_ptr<Cache> extract_sequence(std::int64_t i) const override { return real_verbs().extract_sequence(i); }

 protected:
  BatchCache& real_verbs() { return *this->inner_->batch(); }
  const BatchCache& real_verbs() const { return *this->inner_->batch(); }
  // `other` as the T a mutant's extend works on: the real cache under it, or (a cache of
  // another type, as a golden run may hand one) a T rebuilt from its state into `keep`,
  // which throws naming the class when it is not a T's.
  const T& real_operand(const Cache& other, std::unique_ptr<T>& keep) const {
    const Cache& real = real_cache(other);
    if (typeid(real) == typeid(T)) return static_cast<const T&>(real);
    keep = T::from_state(this->backend(), other.state());
    return *keep;
  }
};

// BatchHooks::wrap of a mutant W (a BatchForwardingCache<T>): a T goes behind a W (for
// T = Cache: any batch cache); any other cache comes back as it is.
template <class W>
std::unique_ptr<Cache> wrap_in(std::unique_ptr<Cache> cache) {
  using T = typename W::Real;
  const Cache& real = *cache;
  if constexpr (std::is_same_v<T, Cache>) {
    if (real.batch() == nullptr) return cache;
    return std::make_unique<W>(std::move(cache));
  } else {
    if (typeid(real) != typeid(T)) return cache;
    return std::make_unique<W>(std::unique_ptr<T>(static_cast<T*>(cache.release())));
  }
}

}  // namespace kvlab::prop::zoo

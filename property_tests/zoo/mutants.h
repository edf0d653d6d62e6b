// The bug zoo: mutants that reproduce real cache bugs as test-only code (production
// code carries no fault-injection hooks). Each mutant is a set of Hooks: a mutant
// attention step, a wrapper cache implementing the Cache interface around a real cache,
// a mutant restore / quantization policy / prefix-cache extract / RoPE kernel / state
// file loader.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "property_tests/prop_model.h"

namespace kvlab::prop::zoo {

struct Mutant {
  std::string id;        // short name in the kill matrix
  std::string upstream;  // the upstream bug it reproduces
  Hooks hooks;
  // Names of all_properties() entries the zoo runs first (the mechanism's own family),
  // so a mutant only one late property can see does not wait for every earlier one.
  std::vector<std::string> first;
};

// mutants.cc (a–h, t19), then attention_mutants().
std::vector<Mutant> all_mutants();
// attention_mutants.cc: offsets aliasing, KV-shared layers, quantized attention, RoPE,
// TurboQuant, restore, quantize policy, kv_length, state files, ChunkedKVCache.
std::vector<Mutant> attention_mutants();

// ---- shared by the mutant files ----------------------------------------------------------

Mutant mutant(std::string id, std::string upstream, std::vector<std::string> first = {});

// Forwards everything to a real cache reached through Handle (owning std::unique_ptr or
// a plain pointer); mutants override the faulty member.
template <class Handle>
class BasicForwardingCache : public Cache {
 public:
  explicit BasicForwardingCache(Handle inner) : Cache(inner->backend()), inner_(std::move(inner)) {}
  std::string_view class_name() const override { return inner_->class_name(); }
  bool is_quantized() const override { return inner_->is_quantized(); }
  FetchedKV update(const DTensor& k, const DTensor& v) override { return inner_->update(k, v); }
  FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v) override {
    return inner_->update_quantized(k, v);
  }
  std::int64_t kv_length() const override { return inner_->kv_length(); }
  std::vector<std::int32_t> offsets() const override { return inner_->offsets(); }
  CacheMask make_mask(std::int64_t n, int window) const override { return inner_->make_mask(n, window); }
  bool is_trimmable() const override { return inner_->is_trimmable(); }
  std::int64_t trim(std::int64_t n) override { return inner_->trim(n); }
  bool empty() const override { return inner_->empty(); }
  std::size_t nbytes() const override { return inner_->nbytes(); }
  CacheState state() const override { return inner_->state(); }
  // Observed through the serialized state, restored by the real catalogue: what a later
  // session would load is what the wrapper holds, whatever its mutated members do.
  std::vector<SequenceContent> content(ContentForm form) const override {
    return cache_from_state(backend(), state())->content(form);
  }
  std::vector<BackingBuffer> buffers() const override { return cache_from_state(backend(), state())->buffers(); }
  // The batch verbs and the parameters are the real cache's; a wrapper is no KVCache to
  // quantized_form() or maybe_trim_front() (see unwrap() below).
  BatchCache* batch() override { return inner_->batch(); }
  const BatchCache* batch() const override { return inner_->batch(); }
  std::string parameters() const override { return inner_->parameters(); }

 protected:
  Handle inner_;
};

// Owns the real cache.
class ForwardingCache : public BasicForwardingCache<std::unique_ptr<Cache>> {
 public:
  using BasicForwardingCache::BasicForwardingCache;
  const Cache& inner() const { return *inner_; }
  std::unique_ptr<Cache>& inner_slot() { return inner_; }
  std::unique_ptr<Cache> release() { return std::move(inner_); }
};

// For wrapper mutants whose fault is elsewhere: the quantization policy, extract and the
// chunked front trim see the real cache underneath (a wrapper is not a KVCache to
// maybe_quantize_kv_caches), so the kill comes from the mutated member and not from the
// wrapping itself.
std::unique_ptr<Cache> unwrap(std::unique_ptr<Cache> c);
std::vector<QuantizeDecision> unwrapping_policy(std::vector<std::unique_ptr<Cache>>& layers, const QuantSpec& spec,
                                                Rounding rounding, std::int64_t start);
std::unique_ptr<Cache> unwrapping_extract(Backend& be, const Cache& c);
void unwrapping_trim_front(std::unique_ptr<Cache>& c);

// Pieces of cache/attend.cc for mutant attention steps.
std::vector<std::int32_t> per_row(const std::vector<std::int32_t>& offsets, std::int64_t batch);
DTensor rope_at(Backend& be, const DTensor& x, const RopeParams& rope, const std::vector<std::int32_t>& positions);
// r.positions and r.position_offsets (the tensor attend_shared ropes at) both set to
// `positions`, as attend() leaves them.
void set_positions(Backend& be, AttendResult& r, const std::vector<std::int32_t>& positions);

}  // namespace kvlab::prop::zoo

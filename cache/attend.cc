#include "cache/attend.h"

namespace kvlab {

namespace {

// Per-row base positions for a batch of B rows; single-sequence caches report one
// offset shared by all rows.
std::vector<std::int32_t> per_row(const std::vector<std::int32_t>& offsets, std::int64_t batch) {
  if (static_cast<std::int64_t>(offsets.size()) == batch) return offsets;
  KVLAB_REQUIRE(offsets.size() == 1, shape_mismatch, "cache reports ", offsets.size(), " offsets for a batch of ",
                batch, " rows");
  return std::vector<std::int32_t>(static_cast<std::size_t>(batch), offsets[0]);
}

DTensor rope_at(Backend& be, const DTensor& x, const RopeParams& rope, const std::vector<std::int32_t>& positions) {
  if (rope.dims == 0) return x;
  DTensor offsets = be.allocate(DType::i32, {static_cast<std::int64_t>(positions.size())});
  be.upload(offsets, positions.data());
  DTensor out = be.allocate(x.dtype, x.shape);
  be.rope({x, rope, Offsets{0, offsets}, out});
  return out;
}

DTensor attention(Backend& be, const DTensor& q, const AttendResult& r, const AttendOptions& options) {
  AttentionParams params = options.attention;
  params.mask = r.mask.spec;
  std::optional<DTensor> mask_array;
  if (r.mask.array) mask_array = be.upload(*r.mask.array);
  const DTensor* mask_ptr = mask_array ? &*mask_array : nullptr;
  const DTensor* sinks = options.sinks ? &*options.sinks : nullptr;
  const std::int64_t dv = r.kv ? r.kv->values.shape.at(3)
                                : r.quantized_kv->values.spec.unpacked_dim(r.quantized_kv->values.wq.shape.at(3));
  DTensor out = be.allocate(q.dtype, {q.shape.at(0), q.shape.at(1), q.shape.at(2), dv});
  if (r.kv) be.sdpa({q, r.kv->keys, r.kv->values, params, mask_ptr, sinks, out});
  else be.quantized_sdpa({q, r.quantized_kv->keys, r.quantized_kv->values, params, mask_ptr, sinks, out});
  return out;
}

}  // namespace

AttendResult attend(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& options) {
  KVLAB_REQUIRE(q.shape.size() == 4 && k.shape.size() == 4, shape_mismatch, "attend needs rank-4 q and k, got q ",
                shape_str(q.shape), " and k ", shape_str(k.shape));
  KVLAB_REQUIRE(q.shape[2] == k.shape[2], shape_mismatch, "attend: q has ", q.shape[2], " tokens but k has ",
                k.shape[2]);
  Backend& be = cache.backend();
  AttendResult r;
  // 1. Positions are a copy taken now; nothing the update does can move them.
  r.positions = per_row(cache.offsets(), q.shape[0]);
  // 2. Q and K share the positions offset_b + t.
  const DTensor q_rot = rope_at(be, q, options.rope, r.positions);
  const DTensor k_rot = rope_at(be, k, options.rope, r.positions);
  // 3. The mask describes the keys the coming update will return.
  r.mask = cache.make_mask(q.shape[2], options.window);
  // 4. The update path the cache kind requires.
  if (cache.is_quantized()) r.quantized_kv = cache.update_quantized(k_rot, v);
  else r.kv = cache.update(k_rot, v);
  // 5. Attention over what the update returned.
  r.out = attention(be, q_rot, r, options);
  return r;
}

DTensor attend_shared(Backend& backend, const AttendResult& producer, const DTensor& q, const AttendOptions& options) {
  KVLAB_REQUIRE(producer.kv || producer.quantized_kv, misuse, "attend_shared needs a producer result holding K/V");
  KVLAB_REQUIRE(q.shape.size() == 4 && static_cast<std::int64_t>(producer.positions.size()) == q.shape[0],
                shape_mismatch, "attend_shared: q ", shape_str(q.shape), " does not match the producer's ",
                producer.positions.size(), " rows");
  const DTensor q_rot = rope_at(backend, q, options.rope, producer.positions);
  return attention(backend, q_rot, producer, options);
}

}  // namespace kvlab

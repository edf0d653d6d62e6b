#include "cache/attend.h"

namespace kvlab {

namespace {

// x roped with token t of row b at positions[b] + t (an i32 (B,) tensor on `be`).
DTensor rope_at(Backend& be, const DTensor& x, const RopeParams& rope, const DTensor& positions) {
  if (rope.dims == 0) return x;
  DTensor out = be.allocate(x.dtype, x.shape);
  be.rope({x, rope, Offsets{0, positions}, out});
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

// Everything the step's kernels would refuse after the update, checked before it: a
// step that fails leaves the cache as it was.
void check_step(const DTensor& q, const DTensor& k, const DTensor& v) {
  KVLAB_REQUIRE(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4, shape_mismatch,
                "attend needs rank-4 q, k and v, got q ", shape_str(q.shape), ", k ", shape_str(k.shape), " and v ",
                shape_str(v.shape));
  KVLAB_REQUIRE(is_float(q.dtype) && q.dtype == k.dtype && k.dtype == v.dtype, dtype_mismatch, "attend: q is ",
                dtype_name(q.dtype), ", k ", dtype_name(k.dtype), " and v ", dtype_name(v.dtype),
                ", expected one float dtype");
  KVLAB_REQUIRE(q.shape[2] == k.shape[2] && k.shape[2] == v.shape[2], shape_mismatch, "attend: q has ", q.shape[2],
                " tokens, k ", k.shape[2], " and v ", v.shape[2], " (q ", shape_str(q.shape), ", k ",
                shape_str(k.shape), ", v ", shape_str(v.shape), ")");
  KVLAB_REQUIRE(q.shape[0] == k.shape[0] && k.shape[0] == v.shape[0] && k.shape[1] == v.shape[1] &&
                    k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0 && q.shape[3] == k.shape[3],
                shape_mismatch, "attend: q ", shape_str(q.shape), ", k ", shape_str(k.shape), " and v ",
                shape_str(v.shape), " are not (B, Hq, L, Dk), (B, Hkv, L, Dk), (B, Hkv, L, Dv) with Hkv dividing Hq");
}

}  // namespace

AttendResult attend(Cache& cache, const DTensor& q, const DTensor& k, const DTensor& v, const AttendOptions& options) {
  check_step(q, k, v);
  Backend& be = cache.backend();
  AttendResult r;
  // 1. Positions are a copy taken now, where the cache keeps its offsets; nothing the
  //    update does can move them.
  r.position_offsets = cache.snapshot_positions(q.shape[0]);
  // 2. Q and K share the positions offset_b + t.
  const DTensor q_rot = rope_at(be, q, options.rope, r.position_offsets);
  const DTensor k_rot = rope_at(be, k, options.rope, r.position_offsets);
  // 3. The mask describes the keys the coming update will return.
  r.mask = cache.make_mask(q.shape[2], options.window);
  // 4. The update path the cache kind requires.
  if (cache.is_quantized()) r.quantized_kv = cache.update_quantized(k_rot, v);
  else r.kv = cache.update(k_rot, v);
  // 5. Attention over what the update returned.
  r.out = attention(be, q_rot, r, options);
  r.positions.resize(static_cast<std::size_t>(q.shape[0]));
  be.download(r.position_offsets, r.positions.data());
  return r;
}

DTensor attend_shared(Backend& backend, const AttendResult& producer, const DTensor& q, const AttendOptions& options) {
  KVLAB_REQUIRE(producer.kv || producer.quantized_kv, misuse, "attend_shared needs a producer result holding K/V");
  KVLAB_REQUIRE(producer.position_offsets.buffer != nullptr, misuse,
                "attend_shared needs the producer's position_offsets (the snapshot its RoPE read)");
  KVLAB_REQUIRE(q.shape.size() == 4 && producer.position_offsets.shape == Shape{q.shape[0]}, shape_mismatch,
                "attend_shared: q ", shape_str(q.shape), " does not match the producer's ",
                shape_str(producer.position_offsets.shape), " positions");
  const DTensor q_rot = rope_at(backend, q, options.rope, producer.position_offsets);
  return attention(backend, q_rot, producer, options);
}

}  // namespace kvlab

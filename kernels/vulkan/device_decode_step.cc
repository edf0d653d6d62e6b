// DeviceDecodeStep (device_decode_step.h): host checks first, then one batch of a copy
// and three dispatches (rope.comp, kv_append_advance.comp, rope.comp).
#include "kernels/vulkan/device_decode_step.h"

#include <limits>
#include <optional>
#include <utility>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/rope_setup.h"
#include "kvlab/error.h"
#include "reference/rope.h"

namespace kvlab {

namespace {

using Context = VulkanBackend::Context;

std::uint32_t u32(std::int64_t v) { return static_cast<std::uint32_t>(v); }  // bounded by a binding

// The push-constant block of shaders/kv_append_advance.comp.
struct AppendPush {
  std::uint32_t k_src_offset, v_src_offset, k_cache_offset, v_cache_offset, snapshot_offset, live_offset,
      pad_offset, wide, batch, heads, seq, k_dim, v_dim, capacity;
};

// RoPE of x (B, heads, S, D) into out at per-row positions offsets[b] + t; recorded into
// the open batch.
void record_rope(Context& c, const RopeParams& rope, DType dtype, const DTensor& x, const DTensor& out,
                 const DTensor& offsets, const DTensor& inv_freq) {
  const std::size_t es = dtype_size(dtype);
  const BoundTensor bx = c.bind(x, es), bo = c.bind(out, es), boff = c.bind(offsets, 4), btable = c.bind(inv_freq, 4);
  const std::int64_t batch = x.shape[0], heads = x.shape[1], seq = x.shape[2], dim = x.shape[3];
  const vulkan::RopePush push{bx.offset,        bo.offset,         boff.offset, static_cast<std::uint32_t>(dtype),
                      u32(batch),       u32(heads),        u32(seq),    u32(dim),
                      u32(rope.dims),   rope.traditional ? 1u : 0u,     1u,
                      0,                rope.scale};
  c.dispatch(vulkan::ShaderId::rope, {bx, bo, boff, btable}, &push, sizeof push,
             static_cast<std::uint64_t>(batch * seq * (rope.dims / 2)));
}

std::string dims_str(const DTensor& t) { return cat(shape_str(t.shape), " ", dtype_name(t.dtype)); }

}  // namespace

DeviceDecodeStep::DeviceDecodeStep(VulkanBackend& backend, DeviceDecodeStepOptions options)
    : backend_(backend), options_(std::move(options)), left_padding_(options_.left_padding) {
  Context& c = backend_.context();
  DeviceDecodeStepOptions& o = options_;
  if (o.v_dim == 0) o.v_dim = o.k_dim;
  const auto batch = static_cast<std::int64_t>(left_padding_.size());
  KVLAB_REQUIRE(batch >= 1, invalid_argument, "DeviceDecodeStep: left_padding must have one entry per row, got none");
  KVLAB_REQUIRE(o.kv_heads >= 1, invalid_argument, "DeviceDecodeStep: kv_heads ", o.kv_heads, " is not positive");
  KVLAB_REQUIRE(o.k_dim >= 1 && o.v_dim >= 1, invalid_argument, "DeviceDecodeStep: head dims k ", o.k_dim, ", v ",
                o.v_dim, " must be positive");
  KVLAB_REQUIRE(o.capacity >= 1 && o.capacity <= std::numeric_limits<std::int32_t>::max(), invalid_argument,
                "DeviceDecodeStep: capacity ", o.capacity, " is outside [1, 2^31 - 1] (offsets are int32)");
  for (std::size_t b = 0; b < left_padding_.size(); ++b) {
    KVLAB_REQUIRE(left_padding_[b] >= 0 && left_padding_[b] <= o.capacity, invalid_argument,
                  "DeviceDecodeStep: left_padding[", b, "] = ", left_padding_[b], " is outside [0, capacity ",
                  o.capacity, "]");
  }
  KVLAB_REQUIRE(o.dtype == DType::f32 || o.dtype == DType::f16 || o.dtype == DType::bf16, dtype_mismatch,
                "DeviceDecodeStep: dtype ", dtype_name(o.dtype), " is not f32, f16 or bf16");
  // The oracle's checks of the rope parameters against Dk, with its messages.
  const Tensor probe(o.dtype, {1, 1, 1, o.k_dim}), probe_out(o.dtype, {1, 1, 1, o.k_dim});
  ref::validate_rope(probe.view(), o.rope, 0, std::nullopt, probe_out.view());
  KVLAB_REQUIRE(c.device().enabled().float64, unsupported,
                "DeviceDecodeStep: rope needs shaderFloat64, which device '", c.device().info().name, "' lacks");

  k_cache_ = backend_.allocate(o.dtype, {batch, o.kv_heads, o.capacity, o.k_dim});
  v_cache_ = backend_.allocate(o.dtype, {batch, o.kv_heads, o.capacity, o.v_dim});
  const std::size_t es = dtype_size(o.dtype);
  (void)c.bind(k_cache_, es);  // Error(unsupported) now, not at the first step, if a cache is too big to bind
  (void)c.bind(v_cache_, es);
  live_ = backend_.allocate(DType::i32, {batch});
  snapshot_ = backend_.allocate(DType::i32, {batch});
  padding_ = backend_.allocate(DType::i32, {batch});
  std::vector<std::int32_t> start(left_padding_.size());
  for (std::size_t b = 0; b < start.size(); ++b) start[b] = -left_padding_[b];
  backend_.upload(live_, start.data());
  backend_.upload(padding_, left_padding_.data());
  // f64 inverse frequencies (rope_setup.h) as u32 pairs.
  const std::vector<double> inv = vulkan::rope_inverse_frequencies(o.rope);
  const int half = o.rope.dims / 2;
  inv_freq_ = backend_.allocate(DType::u32, {2 * static_cast<std::int64_t>(half)});
  backend_.upload(inv_freq_, inv.data());
}

void DeviceDecodeStep::check_inputs(const DTensor& q, const DTensor& k, const DTensor& v) const {
  Context& c = backend_.context();
  (void)c.view(q);  // this backend's buffers, ranges inside them
  (void)c.view(k);
  (void)c.view(v);
  const DeviceDecodeStepOptions& o = options_;
  for (const auto& [name, t] : {std::pair<const char*, const DTensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    KVLAB_REQUIRE(t->dtype == o.dtype, dtype_mismatch, "DeviceDecodeStep: ", name, " is ", dtype_name(t->dtype),
                  ", the store holds ", dtype_name(o.dtype));
    KVLAB_REQUIRE(t->shape.size() == 4, shape_mismatch, "DeviceDecodeStep: ", name, " ", shape_str(t->shape),
                  " is not (B, H, S, D)");
  }
  const std::int64_t batch = batch_size(), seq = k.shape[2];
  const Shape want_k{batch, o.kv_heads, seq, o.k_dim}, want_v{batch, o.kv_heads, seq, o.v_dim};
  KVLAB_REQUIRE(k.shape == want_k, shape_mismatch, "DeviceDecodeStep: k ", shape_str(k.shape), ", expected ",
                shape_str(want_k), " (B, H, S, Dk)");
  KVLAB_REQUIRE(v.shape == want_v, shape_mismatch, "DeviceDecodeStep: v ", shape_str(v.shape), ", expected ",
                shape_str(want_v), " (B, H, S, Dv) with the S of k");
  KVLAB_REQUIRE(q.shape[0] == batch && q.shape[1] >= 1 && q.shape[2] == seq && q.shape[3] == o.k_dim,
                shape_mismatch, "DeviceDecodeStep: q ", shape_str(q.shape), ", expected (", batch, ", Hq, ", seq,
                ", ", o.k_dim, ") (B, Hq, S of k, Dk)");
  KVLAB_REQUIRE(seq >= 1, invalid_argument, "DeviceDecodeStep: chunk length S = ", seq, " (k ", dims_str(k),
                ") must be positive");
  KVLAB_REQUIRE(idx_ + seq <= o.capacity, invalid_argument, "DeviceDecodeStep: appending S = ", seq,
                " tokens at column ", idx_, " overflows the capacity of ", o.capacity, " columns");
}

DTensor DeviceDecodeStep::step(const DTensor& q, const DTensor& k, const DTensor& v) {
  check_inputs(q, k, v);
  Context& c = backend_.context();
  const DeviceDecodeStepOptions& o = options_;
  const DTensor k_rot = backend_.allocate(o.dtype, k.shape);
  const DTensor q_rot = backend_.allocate(o.dtype, q.shape);
  const std::size_t es = dtype_size(o.dtype);
  const BoundTensor bk = c.bind(k_rot, es), bv = c.bind(v, es), bkc = c.bind(k_cache_, es),
                    bvc = c.bind(v_cache_, es), bsnap = c.bind(snapshot_, 4), blive = c.bind(live_, 4),
                    bpad = c.bind(padding_, 4);
  const std::int64_t batch = batch_size(), heads = o.kv_heads, seq = k.shape[2];
  const AppendPush append{bk.offset,   bv.offset,   bkc.offset, bvc.offset, bsnap.offset,
                          blive.offset, bpad.offset, o.dtype == DType::f32 ? 1u : 0u,
                          u32(batch),   u32(heads),  u32(seq),   u32(o.k_dim), u32(o.v_dim), u32(o.capacity)};

  Context::Batch recording(c);
  c.copy(live_, snapshot_);                                          // (a)
  record_rope(c, o.rope, o.dtype, k, k_rot, snapshot_, inv_freq_);   // (b)
  c.dispatch(vulkan::ShaderId::kv_append_advance, {bk, bv, bkc, bvc, bsnap, blive, bpad}, &append,
             sizeof append, static_cast<std::uint64_t>(batch * heads * seq * (o.k_dim + o.v_dim)));  // (c)
  // (d) Q after the append: the snapshot holds the pre-append offsets; the live buffer
  // is already S ahead (the upstream bug, kept reachable for the bug zoo only).
  record_rope(c, o.rope, o.dtype, q, q_rot, o.rope_q_reads_live_offsets ? live_ : snapshot_, inv_freq_);
  recording.submit();
  idx_ += seq;
  return q_rot;
}

std::vector<std::int32_t> DeviceDecodeStep::offsets() const {
  std::vector<std::int32_t> out(left_padding_.size());
  backend_.download(live_, out.data());
  return out;
}

Tensor DeviceDecodeStep::columns(const DTensor& cache) const { return backend_.download(cache).slice(2, 0, idx_); }

Tensor DeviceDecodeStep::keys() const { return columns(k_cache_); }
Tensor DeviceDecodeStep::values() const { return columns(v_cache_); }

}  // namespace kvlab

// A Vulkan-only batch KV store whose per-row offsets live on the device (issue 5, "device
// caches and the offset snapshot"; spec §5, the offset-aliasing hazard).
//
// B rows share one column cursor (like BatchKVCache: right-aligned, per-row left padding),
// in caches (B, H, capacity, D) and an int32 (B,) buffer of live offsets, all device
// memory. step(q, k, v) records ONE command buffer and waits for it once:
//   (a) copy live -> snapshot (vkCmdCopyBuffer), barrier;
//   (b) RoPE K at positions snapshot[b] + t (shaders/rope.comp, offsets from the snapshot);
//   (c) the append kernel (shaders/kv_append_advance.comp) writes the roped K rows and the
//       V rows at columns snapshot[b] + left_padding[b] + t and sets live[b] = snapshot[b] + S;
//   (d) RoPE Q at positions snapshot[b] + t: Q is roped after the append, as an engine
//       that attends after updating the cache does, so reading the live buffer here would
//       give positions S too far (mlx-lm#1097 / #1806, vlm#966).
// The kernels read offsets only from the device; the host mirrors them only to check
// capacity and shapes before anything is recorded (kvlab::Error naming the values, the
// device state untouched).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/ops.h"
#include "kvlab/tensor.h"

namespace kvlab {

struct DeviceDecodeStepOptions {
  // One entry >= 0 per row (B = its size, >= 1); row b's offset starts at −left_padding[b]
  // (its padding tokens get negative positions, as in BatchKVCache).
  std::vector<std::int32_t> left_padding;
  std::int64_t kv_heads = 1;     // H of k and v
  std::int64_t k_dim = 0;        // Dk (q and k)
  std::int64_t v_dim = 0;        // Dv; 0 means Dk
  std::int64_t capacity = 0;     // columns per row, padding included
  DType dtype = DType::f16;      // of q, k, v and the caches: f32, f16 or bf16
  RopeParams rope;               // for both Q and K (rope.dims >= 2: reference/rope.h)
  // Exists only for the bug zoo (property_tests/zoo/vulkan_mutants.cc): step (d) reads
  // the live offsets, already advanced by the append, instead of the snapshot.
  bool rope_q_reads_live_offsets = false;
};

class DeviceDecodeStep {
 public:
  // Throws Error(invalid_argument) naming a bad option, Error(unsupported) when the
  // device lacks shaderFloat64 (rope.comp).
  DeviceDecodeStep(VulkanBackend& backend, DeviceDecodeStepOptions options);

  // q (B, Hq, S, Dk), k (B, H, S, Dk), v (B, H, S, Dv): the step's dtype, in `backend`'s
  // buffers, S >= 1, any Hq >= 1. Returns Q roped at the pre-append positions, a fresh
  // (B, Hq, S, Dk) tensor. Errors (shape_mismatch, dtype_mismatch, invalid_argument naming
  // the values; rope's own checks, reference/rope.h) are raised before anything is
  // recorded, so a failed step leaves the store unchanged.
  DTensor step(const DTensor& q, const DTensor& k, const DTensor& v);

  std::int64_t batch_size() const { return static_cast<std::int64_t>(left_padding_.size()); }
  std::int64_t idx() const { return idx_; }  // columns written so far (shared by every row)
  std::int64_t capacity() const { return options_.capacity; }
  const std::vector<std::int32_t>& left_padding() const { return left_padding_; }
  // The live offsets, downloaded from the device buffer.
  std::vector<std::int32_t> offsets() const;
  // Columns [0, idx) of the caches, (B, H, idx, Dk) and (B, H, idx, Dv): what
  // BatchKVCache::fetch() returns (row b's real tokens are its columns >= left_padding[b]).
  Tensor keys() const;
  Tensor values() const;

 private:
  void check_inputs(const DTensor& q, const DTensor& k, const DTensor& v) const;
  Tensor columns(const DTensor& cache) const;

  VulkanBackend& backend_;
  DeviceDecodeStepOptions options_;
  std::vector<std::int32_t> left_padding_;
  std::int64_t idx_ = 0;  // host mirror: every row's offset is idx_ − left_padding[b]
  DTensor k_cache_, v_cache_, live_, snapshot_, padding_, inv_freq_;
};

}  // namespace kvlab

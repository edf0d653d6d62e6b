#include "kernels/mlx/mlx_backend.h"

#include <mlx/mlx.h>

#include "kernels/mlx/mlx_ops.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab {

namespace {

// Overrides only the ops MLX has an equivalent for; TurboQuant (not in MLX) stays
// UNIMPLEMENTED through Backend's default.
class MlxBackend final : public HostMemoryBackend {
 public:
  std::string name() const override { return "mlx"; }
  // MLX's fast sdpa accumulates in f32, so the backend declares f32 and is held to the
  // attention precision ceiling; its quantized attention's P·V (CPU quantized_matmul)
  // accumulates in T, and harness/known/mlx registers that (D6) instead of relaxing sdpa.
  DType accumulation() const override { return DType::f32; }

  void quantize(const QuantizeArgs& a) override { mlxk::quantize(a); }
  void dequantize(const DequantizeArgs& a) override { mlxk::dequantize(a); }
  void rope(const RopeArgs& a) override { mlxk::rope(a); }
  void sdpa(const SdpaArgs& a) override { mlxk::sdpa(a); }
  void quantized_sdpa(const QuantizedSdpaArgs& a) override { mlxk::quantized_sdpa(a); }
  void kv_scatter(const KvScatterArgs& a) override { mlxk::kv_scatter(a); }
  void kv_gather(const KvGatherArgs& a) override { mlxk::kv_gather(a); }
  void kv_copy_blocks(const KvCopyBlocksArgs& a) override { mlxk::kv_copy_blocks(a); }
  void kv_roll(const KvRollArgs& a) override { mlxk::kv_roll(a); }
  void kv_append_advance(const KvAppendAdvanceArgs& a) override { mlxk::kv_append_advance(a); }
  void kv_snapshot(const KvSnapshotArgs& a) override { mlxk::kv_snapshot(a); }
};

}  // namespace

std::string mlx_version() { return mlx::core::version(); }

std::unique_ptr<Backend> make_mlx_backend(std::string_view variant) {
  KVLAB_REQUIRE(variant.empty(), invalid_argument, "backend 'mlx' has no variant '", variant, "'");
  return std::make_unique<MlxBackend>();
}

}  // namespace kvlab

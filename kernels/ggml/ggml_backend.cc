#include "kernels/ggml/ggml_backend.h"

#include "kernels/ggml/ggml_ops.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab {

namespace {

// Overrides only the ops ggml has an equivalent for: its block formats' quantize and
// dequantize, RoPE (f32/f16) and attention over f32/f16/bf16 or block K/V. Not thread-safe (one
// threadpool; the declared arithmetic is that of the last attention call).
class GgmlBackend final : public HostMemoryBackend {
 public:
  explicit GgmlBackend(bool static_kv) : static_kv_(static_kv) {}
  std::string name() const override { return "ggml"; }
  // ggml's CPU flash attention picks its arithmetic by K/V type and query count
  // (kernels/ggml/attention.h): an f16 P·V accumulator on its one-row path over f16 V, f32
  // otherwise; q quantized to 8 bits for a block K. The declaration is that of the last
  // attention call, which the harness reads right after the call it judges.
  DType accumulation() const override { return last_.accumulation; }
  AttentionRounding attention_rounding() const override { return last_.rounding; }

  void quantize(const QuantizeArgs& a) override { ggmlk::quantize(a); }
  void dequantize(const DequantizeArgs& a) override { ggmlk::dequantize(a); }
  void rope(const RopeArgs& a) override { ggmlk::rope(engine_, a); }
  void kv_scatter(const KvScatterArgs& a) override { ggmlk::kv_scatter(engine_, a); }
  void kv_gather(const KvGatherArgs& a) override { ggmlk::kv_gather(engine_, a); }
  void kv_cast(const KvCastArgs& a) override { ggmlk::kv_cast(engine_, a); }
  void sdpa(const SdpaArgs& a) override {
    last_ = {};
    last_ = ggmlk::sdpa(engine_, a);
  }
  void quantized_sdpa(const QuantizedSdpaArgs& a) override {
    last_ = {};
    last_ = ggmlk::quantized_sdpa(engine_, a, static_kv_ ? &kept_ : nullptr);
  }

 private:
  bool static_kv_;
  ggmlk::Engine engine_;
  ggmlk::StaticKv kept_;
  ggmlk::Arithmetic last_;
};

}  // namespace

std::string ggml_engine_version() { return cat("ggml ", KVLAB_GGML_VERSION, " (llama-cpp-python 0.3.36 sdist)"); }

std::unique_ptr<Backend> make_ggml_backend(std::string_view variant) {
  KVLAB_REQUIRE(variant.empty() || variant == "static_kv", invalid_argument, "backend 'ggml' has no variant '",
                variant, "' (known: static_kv)");
  return std::make_unique<GgmlBackend>(variant == "static_kv");
}

}  // namespace kvlab

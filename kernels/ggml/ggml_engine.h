// Internal to kernels/ggml: what every op needs of ggml — a context for one call's graph
// (tensors over memory kvlab owns) and the threadpool that computes it.
#pragma once

#include <ggml-cpu.h>
#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvlab/dtype.h"

namespace kvlab::ggmlk {

// ggml's threads for one backend: KVLAB_THREADS when set to a positive integer, else every
// core (std::thread::hardware_concurrency), as kvlab's SIMD pool counts them. The
// threadpool does not poll between graphs (poll 0): its idle workers sleep instead of
// spinning on the cores the next benchmark or baseline runs on.
class Engine {
 public:
  Engine();
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  int threads() const { return threads_; }
  // Computes the graph ending in `result` (built in `ctx`) on the threadpool. Throws
  // Error(device) naming `what` when ggml reports a failure.
  void compute(ggml_context* ctx, ggml_tensor* result, const char* what);

 private:
  int threads_ = 1;
  ggml_threadpool* pool_ = nullptr;
  std::vector<std::uint8_t> work_;
};

// A ggml context that holds tensor and graph metadata only (no_alloc): every tensor's
// data points into memory kvlab owns (the operands, or scratch vectors of the call).
class Context {
 public:
  explicit Context(std::size_t max_tensors);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ggml_context* get() const { return ctx_; }
  // A tensor of ggml's dense layout over `data` (ne innermost first, as ggml counts).
  ggml_tensor* tensor(ggml_type type, std::int64_t ne0, std::int64_t ne1, std::int64_t ne2, std::int64_t ne3,
                      const void* data);

 private:
  ggml_context* ctx_ = nullptr;
};

// The ggml type of a kvlab float dtype (f32, f16, bf16); Error(unsupported) otherwise.
ggml_type float_type(DType t);

}  // namespace kvlab::ggmlk

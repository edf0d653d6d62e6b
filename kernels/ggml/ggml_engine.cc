#include "kernels/ggml/ggml_engine.h"

#include <cstdlib>
#include <string>
#include <thread>

#include "kvlab/error.h"

namespace kvlab::ggmlk {

namespace {

int thread_count() {
  if (const char* env = std::getenv("KVLAB_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= GGML_MAX_N_THREADS) return static_cast<int>(n);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, GGML_MAX_N_THREADS));
}

}  // namespace

Engine::Engine() : threads_(thread_count()) {
  ggml_cpu_init();  // ggml's f16 tables and CPU feature probe; idempotent
  ggml_threadpool_params p = ggml_threadpool_params_default(threads_);
  p.poll = 0;
  pool_ = ggml_threadpool_new(&p);
  KVLAB_REQUIRE(pool_ != nullptr, device, "ggml: ggml_threadpool_new failed for ", threads_, " threads");
}

Engine::~Engine() { ggml_threadpool_free(pool_); }

void Engine::compute(ggml_context* ctx, ggml_tensor* result, const char* what) {
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, result);
  ggml_cplan plan = ggml_graph_plan(graph, threads_, pool_);
  if (work_.size() < plan.work_size) work_.resize(plan.work_size);
  plan.work_data = work_.data();
  const ggml_status status = ggml_graph_compute(graph, &plan);
  KVLAB_REQUIRE(status == GGML_STATUS_SUCCESS, device, "ggml: ", what, ": ggml_graph_compute returned ",
                ggml_status_to_string(status));
}

Context::Context(std::size_t max_tensors) {
  ggml_init_params p{};
  p.mem_size = (max_tensors + 2) * ggml_tensor_overhead() + ggml_graph_overhead() + 1024;
  p.mem_buffer = nullptr;
  p.no_alloc = true;
  ctx_ = ggml_init(p);
  KVLAB_REQUIRE(ctx_ != nullptr, device, "ggml: ggml_init failed");
}

Context::~Context() { ggml_free(ctx_); }

ggml_tensor* Context::tensor(ggml_type type, std::int64_t ne0, std::int64_t ne1, std::int64_t ne2, std::int64_t ne3,
                             const void* data) {
  ggml_tensor* t = ggml_new_tensor_4d(ctx_, type, ne0, ne1, ne2, ne3);
  t->data = const_cast<void*>(data);  // ggml's tensors are not const-qualified; inputs are only read
  return t;
}

ggml_type float_type(DType t) {
  switch (t) {
    case DType::f32: return GGML_TYPE_F32;
    case DType::f16: return GGML_TYPE_F16;
    case DType::bf16: return GGML_TYPE_BF16;
    default: break;
  }
  fail(ErrorKind::unsupported, cat("ggml: no float type for dtype ", dtype_name(t)));
}

}  // namespace kvlab::ggmlk

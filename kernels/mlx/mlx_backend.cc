#include "kernels/mlx/mlx_backend.h"

#include <mlx/mlx.h>

#include "kvlab/error.h"
#include "kvlab/host_buffer.h"

namespace kvlab {

namespace {

class MlxBackend final : public HostMemoryBackend {
 public:
  std::string name() const override { return "mlx"; }
};

}  // namespace

std::string mlx_version() { return mlx::core::version(); }

std::unique_ptr<Backend> make_mlx_backend(std::string_view variant) {
  KVLAB_REQUIRE(variant.empty(), invalid_argument, "backend 'mlx' has no variant '", variant, "'");
  return std::make_unique<MlxBackend>();
}

}  // namespace kvlab

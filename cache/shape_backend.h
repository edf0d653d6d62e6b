// A backend that keeps shapes, not data: a cache restored on it from a state
// (cache_from_state) has exactly the bookkeeping (offsets, lengths, padding, ring cursor)
// and passes exactly the state checks of one restored on a real backend, without
// holding its K/V. `kvlab cache inspect` and `convert` validate and describe cache files
// of tens of GB this way, reading only headers and scalars (docs/large-files.md).
//
// Buffers up to kSmallBytes hold real bytes (per-row offsets and padding, which some
// caches keep in backend tensors and read back); larger ones hold none: uploads to them
// are dropped, downloads read zeros. Every kernel is a no-op: nothing computed on this
// backend is meaningful beyond the host-side bookkeeping of the caches over it.
#pragma once

#include <cstddef>
#include <string>

#include "kvlab/backend.h"

namespace kvlab {

class ShapeBackend final : public Backend {
 public:
  static constexpr std::size_t kSmallBytes = std::size_t{64} << 10;

  std::string name() const override { return "shape-only"; }
  using Backend::allocate;
  using Backend::download;
  using Backend::upload;
  BufferPtr allocate(std::size_t bytes) override;
  void upload(const DTensor& dst, const void* src) override;
  void download(const DTensor& src, void* dst) override;
  void fill(const DTensor& dst, std::uint32_t element_bits) override;
  void upload_deferred(const DTensor& dst, const Tensor& src) override;
  KVLAB_OVERRIDE_ALL_OPS
};

}  // namespace kvlab

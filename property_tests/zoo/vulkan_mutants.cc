// v1.rope-q-reads-live-offsets: DeviceBatchKVCache's attention step over a Backend
// wrapper whose RoPE, once an append has advanced the offsets, reads those live offsets
// instead of the snapshot it was handed. attend() ropes the producer's Q and K before the
// append, so the fault bites where a step reads positions after it: the KV-shared layer,
// whose queries are roped at the producer's snapshot (attend_shared), land S positions too
// far — the device form of the offset alias of mlx-lm#1097 / #1384 / #1806 and vlm#966
// (docs/lifecycle.md §Offset snapshot, docs/upstream-bugs.md rows 1, 2, 4, 5). The cache is
// production code, unchanged; the fault is all in the wrapper, which forwards every other
// call to the Vulkan backend.
// Killer: the device-step property (property_tests/device_step.h): the device cache on the
// wrapper against BatchKVCache on the wrapped backend, bit for bit.
#include "property_tests/zoo/vulkan_mutants.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "kernels/vulkan/runtime/instance.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "property_tests/device_step.h"
#include "property_tests/properties.h"

namespace kvlab::prop::zoo {

namespace {

// One backend (validation layer on where installed, every message a test failure) for
// every case of the run, created when the zoo reaches the mutant.
struct SharedDevice {
  std::unique_ptr<VulkanBackend> backend;
  std::string reason;
};

// Forwards memory and every op to `inner`; remembers the offsets tensor the last append
// advanced (forgotten at the next snapshot) and hands it to any per-row RoPE in between.
class LiveOffsetsRope final : public Backend {
 public:
  explicit LiveOffsetsRope(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name() + " [rope reads live offsets]"; }
  using Backend::allocate;
  using Backend::download;
  using Backend::upload;
  BufferPtr allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
  void upload(const DTensor& dst, const void* src) override { inner_.upload(dst, src); }
  void download(const DTensor& src, void* dst) override { inner_.download(src, dst); }
  void fill(const DTensor& dst, std::uint32_t bits) override { inner_.fill(dst, bits); }
  void finish() override { inner_.finish(); }

#define KVLAB_ZOO_FORWARD(op, Args, stem) \
  void op(const Args& a) override {       \
    before(a);                            \
    forward(a, [&](const Args& b) { inner_.op(b); }); \
  }
  KVLAB_OPS(KVLAB_ZOO_FORWARD)
#undef KVLAB_ZOO_FORWARD

 private:
  template <class Args>
  void before(const Args&) {}
  void before(const KvSnapshotArgs&) { advanced_.reset(); }
  void before(const KvAppendAdvanceArgs& a) { advanced_ = a.offsets; }

  template <class Args, class F>
  void forward(const Args& a, F run) {
    run(a);
  }
  template <class F>
  void forward(const RopeArgs& a, F run) {
    if (!a.offsets.per_row || !advanced_) return run(a);
    const Offsets live{a.offsets.scalar, *advanced_};
    run(RopeArgs{a.x, a.params, live, a.out});
  }

  Backend& inner_;
  std::optional<DTensor> advanced_;
};

// The device with the validation layer on where installed (every message a test
// failure), or the reason there is none.
void open_device(SharedDevice& device) {
  VulkanOptions o;
  o.validation = vk::Instance::validation_layer_available();
  o.on_validation_message = [](const std::string& m) { ADD_FAILURE() << "Vulkan validation layer: " << m; };
  try {
    device.backend = std::make_unique<VulkanBackend>(o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    device.reason = e.what();
  }
}

}  // namespace

std::vector<DeviceMutant> device_mutants() {
  auto device = std::make_shared<SharedDevice>();
  DeviceMutant live;
  live.id = "v1.rope-q-reads-live-offsets";
  live.upstream = "mlx-lm#1097 / #1384 / #1806, vlm#966 (device offsets)";
  live.unavailable = [device] {
    if (!device->backend && device->reason.empty()) open_device(*device);
    return device->backend ? std::string() : "no usable Vulkan device: " + device->reason;
  };
  live.properties.emplace_back("V1.DeviceStepMatchesBatchKVCache", [device] {
    prop::DeviceStepOptions options;
    options.on_failure = [](const std::vector<std::int64_t>& chunks) { record_case(chunks); };
    LiveOffsetsRope mutant(*device->backend);
    prop::device_step_matches_batch_cache(mutant, *device->backend, options);
  });
  return {live};
}

}  // namespace kvlab::prop::zoo

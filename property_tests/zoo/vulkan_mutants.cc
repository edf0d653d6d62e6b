// v1.rope-q-reads-live-offsets: DeviceBatchKVCache's attention step over a Backend
// wrapper whose RoPE, once an append has advanced the offsets, reads those live offsets
// instead of the snapshot it was handed — queries roped S positions too far, the device
// form of the offset alias of mlx-lm#1097 / #1806 and vlm#966 (docs/lifecycle.md §Offset snapshot,
// docs/upstream-bugs.md rows 1, 4, 5). The cache is production code, unchanged; the fault is all in
// the wrapper, which forwards every other call to the Vulkan backend.
// Killer: the device-step property (tests/vulkan/device_step_property.h) comparing the
// step with BatchKVCache over the reference and host RoPE at the pre-update offsets.
#include "property_tests/zoo/vulkan_mutants.h"

#include <memory>
#include <optional>

#include "property_tests/properties.h"
#include "tests/vulkan/device_step_property.h"
#include "tests/vulkan/vulkan_test_util.h"

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

}  // namespace

std::vector<DeviceMutant> device_mutants() {
  auto device = std::make_shared<SharedDevice>();
  DeviceMutant live;
  live.id = "v1.rope-q-reads-live-offsets";
  live.upstream = "mlx-lm#1097 / #1806, vlm#966 (device offsets)";
  live.unavailable = [device] {
    if (!device->backend) device->backend = testing::try_vulkan(VulkanOptions{}, device->reason);
    return device->backend ? std::string() : "no usable Vulkan device: " + device->reason;
  };
  live.properties.emplace_back("V1.DeviceStepMatchesReference", [device] {
    testing::DeviceStepPropertyOptions options;
    options.on_failure = [](const std::vector<std::int64_t>& chunks) { record_case(chunks); };
    LiveOffsetsRope mutant(*device->backend);
    testing::device_step_matches_reference(mutant, options);
  });
  return {live};
}

}  // namespace kvlab::prop::zoo

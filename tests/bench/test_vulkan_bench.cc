// The Vulkan rows of kvlab_bench: backend names, the copy size rule (hand-derived
// cases), the device buffer copy (it copies what it was filled with, validation-clean),
// the device clock, and verify-before-timing on the Vulkan backend (an unimplemented
// kernel is a skip, a missing device is a skip with the reason). Tests that need a device
// skip with the reason when there is none. The whole suite with its Vulkan rows runs as
// the bench.smoke test (run_suite_main may run once per process: benchmark::Shutdown()
// leaves Google Benchmark's context map dangling, and the next AddCustomContext crashes).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "bench/timed_case.h"
#include "bench/vulkan_baseline.h"
#include "bench/vulkan_bench.h"
#include "harness/problem.h"
#include "kernels/vulkan/context.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab::bench {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST(VulkanBenchNames, VulkanBackendsAndTheirDeviceKeys) {
  EXPECT_TRUE(is_vulkan_backend("vulkan"));
  EXPECT_TRUE(is_vulkan_backend("vulkan:1,words"));
  EXPECT_FALSE(is_vulkan_backend("vulkanx"));
  EXPECT_FALSE(is_vulkan_backend("simd:AVX3"));
  EXPECT_EQ(vulkan_device_key("vulkan"), "vulkan");
  EXPECT_EQ(vulkan_device_key("vulkan:,staging"), "vulkan");
  EXPECT_EQ(vulkan_device_key("vulkan:1,words,staging"), "vulkan:1");
  EXPECT_EQ(vulkan_device_key("vulkan:llvmpipe"), "vulkan:llvmpipe");
}

TEST(VulkanCopySize, TheAskedSizeUnlessALimitIsLower) {
  // No limits: 256 MiB as asked.
  CopySize s = choose_copy_bytes(256 * kMiB, {});
  EXPECT_EQ(s.bytes, 256 * kMiB);
  EXPECT_EQ(s.limited_by, "");
  // A 100 MiB + 3 B allocation limit: whole MiB below it, 100 MiB.
  s = choose_copy_bytes(256 * kMiB, {.max_allocation = 100 * kMiB + 3, .device_heap = 0});
  EXPECT_EQ(s.bytes, 100 * kMiB);
  EXPECT_NE(s.limited_by.find("maxMemoryAllocationSize"), std::string::npos) << s.limited_by;
  // A 512 MiB heap: a quarter each, 128 MiB (two buffers then take half of it).
  s = choose_copy_bytes(256 * kMiB, {.max_allocation = 1024 * kMiB, .device_heap = 512 * kMiB});
  EXPECT_EQ(s.bytes, 128 * kMiB);
  EXPECT_NE(s.limited_by.find("heap"), std::string::npos) << s.limited_by;
  // 3 MiB + 5 B asked, no limit: rounded down to 3 MiB.
  EXPECT_EQ(choose_copy_bytes(3 * kMiB + 5, {}).bytes, 3 * kMiB);
  // A 2 MiB heap leaves 512 KiB per buffer: below 1 MiB, refused with the sizes.
  EXPECT_KVLAB_ERROR(choose_copy_bytes(256 * kMiB, {.max_allocation = 0, .device_heap = 2 * kMiB}), unsupported,
                     "less than 1 MiB");
}

// The destination of `copy`, read back through a staging buffer.
std::vector<std::uint8_t> read_destination(const vk::Device& device, const DeviceCopy& copy) {
  const vk::DeviceBuffer staging(device, copy.bytes(), vk::MemoryKind::staging);
  vk::CommandStream stream(device, false);
  stream.begin();
  stream.copy(copy.destination(), 0, staging.handle(), 0, copy.bytes());
  stream.submit_and_wait();
  std::vector<std::uint8_t> out(copy.bytes());
  std::memcpy(out.data(), staging.mapped(), out.size());
  return out;
}

// "" when every byte is the source's fill pattern, else how many are not and the first.
std::string wrong_bytes(const std::vector<std::uint8_t>& got) {
  std::uint64_t wrong = 0, first = 0;
  for (std::uint64_t i = 0; i < got.size(); ++i) {
    if (got[i] != DeviceCopy::fill_pattern(i) && wrong++ == 0) first = i;
  }
  return wrong == 0 ? "" : cat(wrong, " of ", got.size(), " bytes wrong, the first at ", first);
}

TEST(VulkanCopyBaseline, CopiesItsFilledSourceAndTimesItOnTheDevice) {
  KVLAB_VULKAN_OR_SKIP(backend, VulkanOptions{});
  const vk::Device& device = backend->context().device();
  // 9 MiB + 7 B asked: 9 MiB, more than one 8 MiB fill chunk (a second chunk at an offset).
  DeviceCopy copy(device, 9 * kMiB + 7);
  ASSERT_EQ(copy.bytes(), 9 * kMiB);
  EXPECT_EQ(copy.limited_by(), "");
  // The pattern differs between MiB (a chunk written at the wrong offset shows).
  EXPECT_NE(DeviceCopy::fill_pattern(0), DeviceCopy::fill_pattern(kMiB));
  EXPECT_NE(DeviceCopy::fill_pattern(8 * kMiB), DeviceCopy::fill_pattern(0));
  const double seconds = copy.copy();
  EXPECT_GT(seconds, 0.0);
  EXPECT_EQ(wrong_bytes(read_destination(device, copy)), "");
}

// The shader copy moves every byte too, in pieces no larger than a storage binding (on
// lavapipe maxStorageBufferRange is under the bench's 256 MiB buffers); here a buffer
// one MiB larger than a binding forces a second piece wherever that size is affordable.
TEST(VulkanCopyBaseline, TheShaderCopyCopiesEveryByteAndIsTimedOnTheDevice) {
  KVLAB_VULKAN_OR_SKIP(backend, VulkanOptions{});
  const vk::Device& device = backend->context().device();
  const std::uint64_t range = device.limits().maxStorageBufferRange;
  const bool pieces = range <= 256 * kMiB;  // else a buffer over one binding is too big to test here
  const std::uint64_t want = pieces ? range / kMiB * kMiB + kMiB : 9 * kMiB;
  DeviceCopy copy(device, want);
  ASSERT_EQ(copy.bytes(), want);
  if (pieces) {
    EXPECT_GT(copy.bytes(), range) << "the copy must span more than one storage binding";
  }
  // Zero the destination the constructor's untimed copy filled, so only the shader can
  // put the pattern back.
  {
    const vk::DeviceBuffer zeros(device, copy.bytes(), vk::MemoryKind::staging);
    std::memset(zeros.mapped(), 0, copy.bytes());
    vk::CommandStream stream(device, false);
    stream.begin();
    stream.copy(zeros.handle(), 0, copy.destination(), 0, copy.bytes());
    stream.submit_and_wait();
  }
  ASSERT_EQ(read_destination(device, copy)[1], 0u);
  EXPECT_GT(copy.copy(DeviceCopyMethod::shader), 0.0);
  EXPECT_EQ(wrong_bytes(read_destination(device, copy)), "");
}

TEST(VulkanTimedBackend, FlagsSelectThePathsAndBadOnesAreNamed) {
  std::string reason;
  if (!testing::try_vulkan(VulkanOptions{}, reason)) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  const auto words = make_timed_vulkan_backend("vulkan:,words");
  EXPECT_FALSE(dynamic_cast<VulkanBackend&>(*words).uses_small_storage());
  const auto staging = make_timed_vulkan_backend("vulkan:,staging");
  EXPECT_TRUE(dynamic_cast<VulkanBackend&>(*staging).uses_staging());
  EXPECT_KVLAB_ERROR(make_timed_vulkan_backend("vulkan:,fast"), invalid_argument, "'fast'");
  const VulkanDeviceProbe probe = probe_vulkan_device("vulkan");
  EXPECT_EQ(probe.unavailable, "");
  EXPECT_NE(probe.description.find(" ["), std::string::npos) << probe.description;
}

TEST(VulkanTimedBackend, AnUnknownDeviceFailsWhereDevicesExistAndSkipsWhereNoneDoes) {
  // No device has this name: where devices exist that is a usage error (the row fails,
  // naming the device); without a driver there is no device at all: unsupported, a skip.
  const harness::Problem rope = harness::parse_problem("rope B=1 H=2 T=3 D=64 dims=64 dtype=f32");
  const TimedCase& tc = acquire_timed_case("rope/vulkan:none/x", rope, "vulkan:no_such_vulkan_device");
  if (vulkan_devices().empty()) {
    EXPECT_EQ(tc.failure, "");
    EXPECT_NE(tc.skip.find("no_such_vulkan_device"), std::string::npos) << tc.skip;
    EXPECT_EQ(probe_vulkan_device("vulkan:no_such_vulkan_device").description, "");
  } else {
    EXPECT_NE(tc.failure.find("no_such_vulkan_device"), std::string::npos) << tc.failure;
    EXPECT_THROW(probe_vulkan_device("vulkan:no_such_vulkan_device"), Error);
  }
  release_timed_case();
}

TEST(VulkanTimedCase, AVerifiedKernelIsTimedOnTheDeviceAndAnUnwrittenOneSkipped) {
  std::string reason;
  if (!testing::try_vulkan(VulkanOptions{}, reason)) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  const harness::Problem rope = harness::parse_problem("rope B=1 H=4 T=64 D=128 dims=128 dtype=f16");
  TimedCase& tc = acquire_timed_case("rope/vulkan/x", rope, "vulkan");
  ASSERT_EQ(tc.failure, "");
  ASSERT_EQ(tc.skip, "");
  tc.clock = make_device_clock(*tc.backend, std::int64_t{2} << 20);
  tc.clock->flush_caches();
  // Device time of a call cannot exceed the host's time around it (a clock in the wrong
  // unit or reading stale stamps would).
  const auto start = std::chrono::steady_clock::now();
  const DeviceTiming device = tc.clock->time([&tc] { tc.invoke(); });
  const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start;
  EXPECT_GT(device.seconds, 0.0);
  EXPECT_LE(device.seconds, wall.count());
  // rope is one dispatch, one submission: timed on the device.
  EXPECT_TRUE(device.on_device);
  release_timed_case();

  // A kernel of several submissions (the attention kernels, while sdpa.cc submits its
  // passes one by one) is not timed by its last submission alone: the device clock is
  // used exactly when the call was one submission.
  const harness::Problem attention = harness::parse_problem(
      "quantized_sdpa B=1 Hq=4 Hkv=2 Lq=1 Lk=32 Dk=64 Dv=64 dtype=f16 kbits=4 kgroup=64 vbits=4 vgroup=64");
  TimedCase& qc = acquire_timed_case("quantized_sdpa/vulkan/x", attention, "vulkan");
  ASSERT_EQ(qc.failure, "");
  ASSERT_EQ(qc.skip, "");
  qc.clock = make_device_clock(*qc.backend, 0);
  const VulkanBackend::Context& context = dynamic_cast<VulkanBackend&>(*qc.backend).context();
  const std::uint64_t before = context.submissions();
  const DeviceTiming q = qc.clock->time([&qc] { qc.invoke(); });
  const std::uint64_t submitted = context.submissions() - before;
  EXPECT_GE(submitted, 1u);
  EXPECT_EQ(q.on_device, submitted == 1) << submitted << " submissions";
  EXPECT_GT(q.seconds, 0.0);
  // Timed on the device, the call names its passes (shader names without build or
  // specialization): the combine pass comes last and no pass outlasts the call.
  if (q.on_device) {
    ASSERT_FALSE(q.passes.empty());
    EXPECT_EQ(q.passes.back().first, "sdpa_combine");
    for (const auto& [pass, seconds] : q.passes) {
      EXPECT_EQ(pass.find(' '), std::string::npos) << pass;
      EXPECT_LE(seconds, q.seconds * (1 + 1e-9)) << pass;
    }
  }
  release_timed_case();

  // The Vulkan backend has no fp_quantize: a skip naming it, not a failure.
  const harness::Problem fp = harness::parse_problem("fp_quantize B=1 H=2 T=4 D=128 mode=mxfp4");
  const TimedCase& skipped = acquire_timed_case("fp_quantize/vulkan/x", fp, "vulkan");
  EXPECT_EQ(skipped.failure, "");
  EXPECT_NE(skipped.skip.find("quantize in mode mxfp4"), std::string::npos) << skipped.skip;
  release_timed_case();
}

}  // namespace
}  // namespace kvlab::bench

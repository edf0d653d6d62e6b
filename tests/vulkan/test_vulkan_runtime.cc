// The Vulkan runtime: device selection (default ranking, index, name substring,
// KVLAB_VK_DEVICE, errors that name the selector and list the devices), VkResult
// failures as kvlab::Error, the validation messenger really reporting misuse, the
// backend factory's variants, and timestamp queries.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/runtime/command.h"
#include "kernels/vulkan/runtime/device.h"
#include "kernels/vulkan/runtime/instance.h"
#include "kernels/vulkan/runtime/vk_error.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_runtime {
namespace {

vk::PhysicalDeviceInfo fake(int index, const char* name, VkPhysicalDeviceType type) {
  return {index, VK_NULL_HANDLE, name, type, VK_API_VERSION_1_3};
}

// Sets an environment variable for the scope of a test (tests run as separate processes).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(VulkanRuntime, DefaultSelectionPrefersDiscreteThenIntegratedThenCpu) {
  const ScopedEnv no_env("KVLAB_VK_DEVICE", nullptr);
  const auto cpu = fake(0, "llvmpipe (LLVM 15.0.6, 256 bits)", VK_PHYSICAL_DEVICE_TYPE_CPU);
  const auto igpu = fake(1, "Intel(R) UHD Graphics 620", VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU);
  const auto dgpu = fake(2, "NVIDIA H100", VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU);
  const auto dgpu2 = fake(3, "AMD Radeon", VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU);
  EXPECT_EQ(vk::select_physical_device({cpu, igpu, dgpu, dgpu2}, "").index, 2);  // first of the best type
  EXPECT_EQ(vk::select_physical_device({cpu, igpu}, "").index, 1);
  EXPECT_EQ(vk::select_physical_device({cpu}, "").index, 0);
}

TEST(VulkanRuntime, SelectorsPickByIndexOrNameAndTheEnvironmentActsAsTheDefault) {
  const std::vector<vk::PhysicalDeviceInfo> devices = {fake(0, "llvmpipe", VK_PHYSICAL_DEVICE_TYPE_CPU),
                                                       fake(1, "NVIDIA H100", VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU)};
  EXPECT_EQ(vk::select_physical_device(devices, "0").index, 0);
  EXPECT_EQ(vk::select_physical_device(devices, "1").index, 1);
  EXPECT_EQ(vk::select_physical_device(devices, "llvm").index, 0);
  EXPECT_EQ(vk::select_physical_device(devices, "H100").index, 1);
  {
    const ScopedEnv env("KVLAB_VK_DEVICE", "llvmpipe");
    EXPECT_EQ(vk::select_physical_device(devices, "").index, 0);  // the environment replaces the ranking
    EXPECT_EQ(vk::select_physical_device(devices, "1").index, 1);  // an explicit selector wins
  }
  {
    const ScopedEnv env("KVLAB_VK_DEVICE", "7");
    testing::expect_error([&] { vk::select_physical_device(devices, ""); }, ErrorKind::invalid_argument,
                          {"index 7", "KVLAB_VK_DEVICE", "0: llvmpipe [cpu]", "1: NVIDIA H100 [discrete]"});
  }
  testing::expect_error([&] { vk::select_physical_device(devices, "Radeon"); }, ErrorKind::invalid_argument,
                        {"'Radeon'", "0: llvmpipe [cpu]"});
  testing::expect_error([&] { vk::select_physical_device(devices, "99999999999999"); }, ErrorKind::invalid_argument,
                        {"99999999999999", "out of range"});
  testing::expect_error([&] { vk::select_physical_device({}, ""); }, ErrorKind::unsupported, {"no Vulkan device"});
}

TEST(VulkanRuntime, RealDevicesAreSelectableByIndexAndName) {
  const std::vector<VulkanDeviceInfo> devices = vulkan_devices();
  if (devices.empty()) GTEST_SKIP() << "no Vulkan device (or driver) on this machine";
  for (const VulkanDeviceInfo& d : devices) {
    std::cout << "[ device   ] " << d.index << ": " << d.name << " [" << d.type << "]\n";
    VulkanOptions by_index;
    by_index.device = std::to_string(d.index);
    std::string reason;
    const auto a = testing::try_vulkan(by_index, reason);
    if (!a) {  // e.g. below Vulkan 1.2: an explicit skip of that device, with the reason
      std::cout << "[ skipped  ] device " << d.index << ": " << reason << "\n";
      continue;
    }
    EXPECT_EQ(a->device().index, d.index);
    EXPECT_EQ(a->name(), "vulkan:" + d.name);
    VulkanOptions by_name;
    by_name.device = d.name;
    const auto b = testing::try_vulkan(by_name, reason);
    ASSERT_TRUE(b) << reason;
    EXPECT_EQ(b->device().name, d.name);
  }
  testing::expect_error([] { VulkanBackend be(VulkanOptions{.device = "no-such-gpu-kvlab"}); },
                        ErrorKind::invalid_argument, {"no-such-gpu-kvlab", devices.front().name});
}

// A transfer recorded outside begin() would go into no command buffer (or a finished one,
// which Vulkan forbids): kvlab's own misuse, refused naming the call (a mutation
// survivor: the message could be emptied unseen). Nothing is recorded, so null handles do.
TEST(VulkanRuntime, TransfersOutsideARecordingAreRefusedNamingTheCall) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  vk::CommandStream stream(be->context().device(), false);
  const std::vector<std::byte> words(4);
  testing::expect_error([&] { stream.copy(VK_NULL_HANDLE, 0, VK_NULL_HANDLE, 0, 4); }, ErrorKind::internal,
                        {"CommandStream::copy outside begin()"});
  testing::expect_error([&] { stream.update(VK_NULL_HANDLE, 0, words); }, ErrorKind::internal,
                        {"CommandStream::update outside begin()"});
}

TEST(VulkanRuntime, FailingCallsBecomeKvlabErrorsNamingTheCallAndResult) {
  testing::expect_error([] { vk::check(VK_ERROR_DEVICE_LOST, "vkQueueSubmit"); }, ErrorKind::device,
                        {"vkQueueSubmit failed: VK_ERROR_DEVICE_LOST"});
  testing::expect_error([] { vk::check(static_cast<VkResult>(-12345), "vkFoo"); }, ErrorKind::device,
                        {"vkFoo failed: VkResult(-12345)"});
  EXPECT_NO_THROW(vk::check(VK_SUCCESS, "vkFoo"));
  EXPECT_EQ(vk::result_name(VK_ERROR_OUT_OF_DEVICE_MEMORY), "VK_ERROR_OUT_OF_DEVICE_MEMORY");
}

TEST(VulkanRuntime, TheValidationMessengerReportsMisuse) {
  if (!vk::Instance::validation_layer_available()) GTEST_SKIP() << "VK_LAYER_KHRONOS_validation is not installed";
  std::vector<std::string> messages;
  std::unique_ptr<vk::Instance> instance;
  std::unique_ptr<vk::Device> device;
  try {
    instance = std::make_unique<vk::Instance>(
        vk::InstanceOptions{true, [&](const std::string& m) { messages.push_back(m); }});
    device = std::make_unique<vk::Device>(vk::select_physical_device(vk::list_physical_devices(*instance), ""), true);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_TRUE(instance->validation_enabled());
  EXPECT_TRUE(messages.empty()) << messages.front();
  // A buffer with no usage flags violates VUID-VkBufferCreateInfo-usage-requiredbitmask.
  const VkBufferCreateInfo info{.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 64, .usage = 0};
  VkBuffer buffer = VK_NULL_HANDLE;
  const VkResult r = vkCreateBuffer(device->handle(), &info, nullptr, &buffer);
  if (r == VK_SUCCESS) vkDestroyBuffer(device->handle(), buffer, nullptr);
  ASSERT_FALSE(messages.empty()) << "the layer reported nothing";
  EXPECT_NE(messages.front().find("VUID-VkBufferCreateInfo-usage"), std::string::npos) << messages.front();
  EXPECT_EQ(messages.front().rfind("error validation:", 0), 0u) << messages.front();
}

TEST(VulkanRuntime, ValidationIsOnInTheTestsWhereverTheLayerIsInstalled) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  EXPECT_EQ(be->validation_enabled(), vk::Instance::validation_layer_available());
}

TEST(VulkanRuntime, FactoryVariantsPickTheDeviceAndForceTheFallbackPaths) {
  std::string reason;
  if (!testing::try_vulkan({}, reason)) GTEST_SKIP() << "no usable Vulkan device: " << reason;
  const auto plain = make_vulkan_backend("");
  auto* p = dynamic_cast<VulkanBackend*>(plain.get());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name().rfind("vulkan:", 0), 0u);
  const auto words = make_vulkan_backend("0,words");
  EXPECT_FALSE(dynamic_cast<VulkanBackend&>(*words).uses_small_storage());
  EXPECT_NE(words->name().find("[words]"), std::string::npos);
  const auto staging = make_vulkan_backend(",staging,words");
  EXPECT_TRUE(dynamic_cast<VulkanBackend&>(*staging).uses_staging());
  EXPECT_NE(staging->name().find("[staging]"), std::string::npos);
  testing::expect_error([] { make_vulkan_backend("0,fast"); }, ErrorKind::invalid_argument, {"'fast'"});
  // ,wg=<N>: the attention workgroup target, parsed without a device.
  EXPECT_EQ(vulkan_options_from_variant(",wg=4096,words").attention_workgroups, 4096u);
  EXPECT_EQ(vulkan_options_from_variant("").attention_workgroups, 0u);
  EXPECT_NE(make_vulkan_backend(",wg=1024")->name().find("[wg=1024]"), std::string::npos);
  for (const char* bad : {",wg=0", ",wg=65536", ",wg=", ",wg=12x", ",wg=-3"}) {
    testing::expect_error([&] { vulkan_options_from_variant(bad); }, ErrorKind::invalid_argument,
                          {std::string(bad).substr(4) + "'", "[1, 65535]"});
  }
  std::cout << "[ paths    ] default: " << p->name() << (p->uses_small_storage() ? " (16/8-bit storage)" : " (u32 words)")
            << (p->uses_staging() ? ", staging" : ", mapped memory") << "\n";
}

TEST(VulkanRuntime, AnUnknownDeviceIsAUsageErrorAndNoDeviceIsUnsupported) {
  // What `kvlab check --backend vulkan:<device>` gets when no device has that name: a
  // usage error (exit 2) where devices exist; where none does, the backend is unavailable
  // (unsupported: the reason printed, every case UNIMPLEMENTED).
  const ErrorKind kind = vulkan_devices().empty() ? ErrorKind::unsupported : ErrorKind::invalid_argument;
  testing::expect_error([] { make_vulkan_backend("no-such-gpu-kvlab"); }, kind, {"no-such-gpu-kvlab"});
  testing::expect_error([] { make_vulkan_backend("0,bogus"); }, ErrorKind::invalid_argument, {"'bogus'"});
}

TEST(VulkanRuntime, TimestampsMeasureKernelsWhenAskedFor) {
  VulkanOptions o;
  o.timestamps = true;
  KVLAB_VULKAN_OR_SKIP(be, o);
  if (be->context().device().timestamp_valid_bits() == 0) GTEST_SKIP() << "the compute queue has no timestamps";
  EXPECT_FALSE(be->last_kernel_seconds().has_value());  // no kernel yet
  const DTensor t = be->allocate(DType::u32, {1 << 20});
  be->fill(t, 7);
  ASSERT_TRUE(be->last_kernel_seconds().has_value());
  EXPECT_GT(*be->last_kernel_seconds(), 0.0);
  EXPECT_LT(*be->last_kernel_seconds(), 60.0);
  KVLAB_VULKAN_OR_SKIP(quiet, VulkanOptions{});
  quiet->fill(quiet->allocate(DType::u32, {4}), 1);
  EXPECT_FALSE(quiet->last_kernel_seconds().has_value());  // off by default
  EXPECT_TRUE(quiet->last_kernel_steps().empty());
}

TEST(VulkanRuntime, TimestampsNameAndTimeEachCommandOfABatch) {
  VulkanOptions o;
  o.timestamps = true;
  KVLAB_VULKAN_OR_SKIP(be, o);
  if (be->context().device().timestamp_valid_bits() == 0) GTEST_SKIP() << "the compute queue has no timestamps";
  VulkanBackend::Context& c = be->context();
  const DTensor a = be->allocate(DType::u32, {1 << 16}), b = be->allocate(DType::u32, {1 << 16});
  const std::vector<std::uint32_t> words(4, 9u);
  {
    VulkanBackend::Context::Batch batch(c);
    c.update(DTensor{a.buffer, a.offset, DType::u32, {4}}, words.data());
    be->fill(a, 32);
    c.copy(a, b);
    batch.submit();
  }
  const std::vector<VulkanKernelStep> steps = be->last_kernel_steps();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].pass, "update");
  EXPECT_EQ(steps[1].pass.rfind("fill", 0), 0u) << steps[1].pass;  // the fill shader's pipeline
  EXPECT_EQ(steps[2].pass, "copy");
  double sum = 0;
  for (const VulkanKernelStep& s : steps) {
    EXPECT_GE(s.seconds, 0.0) << s.pass;
    sum += s.seconds;
  }
  // The commands lie within the submission's stamps (a step read from the wrong stamp,
  // or in the wrong unit, would not).
  ASSERT_TRUE(be->last_kernel_seconds().has_value());
  EXPECT_LE(sum, *be->last_kernel_seconds() * (1 + 1e-9));

  // More commands than the pool has stamps: the submission's time stays, the per-command
  // times are dropped rather than misattributed.
  {
    VulkanBackend::Context::Batch batch(c);
    for (int i = 0; i < 70; ++i) c.copy(i % 2 ? a : b, i % 2 ? b : a);
    batch.submit();
  }
  EXPECT_TRUE(be->last_kernel_seconds().has_value());
  EXPECT_TRUE(be->last_kernel_steps().empty());
}

}  // namespace
}  // namespace test_vulkan_runtime
}  // namespace kvlab

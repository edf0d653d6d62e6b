// VulkanBackend memory operations on every path: upload/download round trips and fill
// at every byte offset and element size (only the tensor's bytes change: partial words
// at both ends), host_view's errors for bad tensors, buffers of other backends, the
// maxStorageBufferRange limit, and the kernels of later phases throwing unsupported.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/vulkan/context.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/host_buffer.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"
#include "tests/vulkan/vulkan_test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_vulkan_backend {
namespace {

std::vector<std::uint8_t> whole(Backend& be, const BufferPtr& buf) {
  std::vector<std::uint8_t> image(buf->size());
  be.download(DTensor{buf, 0, DType::u8, {static_cast<std::int64_t>(image.size())}}, image.data());
  return image;
}

TEST(VulkanBackendMemory, UploadAndDownloadTouchOnlyTheTensorAtEveryOffset) {
  KVLAB_SEEDED_RNG(rng, 3101);
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    const BufferPtr buf = be.allocate(71);  // not a multiple of 4 or 16
    std::vector<std::uint8_t> model(71);
    for (auto& b : model) b = static_cast<std::uint8_t>(rng.integer(0, 255));
    be.upload(DTensor{buf, 0, DType::u8, {71}}, model.data());
    EXPECT_EQ(whole(be, buf), model);
    for (const DType dtype : {DType::u8, DType::f16, DType::f32})
      for (std::size_t offset = 0; offset + 7 * dtype_size(dtype) <= 71; offset += dtype_size(dtype))
        for (const std::int64_t n : {0, 1, 3, 7}) {
          std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n) * dtype_size(dtype));
          for (auto& b : bytes) b = static_cast<std::uint8_t>(rng.integer(0, 255));
          const DTensor t{buf, offset, dtype, {n}};
          be.upload(t, bytes.data());
          if (!bytes.empty()) std::memcpy(model.data() + offset, bytes.data(), bytes.size());
          std::vector<std::uint8_t> back(bytes.size());
          be.download(t, back.data());
          EXPECT_EQ(back, bytes) << dtype_name(dtype) << " at " << offset << " n " << n;
        }
    EXPECT_EQ(whole(be, buf), model);
  });
}

TEST(VulkanBackendMemory, FillWritesEveryElementAndNothingElse) {
  KVLAB_FOR_EACH_VULKAN_PATH([&](VulkanBackend& be, const testing::VulkanPath&) {
    for (const DType dtype : {DType::u8, DType::f16, DType::bf16, DType::f32, DType::u32, DType::i32})
      for (std::size_t lead = 0; lead < 5; ++lead)
        for (const std::int64_t n : {1, 2, 5, 33}) {
          const DTensor t = testing::place(be, dtype, {n}, lead, nullptr, 0x11);
          be.fill(t, 0xDEADBEEFu);
          EXPECT_TRUE(testing::guards_intact(be, t)) << dtype_name(dtype) << " lead " << lead << " n " << n;
          const Tensor got = be.download(t);
          const std::size_t es = dtype_size(dtype);
          const auto* p = reinterpret_cast<const std::uint8_t*>(got.data());
          for (std::size_t i = 0; i < got.nbytes(); ++i) {
            const std::uint32_t want = (0xDEADBEEFu >> (8 * (i % es))) & 0xFFu;  // little-endian low bytes
            ASSERT_EQ(p[i], want) << dtype_name(dtype) << " lead " << lead << " n " << n << " byte " << i;
          }
        }
  });
}

TEST(VulkanBackendMemory, BadTensorsRaiseHostViewsErrors) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  ReferenceBackend ref;
  using Call = std::function<void(Backend&)>;
  const std::vector<std::pair<const char*, Call>> bad = {
      {"overrun", [](Backend& b) { b.fill(DTensor{b.allocate(16), 8, DType::f32, {3}}, 0); }},
      {"offset past the end", [](Backend& b) { b.fill(DTensor{b.allocate(16), 20, DType::u8, {0}}, 0); }},
      {"misaligned", [](Backend& b) { b.fill(DTensor{b.allocate(16), 2, DType::f32, {2}}, 0); }},
      {"no buffer", [](Backend& b) { b.fill(DTensor{nullptr, 0, DType::f32, {2}}, 0); }},
      {"upload overrun", [](Backend& b) {
         const float v[4] = {};
         b.upload(DTensor{b.allocate(12), 0, DType::f32, {4}}, v);
       }},
  };
  for (const auto& [what, call] : bad)
    testing::expect_same_error([&, &call = call] { call(ref); }, [&, &call = call] { call(*be); }, what);
}

TEST(VulkanBackendMemory, BuffersOfOtherBackendsAreMisuse) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  KVLAB_VULKAN_OR_SKIP(other, VulkanOptions{});
  const DTensor host{make_host_buffer(16), 0, DType::f32, {4}};
  testing::expect_error([&] { be->fill(host, 0); }, ErrorKind::misuse, {"not allocated by this Vulkan backend"});
  const DTensor foreign = other->allocate(DType::f32, {4});
  testing::expect_error([&] { be->fill(foreign, 0); }, ErrorKind::misuse, {"not allocated by this Vulkan backend"});
  // Device memory is never handed out as host memory.
  EXPECT_EQ(be->allocate(16)->host_data(), nullptr);
}

TEST(VulkanBackendMemory, BuffersOutliveTheirBackend) {
  BufferPtr kept;
  {
    KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
    kept = be->allocate(64);
  }
  EXPECT_EQ(kept->size(), 64u);
  kept.reset();  // frees the VkBuffer on the still-alive device (no validation error, no crash)
}

TEST(VulkanBackendMemory, BindingsLargerThanMaxStorageBufferRangeAreRejectedNamingTheSize) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  const std::uint64_t max_range = be->context().device().limits().maxStorageBufferRange;
  if (max_range > (std::uint64_t{256} << 20)) GTEST_SKIP() << "maxStorageBufferRange is " << max_range << " bytes; too big to test here";
  const std::size_t bytes = static_cast<std::size_t>(max_range) + 64;
  const BufferPtr buf = be->allocate(bytes);
  const DTensor all{buf, 0, DType::u8, {static_cast<std::int64_t>(bytes)}};
  testing::expect_error([&] { be->fill(all, 1); }, ErrorKind::unsupported,
                        {std::to_string(bytes) + " bytes", "maxStorageBufferRange of " + std::to_string(max_range)});
  // A tensor near the end of the same big buffer binds only its own range.
  const DTensor tail{buf, bytes - 40, DType::f32, {8}};
  be->fill(tail, 0x3F800000u);
  const Tensor got = be->download(tail);
  for (std::int64_t i = 0; i < 8; ++i) EXPECT_EQ(got.view().load(i), 1.0f);
}

TEST(VulkanBackendKernels, LaterPhaseKernelsThrowUnsupportedNamingTheKernel) {
  KVLAB_VULKAN_OR_SKIP(be, VulkanOptions{});
  const DTensor x = be->allocate(DType::f32, {1, 1, 2, 64});
  const DTensor o = be->allocate(DType::f32, {1, 1, 2, 64});
  const QuantSpec fp = QuantSpec::make(QuantMode::mxfp4);
  TurboQuantCodec codec;
  testing::expect_error([&] { be->quantize({x, Rounding::mlx_cpu, {o, o, {}, fp}}); }, ErrorKind::unsupported,
                        {"quantize in mode mxfp4"});
  testing::expect_error([&] { be->dequantize({{x, x, {}, fp}, o}); }, ErrorKind::unsupported,
                        {"dequantize in mode mxfp4"});
  testing::expect_error([&] { be->turboquant_encode({x, codec, o, o}); }, ErrorKind::unsupported, {"turboquant_encode"});
  testing::expect_error([&] { be->turboquant_decode({x, x, codec, o}); }, ErrorKind::unsupported, {"turboquant_decode"});
}

}  // namespace
}  // namespace test_vulkan_backend
}  // namespace kvlab

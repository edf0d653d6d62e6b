// Helpers of the Vulkan backend tests: a backend with the validation layer on (when
// installed) whose every warning/error fails the test, an explicit skip with the reason
// when there is no device, the memory/storage paths each kernel runs on, and a
// comparison of the errors two backends raise.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/vulkan/runtime/instance.h"
#include "kernels/vulkan/vulkan_backend.h"
#include "kvlab/error.h"

namespace kvlab::testing {

inline VulkanOptions with_validation(VulkanOptions o) {
  o.validation = vk::Instance::validation_layer_available();
  o.on_validation_message = [](const std::string& m) { ADD_FAILURE() << "Vulkan validation layer: " << m; };
  return o;
}

// The backend, or nullptr with `reason` set when no device is usable (Error(unsupported)).
inline std::unique_ptr<VulkanBackend> try_vulkan(VulkanOptions o, std::string& reason) {
  try {
    return std::make_unique<VulkanBackend>(with_validation(std::move(o)));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    reason = e.what();
    return nullptr;
  }
}

// In a TEST body: declares `var`, or skips the test with the reason.
#define KVLAB_VULKAN_OR_SKIP(var, options)                                          \
  std::string var##_reason;                                                        \
  std::unique_ptr<::kvlab::VulkanBackend> var = ::kvlab::testing::try_vulkan((options), var##_reason); \
  if (!var) GTEST_SKIP() << "no usable Vulkan device: " << var##_reason

// The paths every kernel test covers: the device's default (16/8-bit storage on
// lavapipe), the forced u32-word shaders, and forced device-local memory with staging.
struct VulkanPath {
  const char* name;
  bool words;
  bool staging;
};
inline std::vector<VulkanPath> vulkan_paths() { return {{"default", false, false}, {"words", true, false}, {"staging", false, true}}; }

// Runs body(backend) on every path; returns false (and the caller should GTEST_SKIP)
// when there is no device, with `reason` set.
inline bool for_each_vulkan_path(const std::function<void(VulkanBackend&, const VulkanPath&)>& body,
                                 std::string& reason, VulkanOptions base = {}) {
  for (const VulkanPath& p : vulkan_paths()) {
    VulkanOptions o = base;
    o.force_word_storage = p.words;
    o.force_staging = p.staging;
    std::unique_ptr<VulkanBackend> be = try_vulkan(o, reason);
    if (!be) return false;
    SCOPED_TRACE(::testing::Message() << "path " << p.name << " (" << be->name() << ")");
    if (p.words) {
      EXPECT_FALSE(be->uses_small_storage());
    }
    if (p.staging) {
      EXPECT_TRUE(be->uses_staging());
    }
    body(*be, p);
  }
  return true;
}

// KVLAB_FOR_EACH_VULKAN_PATH(lambda): runs the lambda on every path or skips the test.
#define KVLAB_FOR_EACH_VULKAN_PATH(...)                                                         \
  do {                                                                                         \
    std::string no_device_reason;                                                              \
    if (!::kvlab::testing::for_each_vulkan_path((__VA_ARGS__), no_device_reason))              \
      GTEST_SKIP() << "no usable Vulkan device: " << no_device_reason;                         \
  } while (false)

struct Raised {
  bool threw = false;
  ErrorKind kind = ErrorKind::internal;
  std::string message;
};

// Buffer addresses ("0x55…") differ between backends: each hex literal becomes "0x?".
inline std::string mask_addresses(const std::string& m) {
  std::string out;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m.compare(i, 2, "0x") == 0) {
      out += "0x?";
      i += 2;
      while (i < m.size() && std::isxdigit(static_cast<unsigned char>(m[i]))) ++i;
      --i;
    } else {
      out += m[i];
    }
  }
  return out;
}

inline Raised raised_by(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return {true, e.kind(), mask_addresses(e.what())};
  }
  return {};
}

// Both calls must throw a kvlab::Error of the same kind and message.
inline void expect_same_error(const std::function<void()>& reference, const std::function<void()>& vulkan,
                              const std::string& what) {
  const Raised a = raised_by(reference), b = raised_by(vulkan);
  EXPECT_TRUE(a.threw) << what << ": the reference accepted it";
  EXPECT_TRUE(b.threw) << what << ": the Vulkan backend accepted it";
  EXPECT_EQ(error_kind_name(a.kind), error_kind_name(b.kind)) << what;
  EXPECT_EQ(a.message, b.message) << what;
}

// A tensor placed `lead` elements into a buffer of its own, with guard bytes after it;
// every byte outside the tensor holds kGuardByte, so a kernel that writes past an edge
// (a whole word where only part belongs to the tensor) is caught by guards_intact().
inline constexpr std::uint8_t kGuardByte = 0xA5;
inline constexpr std::size_t kGuardBytes = 24;

inline DTensor place(Backend& be, DType dtype, Shape shape, std::size_t lead, const void* content,
                     std::uint8_t payload_byte = 0xFF) {
  DTensor t{nullptr, lead * dtype_size(dtype), dtype, std::move(shape)};
  const std::size_t total = t.offset + t.nbytes() + kGuardBytes;
  std::vector<std::uint8_t> image(total, kGuardByte);
  if (content != nullptr) {
    std::memcpy(image.data() + t.offset, content, t.nbytes());
  } else {
    std::memset(image.data() + t.offset, payload_byte, t.nbytes());
  }
  t.buffer = be.allocate(total);
  be.upload(DTensor{t.buffer, 0, DType::u8, {static_cast<std::int64_t>(total)}}, image.data());
  return t;
}

inline ::testing::AssertionResult guards_intact(Backend& be, const DTensor& t) {
  std::vector<std::uint8_t> image(t.buffer->size());
  be.download(DTensor{t.buffer, 0, DType::u8, {static_cast<std::int64_t>(image.size())}}, image.data());
  for (std::size_t i = 0; i < image.size(); ++i) {
    if (i >= t.offset && i < t.offset + t.nbytes()) continue;
    if (image[i] != kGuardByte) {
      return ::testing::AssertionFailure() << "byte " << i << " outside the tensor (bytes [" << t.offset << ", "
                                           << t.offset + t.nbytes() << ")) was overwritten";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvlab::testing

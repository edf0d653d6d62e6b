// Tests of the reference backend's memory layer (core/host_buffer.cc) and of its cache
// data-movement kernels, which must be the oracle functions of reference/kv_move.h
// applied to the DTensors' bytes. (The other kernels are tested in their own stems.)
#include <gtest/gtest.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_TEST_ASAN 1
#endif
#endif
#if defined(KVLAB_TEST_ASAN)
#include <sanitizer/asan_interface.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "kvlab/host_buffer.h"
#include "reference/kv_move.h"
#include "reference/reference_backend.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_reference_backend {
namespace {

using Idx = std::int64_t;
constexpr DType kAllDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::u32, DType::i32, DType::u8};

// Distinct raw patterns per element, starting just below +inf for the float dtypes so
// that inf and NaN payloads are among them: a round trip must copy bytes, not values.
Tensor patterned(DType dt, Shape shape, std::uint32_t tag = 0) {
  Tensor t(dt, std::move(shape));
  std::uint32_t base = dt == DType::f32    ? 0x7F7FFFF8u
                       : dt == DType::f16  ? 0x7BFCu
                       : dt == DType::bf16 ? 0x7F7Cu
                                           : 0x9E3779B9u;
  base += tag * 0x1000u;
  const std::size_t es = dtype_size(dt);
  for (Idx i = 0; i < t.numel(); ++i) {
    const std::uint32_t v = base + static_cast<std::uint32_t>(i);
    std::memcpy(t.data() + static_cast<std::size_t>(i) * es, &v, es);
  }
  return t;
}

using testing::expect_error;

std::vector<std::uint8_t> bytes_of(const BufferPtr& b) {
  std::vector<std::uint8_t> out(b->size());
  if (!out.empty()) std::memcpy(out.data(), b->host_data(), out.size());
  return out;
}

// ---- memory ---------------------------------------------------------------------------

TEST(ReferenceBackendMemory, AllocatesAlignedBuffersOfTheAskedSize) {
  ReferenceBackend be;
  EXPECT_EQ(be.name(), "reference");
  for (std::size_t bytes : {0u, 1u, 63u, 64u, 65u, 1000u}) {
    const BufferPtr b = be.allocate(bytes);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->size(), bytes);
    ASSERT_NE(b->host_data(), nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->host_data()) % 64, 0u) << bytes << " bytes";
  }
  const DTensor t = be.allocate(DType::bf16, {3, 5, 7});
  EXPECT_EQ(t.offset, 0u);
  EXPECT_EQ(t.buffer->size(), 3u * 5u * 7u * 2u);
  EXPECT_EQ(t.shape, (Shape{3, 5, 7}));
}

TEST(ReferenceBackendMemory, UploadDownloadRoundTripEveryDtype) {
  ReferenceBackend be;
  for (DType dt : kAllDtypes) {
    const Tensor host = patterned(dt, {2, 3, 5});
    const DTensor dev = be.upload(host);
    EXPECT_EQ(dev.dtype, dt);
    EXPECT_EQ(dev.shape, host.shape());
    const Tensor back = be.download(dev);
    EXPECT_TRUE(testing::bit_equal(back, host)) << dtype_name(dt);
    // The raw-pointer overloads move exactly nbytes.
    std::vector<std::byte> raw(host.nbytes() + 1, std::byte{0x5A});
    be.download(dev, raw.data());
    EXPECT_EQ(std::memcmp(raw.data(), host.data(), host.nbytes()), 0) << dtype_name(dt);
    EXPECT_EQ(raw.back(), std::byte{0x5A}) << "download wrote past nbytes";
    const DTensor again = be.allocate(dt, {2, 3, 5});
    be.upload(again, host.data());
    EXPECT_TRUE(testing::bit_equal(be.download(again), host)) << dtype_name(dt);
  }
  const Tensor empty(DType::f16, {0, 4});  // nothing to move, and no error
  EXPECT_TRUE(testing::bit_equal(be.download(be.upload(empty)), empty));
}

TEST(ReferenceBackendMemory, FillRepeatsTheElementBitPattern) {
  ReferenceBackend be;
  struct Case {
    DType dt;
    std::uint32_t bits;
    std::uint32_t stored;
  };
  // Only the low dtype_size bytes are used: 0x1234FFC1 on bf16 stores 0xFFC1.
  const Case cases[] = {{DType::f16, 0x7E01u, 0x7E01u},         {DType::u32, 0xDEADBEEFu, 0xDEADBEEFu},
                        {DType::f32, 0x7FC00001u, 0x7FC00001u}, {DType::bf16, 0x1234FFC1u, 0xFFC1u},
                        {DType::i32, 0x80000000u, 0x80000000u}, {DType::u8, 0x1ABu, 0xABu}};
  for (const Case& c : cases) {
    const DTensor t = be.allocate(c.dt, {3, 7});
    be.fill(t, c.bits);
    const Tensor back = be.download(t);
    const std::size_t es = dtype_size(c.dt);
    for (Idx i = 0; i < back.numel(); ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, back.data() + static_cast<std::size_t>(i) * es, es);
      ASSERT_EQ(v, c.stored) << dtype_name(c.dt) << " element " << i;
    }
    if (c.dt == DType::f16) {
      EXPECT_TRUE(std::isnan(back.view().load(20))) << "0x7E01 is an f16 NaN (poison)";
    }
  }
}

TEST(ReferenceBackendMemory, TensorAtAByteOffsetTouchesOnlyItsRange) {
  ReferenceBackend be;
  const BufferPtr buf = be.allocate(256);
  const DTensor whole{buf, 0, DType::u8, {256}};
  be.fill(whole, 0xCC);
  const DTensor t{buf, 40, DType::f16, {2, 3}};  // bytes [40, 52)
  const Tensor host = patterned(DType::f16, {2, 3});
  be.upload(t, host.data());
  EXPECT_TRUE(testing::bit_equal(be.download(t), host));
  std::vector<std::uint8_t> bytes = bytes_of(buf);
  EXPECT_EQ(std::memcmp(bytes.data() + 40, host.data(), 12), 0) << "the tensor lives at byte 40";
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i < 40 || i >= 52) {
      ASSERT_EQ(bytes[i], 0xCC) << "byte " << i << " outside the tensor changed on upload";
    }
  }
  be.fill(t, 0x7E01);
  bytes = bytes_of(buf);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::uint8_t want = i < 40 || i >= 52 ? 0xCC : (i % 2 == 0 ? 0x01 : 0x7E);  // little-endian 0x7E01
    ASSERT_EQ(bytes[i], want) << "byte " << i << " after fill";
  }
  EXPECT_EQ(host_view(t).data, buf->host_data() + 40);
  EXPECT_EQ(host_cview(t).shape, (Shape{2, 3}));
}

// The VmFlags of the mapping holding address p, from /proc/self/smaps ("" if not found).
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find('-') < line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Tensors of 2 MiB and more start on a huge-page boundary and are advised for
// transparent huge pages (VmFlags "hg"), like kvlab_bench's baselines; small ones keep
// the 64-byte alignment; an impossible size is nullptr, not a wrapped small allocation.
TEST(ReferenceBackendMemory, LargeBuffersAreOfferedHugePages) {
  ReferenceBackend be;
  const BufferPtr small = be.allocate(100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small->host_data()) % 64, 0u);
  const BufferPtr large = be.allocate(kHugePageBytes + 100);
  EXPECT_EQ(large->size(), kHugePageBytes + 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large->host_data()) % kHugePageBytes, 0u);
  std::memset(large->host_data(), 1, large->size());  // every byte is ours
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages: nothing to advise";
  }
  if (!std::ifstream("/proc/self/smaps")) GTEST_SKIP() << "no /proc/self/smaps: the advice cannot be read back";
  const std::string flags = mapping_flags(large->host_data());
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "mapping of the 2 MiB buffer: " << flags;
  EXPECT_EQ(allocate_host_bytes(SIZE_MAX - 10), nullptr);
}

#if defined(__linux__)
// Resident 4 KiB pages of [p, p + bytes) by mincore; -1 where part of it is not mapped.
long resident_pages(const std::byte* p, std::size_t bytes) {
  const std::size_t pages = (bytes + 4095) / 4096;
  std::vector<unsigned char> vec(pages);
  if (::mincore(const_cast<std::byte*>(p), pages * 4096, vec.data()) != 0) return -1;
  long n = 0;
  for (const unsigned char v : vec) n += v & 1;
  return n;
}
#endif

// A large buffer is a fresh mapping every time, given back on free: glibc's heap serves
// a block of a size freed before (its mmap threshold moves up to each freed block's
// size) from pages already faulted in at 4 KiB, which huge-page advice does not
// convert, and kernels on such buffers ran up to 3x slower than on fresh ones. Sizes
// from 2 MiB to the 32 MiB the threshold can reach.
TEST(ReferenceBackendMemory, LargeBuffersAreFreshMappingsReturnedOnFree) {
#if !defined(__linux__)
  GTEST_SKIP() << "mincore and the mapping policy are Linux-only";
#else
  for (const std::size_t bytes : {kHugePageBytes, 3 * kHugePageBytes + 100, std::size_t{32} << 20}) {
    for (int round = 0; round < 3; ++round) {  // the first free moves glibc's threshold
      std::byte* const p = allocate_host_bytes(bytes);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(resident_pages(p, bytes), 0) << bytes << " bytes, round " << round << ": pages resident before use";
      std::memset(p, 1, bytes);
      EXPECT_EQ(resident_pages(p, bytes), static_cast<long>((bytes + 4095) / 4096));
#if defined(KVLAB_TEST_ASAN)
      // Not ASan's allocation: the mapping's tail past the last byte is poisoned by hand.
      if (bytes % 4096 != 0) EXPECT_TRUE(__asan_address_is_poisoned(p + bytes)) << bytes << " bytes";
      EXPECT_FALSE(__asan_address_is_poisoned(p + bytes - 1)) << bytes << " bytes";
#endif
      free_host_bytes(p, bytes);
      EXPECT_EQ(resident_pages(p, bytes), -1) << bytes << " bytes, round " << round << ": still mapped after free";
    }
  }
  free_host_bytes(nullptr, kHugePageBytes);  // a no-op, as std::free
#endif
}

TEST(ReferenceBackendMemory, HostViewRejectsOverrunsAndMissingBuffers) {
  ReferenceBackend be;
  const BufferPtr buf = be.allocate(64);
  host_view(DTensor{buf, 48, DType::f32, {4}});  // exactly fits: bytes [48, 64)
  host_view(DTensor{buf, 64, DType::f32, {0}});  // an empty tensor at the very end
  expect_error(
      [&] {
        host_view(DTensor{buf, 0, DType::f32, {4, 5}});
      },
      ErrorKind::shape_mismatch, {"(4, 5)", "f32", "offset 0", "buffer of 64 bytes"});
  expect_error(
      [&] {
        host_view(DTensor{buf, 56, DType::f32, {4}});
      },
      ErrorKind::shape_mismatch, {"offset 56", "64 bytes"});
  // offset past the end must not underflow size − offset into a huge "room left".
  expect_error([&] { host_cview(DTensor{buf, 100, DType::u8, {0}}); }, ErrorKind::shape_mismatch, {"offset 100"});
  expect_error([&] { host_view(DTensor{nullptr, 0, DType::f32, {2, 2}}); }, ErrorKind::misuse, {"no buffer", "(2, 2)"});

  // A buffer that is not host memory (as a device backend's would be).
  struct DeviceOnly final : Buffer {
    std::size_t size() const override { return 32; }
    std::byte* host_data() override { return nullptr; }
  };
  const DTensor remote{std::make_shared<DeviceOnly>(), 0, DType::u8, {8}};
  expect_error([&] { host_view(remote); }, ErrorKind::misuse, {"32 bytes", "not host-addressable"});

  // The backend's memory calls go through the same checks.
  const DTensor over{buf, 32, DType::u32, {9}};
  std::vector<std::byte> scratch(64);
  expect_error([&] { be.upload(over, scratch.data()); }, ErrorKind::shape_mismatch, {"offset 32"});
  expect_error([&] { be.download(over, scratch.data()); }, ErrorKind::shape_mismatch, {"offset 32"});
  expect_error([&] { be.fill(over, 0); }, ErrorKind::shape_mismatch, {"offset 32"});
  expect_error([&] { be.fill(remote, 0); }, ErrorKind::misuse, {"not host-addressable"});
}

// numel 2^62 fits int64, but numel · 4 used to wrap size_t to 0, so host_view accepted a
// tensor of 2^62 floats over a 64-byte buffer and a kernel could run off it.
TEST(ReferenceBackendMemory, HostViewRejectsAByteCountThatWraps) {
  ReferenceBackend be;
  const DTensor absurd{be.allocate(64), 0, DType::f32, {Idx{1} << 62}};
  expect_error([&] { host_view(absurd); }, ErrorKind::invalid_argument, {"4611686018427387904"});
}

// Kernels read elements through typed pointers, so a tensor must sit at a multiple of
// its element size.
TEST(ReferenceBackendMemory, HostViewRejectsAMisalignedOffset) {
  ReferenceBackend be;
  const DTensor skewed{be.allocate(64), 2, DType::f32, {4}};
  expect_error([&] { host_view(skewed); }, ErrorKind::invalid_argument, {"offset 2"});
}

// ---- cache data movement: the backend applies the oracle to its buffers ------------------

// One DTensor per host tensor, all inside one shared buffer at staggered offsets, so the
// kernels are also exercised on tensors that do not start at byte 0.
struct Arena {
  ReferenceBackend& be;
  BufferPtr buf = be.allocate(1 << 16);
  std::size_t next = 8;
  DTensor put(const Tensor& t) {
    DTensor d{buf, next, t.dtype(), t.shape()};
    be.upload(d, t.data());
    next += (t.nbytes() + 15) / 8 * 8;  // a gap after each tensor
    return d;
  }
};

Tensor i32(Shape shape, std::vector<std::int64_t> v) { return Tensor::from_ints(DType::i32, std::move(shape), v); }

TEST(ReferenceBackendKv, EveryKvKernelMatchesTheOracle) {
  ReferenceBackend be;
  for (DType dt : kAllDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Arena arena{be};
    const Tensor src = patterned(dt, {3, 2, 5, 4}, 0), dst0 = patterned(dt, {3, 2, 5, 4}, 1);
    const DTensor d_src = arena.put(src);

    const Tensor slots = i32({3, 2}, {4, 0, 1, 2, 0, 3});
    const Tensor chunk = patterned(dt, {3, 2, 2, 4}, 2);
    Tensor want = dst0;
    ref::kv_scatter(chunk.view(), slots.view(), want.view());
    DTensor d_dst = arena.put(dst0);
    be.kv_scatter({arena.put(chunk), slots.view(), d_dst});
    EXPECT_TRUE(testing::bit_equal(be.download(d_dst), want)) << "kv_scatter";

    const Tensor index = i32({4}, {2, 2, 0, 1});
    Tensor gathered = patterned(dt, {4, 2, 5, 4}, 3);
    const DTensor d_gathered = arena.put(gathered);
    ref::kv_gather(src.view(), index.view(), gathered.view());
    be.kv_gather({d_src, index.view(), d_gathered});
    EXPECT_TRUE(testing::bit_equal(be.download(d_gathered), gathered)) << "kv_gather";

    const std::vector<SeqBlock> blocks = {{2, 1, 0, 0, 3}, {0, 3, 1, 1, 2}, {1, 0, 0, 3, 2}};
    Tensor copied = patterned(dt, {2, 2, 6, 4}, 4);
    const DTensor d_copied = arena.put(copied);
    ref::kv_copy_blocks(src.view(), blocks, copied.view());
    be.kv_copy_blocks({d_src, blocks, d_copied});
    EXPECT_TRUE(testing::bit_equal(be.download(d_copied), copied)) << "kv_copy_blocks";

    const Tensor shifts = i32({3}, {-7, 2, 1000003});
    Tensor rolled = dst0;
    const DTensor d_rolled = arena.put(rolled);
    ref::kv_roll(src.view(), shifts.view(), rolled.view());
    be.kv_roll({d_src, shifts.view(), d_rolled});
    EXPECT_TRUE(testing::bit_equal(be.download(d_rolled), rolled)) << "kv_roll";
    EXPECT_TRUE(testing::bit_equal(be.download(d_src), src)) << "the source is read-only";
  }
}

TEST(ReferenceBackendKv, InvalidInputRaisesTheOracleError) {
  ReferenceBackend be;
  const Tensor src = patterned(DType::u32, {2, 1, 2, 3});
  const DTensor d_src = be.upload(src), d_dst = be.allocate(DType::u32, {2, 1, 4, 3});
  expect_error(
      [&] {
        be.kv_scatter({d_src, i32({2, 2}, {0, 1, 4, 0}).view(), d_dst});
      },
      ErrorKind::invalid_argument, {"slot 4", "batch row 1"});
  expect_error(
      [&] {
        be.kv_gather({d_src, i32({2}, {0, 2}).view(), be.allocate(DType::u32, {2, 1, 2, 3})});
      },
      ErrorKind::invalid_argument, {"batch_index[1] = 2"});
  const std::vector<SeqBlock> negative = {{0, 0, 0, 0, -3}};
  expect_error([&] { be.kv_copy_blocks({d_src, negative, d_dst}); }, ErrorKind::invalid_argument, {"negative length -3"});
  expect_error(
      [&] {
        be.kv_roll({d_src, i32({3}, {0, 0, 0}).view(), be.allocate(DType::u32, {2, 1, 2, 3})});
      },
      ErrorKind::shape_mismatch, {"shifts", "(3,)"});
  // Two DTensors over overlapping bytes of one buffer are aliases; disjoint ones are not.
  const BufferPtr buf = be.allocate(96);
  const DTensor a{buf, 0, DType::u32, {2, 1, 2, 3}}, b{buf, 24, DType::u32, {2, 1, 2, 3}},
      c{buf, 48, DType::u32, {2, 1, 2, 3}};
  const Tensor zeros = i32({2}, {0, 0});
  expect_error([&] { be.kv_roll({a, zeros.view(), b}); }, ErrorKind::invalid_argument, {"overlaps dst"});
  be.kv_roll({a, zeros.view(), c});
  // Memory-layer errors surface before the kernel runs.
  expect_error([&] { be.kv_roll({DTensor{}, zeros.view(), c}); }, ErrorKind::misuse, {"no buffer"});
}

}  // namespace
}  // namespace test_reference_backend
}  // namespace kvlab

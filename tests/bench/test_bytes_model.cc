// The bytes model (bench/bytes_model.h) against two independent sources: for ops that
// touch every element of every operand, the sum of the operand sizes the harness
// prepares (harness/ops/*: a different author's shapes and dtypes); for the rest, and
// for the flop counts, numbers derived by hand in the comments.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "bench/bytes_model.h"
#include "harness/op.h"
#include "tests/unit/test_util.h"

namespace kvlab::bench {
namespace {

std::int64_t prepared_bytes(const harness::Problem& p) {
  const harness::Prepared prep = harness::find_op(p.op()).prepare(p);
  std::int64_t total = 0;
  for (const Tensor& t : prep.inputs) total += static_cast<std::int64_t>(t.nbytes());
  for (const harness::OutputSlot& s : prep.outputs) total += static_cast<std::int64_t>(shape_nbytes(s.shape, s.dtype));
  return total;
}

TEST(BytesModel, EqualsThePreparedOperandsWhenEveryElementIsTouched) {
  const char* lines[] = {
      "affine_quantize B=2 H=3 T=5 D=128 bits=3 group=32 dtype=f16",
      "affine_quantize B=1 H=2 T=4 D=128 bits=8 group=128 dtype=f32",
      "affine_quantize B=1 H=1 T=3 D=64 bits=5 group=64 dtype=bf16",
      "affine_dequantize B=1 H=2 T=4 D=128 bits=4 group=64 dtype=f16",
      "affine_dequantize B=2 H=1 T=3 D=96 bits=6 group=32 dtype=f32",
      "fp_quantize B=1 H=2 T=4 D=64 mode=mxfp4 dtype=bf16",
      "fp_quantize B=1 H=2 T=4 D=64 mode=mxfp8 dtype=f16",
      "fp_dequantize B=1 H=2 T=4 D=64 mode=nvfp4 dtype=f32",
      "rope B=2 H=3 T=4 D=64 dims=32 dtype=bf16",
      "rope B=3 H=1 T=2 D=16 dims=16 dtype=f32 per_row=1",
      "sdpa B=2 Hq=4 Hkv=2 Lq=3 Lk=7 Dk=32 Dv=16 dtype=f16 mask=none",
      "sdpa B=1 Hq=2 Hkv=1 Lq=2 Lk=5 Dk=16 Dv=16 dtype=f32 mask=bool sinks=1",
      "sdpa B=2 Hq=2 Hkv=2 Lq=2 Lk=5 Dk=16 Dv=8 dtype=bf16 mask=additive",
      "quantized_sdpa B=1 Hq=4 Hkv=2 Lq=1 Lk=9 Dk=64 Dv=128 dtype=f16 kbits=4 vbits=8 kgroup=32 vgroup=64",
      "quantized_sdpa B=1 Hq=2 Hkv=1 Lq=2 Lk=5 Dk=64 Dv=64 dtype=bf16 kmode=mxfp4 kbits=4 kgroup=32 "
      "vmode=nvfp4 vbits=4 vgroup=16",
      "kv_roll B=3 H=2 L=7 W=32 dtype=u8 shift=2",
  };
  for (const char* line : lines) {
    const harness::Problem p = harness::parse_problem(line);
    EXPECT_EQ(traffic_of(p).bytes(), prepared_bytes(p)) << line;
  }
}

TEST(BytesModel, DataMovementCreditsOnlyTheMovedRows) {
  // kv_scatter B=2 H=3 S=4 W=8 f16: moved 2·3·4·8·2 = 384 bytes read and written, plus
  // the (B, S) i32 slots, 2·4·4 = 32; the 16-slot destination is otherwise untouched.
  const Traffic s = traffic_of(harness::parse_problem("kv_scatter B=2 H=3 S=4 L=16 W=8 dtype=f16"));
  EXPECT_EQ(s.read_bytes, 416);
  EXPECT_EQ(s.write_bytes, 384);
  // kv_copy_blocks: 3 blocks · H 2 · len 4 · W 64 · 4 bytes = 6144 each way.
  const Traffic c = traffic_of(
      harness::parse_problem("kv_copy_blocks Bs=2 Bd=2 H=2 Ls=16 Ld=16 W=64 blocks=3 len=4 dtype=f32"));
  EXPECT_EQ(c.read_bytes, 6144);
  EXPECT_EQ(c.write_bytes, 6144);
  // kv_gather Bs=3 → Bd=2: only the 2 gathered rows of H 2 · L 5 · W 64 f16 are read,
  // 2560 bytes, plus 2 i32 indices; 2560 written.
  const Traffic g = traffic_of(harness::parse_problem("kv_gather Bs=3 Bd=2 H=2 L=5 W=64 dtype=f16"));
  EXPECT_EQ(g.read_bytes, 2568);
  EXPECT_EQ(g.write_bytes, 2560);
}

TEST(BytesModel, PackedSizesByHand) {
  // Llama-3 8B K at 65536 tokens, 8 heads × 128, affine 4-bit group 64, f16 scales and
  // biases: codes 8·65536·128/2 = 32 MiB, scales + biases 8·65536·2 groups·2 B·2 = 4 MiB.
  const Traffic q = traffic_of(harness::parse_problem(
      "quantized_sdpa B=1 Hq=32 Hkv=8 Lq=1 Lk=65536 Dk=128 Dv=128 dtype=f16 kbits=4 vbits=4 kgroup=64 vgroup=64"));
  const std::int64_t side = (32 + 4) * (std::int64_t{1} << 20);
  const std::int64_t q_bytes = 32 * 128 * 2;  // and out: the same
  EXPECT_EQ(q.read_bytes, 2 * side + q_bytes);
  EXPECT_EQ(q.write_bytes, q_bytes);
  // mxfp8 over x (1, 1, 2, 64) bf16: reads 256 B; writes 128 codes + 4 E8M0 scales.
  const Traffic f = traffic_of(harness::parse_problem("fp_quantize B=1 H=1 T=2 D=64 mode=mxfp8 dtype=bf16"));
  EXPECT_EQ(f.read_bytes, 256);
  EXPECT_EQ(f.write_bytes, 132);
}

TEST(BytesModel, FlopsByHand) {
  // Attention: 2·(Dk + Dv) per (b, head, query, key) = 2·10·(1·2·3·5) = 600.
  EXPECT_EQ(traffic_of(harness::parse_problem("sdpa B=1 Hq=2 Hkv=1 Lq=3 Lk=5 Dk=4 Dv=6")).flops, 600);
  // rope: 6 rows, 4 rotated features each, 3 flops per rotated feature = 72.
  EXPECT_EQ(traffic_of(harness::parse_problem("rope B=1 H=2 T=3 D=8 dims=4")).flops, 72);
  // affine quantize / dequantize: 2 per element, 4·64 elements.
  EXPECT_EQ(traffic_of(harness::parse_problem("affine_quantize B=1 H=1 T=4 D=64")).flops, 512);
  EXPECT_EQ(traffic_of(harness::parse_problem("affine_dequantize B=1 H=1 T=4 D=64")).flops, 512);
  EXPECT_EQ(traffic_of(harness::parse_problem("kv_roll B=1 H=1 L=4 W=8")).flops, 0);
}

TEST(BytesModel, EveryKernelOpHasAModelAndAnUnknownOneIsNamed) {
  // Ops that are not one kernel call (cache-level scripts) are the documented exception;
  // any other op the harness gains must get a model here, or this fails.
  const std::set<std::string> not_kernels{"cache"};
  for (const harness::OpInfo* op : harness::all_ops()) {
    const std::string name(op->name());
    EXPECT_EQ(has_traffic_model(name), !not_kernels.count(name)) << name;
    if (not_kernels.count(name)) continue;
    EXPECT_GT(traffic_of(harness::parse_problem(name)).bytes(), 0) << name;
  }
  EXPECT_KVLAB_ERROR(traffic_of(harness::Problem("no_such_op", {})), invalid_argument, "no_such_op");
}

}  // namespace
}  // namespace kvlab::bench

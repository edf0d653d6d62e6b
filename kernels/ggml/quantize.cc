// quantize / dequantize of ggml's block formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)
// through ggml's own type traits: quantize with the CPU backend's from_float
// (ggml_get_type_traits_cpu — what llama.cpp's K/V cache writes use, set_rows and cpy),
// dequantize with ggml's to_float. Rows go through ggml's block structs and back into
// kvlab's packed layout (codes bitstream, f16 d and m: reference/ggml_quantize.h), a
// mapping of bytes, not arithmetic. ggml quantizes f32: an f16/bf16 x is widened exactly;
// ggml dequantizes to f32: an f16/bf16 out is its one rounding (RNE). The affine and fp
// formats are not ggml's: UNIMPLEMENTED.
#include <cstring>
#include <vector>

#include "kernels/ggml/ggml_ops.h"
#include "kvlab/host_buffer.h"
#include "reference/bitpack.h"
#include "reference/ggml_quantize.h"
#include "reference/quantize.h"

namespace kvlab::ggmlk {

ggml_type block_type(QuantMode mode) {
  switch (mode) {
    case QuantMode::q8_0: return GGML_TYPE_Q8_0;
    case QuantMode::q4_0: return GGML_TYPE_Q4_0;
    case QuantMode::q4_1: return GGML_TYPE_Q4_1;
    case QuantMode::q5_0: return GGML_TYPE_Q5_0;
    case QuantMode::q5_1: return GGML_TYPE_Q5_1;
    case QuantMode::iq4_nl: return GGML_TYPE_IQ4_NL;
    default: break;
  }
  fail(ErrorKind::unsupported, cat("ggml: ", quant_mode_name(mode), " is not a ggml block format"));
}

namespace {

void require_ggml_format(const QuantSpec& spec, const char* op) {
  KVLAB_REQUIRE(spec.format().encoder == QuantEncoder::ggml, unsupported, "ggml: ", op, " of ", to_string(spec),
                " (not a ggml block format: ggml has no affine or microscaling formats)");
}

std::size_t row_bytes(ggml_type t, std::int64_t d) { return ggml_row_size(t, d); }

}  // namespace

void row_to_blocks(const QuantizedView& t, std::int64_t r, std::uint8_t* dst, std::vector<std::uint8_t>& codes) {
  const QuantMode mode = t.spec.mode;
  const std::int64_t words = t.wq.shape.back(), groups = t.scales.shape.back();
  const std::size_t block_bytes = ref::ggml_block_bytes(mode);
  codes.resize(static_cast<std::size_t>(groups * ref::kGgmlBlock));
  ref::unpack_codes(std::span<const std::uint32_t>(t.wq.as<const std::uint32_t>() + r * words,
                                                   static_cast<std::size_t>(words)),
                    t.spec.bits, codes);
  const auto* scales = t.scales.as<const std::uint16_t>() + r * groups;
  const auto* biases = t.spec.has_biases() ? t.biases.as<const std::uint16_t>() + r * groups : nullptr;
  for (std::int64_t g = 0; g < groups; ++g) {
    ref::GgmlBlock block;
    std::memcpy(block.codes.data(), codes.data() + g * ref::kGgmlBlock, ref::kGgmlBlock);
    block.d = scales[g];
    block.m = biases != nullptr ? biases[g] : 0;
    const std::vector<std::uint8_t> bytes = ref::ggml_block_to_bytes(mode, block);
    std::memcpy(dst + static_cast<std::size_t>(g) * block_bytes, bytes.data(), block_bytes);
  }
}

void quantize(const QuantizeArgs& a) {
  const ConstTensorView x = host_cview(a.x);
  const QuantizedMutView out = host_view(a.out);
  // The oracle's checks, in its order, so the same calls fail the same way.
  ref::validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  ref::validate_rounding(out.spec, a.rounding, "quantize");
  require_ggml_format(out.spec, "quantize");
  ref::validate_ggml_quantize(x, out.spec, out.wq, out.scales, out.biases);
  if (x.numel() == 0) return;
  const QuantMode mode = out.spec.mode;
  const ggml_type type = block_type(mode);
  // Rounding::ggml_cpu: the CPU backend's quantizer (what llama.cpp's K/V writes run);
  // any other flavour: ggml's C reference (kvlab/quant_spec.h).
  const ggml_from_float_t from_float = a.rounding == Rounding::ggml_cpu ? ggml_get_type_traits_cpu(type)->from_float
                                                                        : ggml_get_type_traits(type)->from_float_ref;
  KVLAB_REQUIRE(from_float != nullptr, unsupported, "ggml: no ", rounding_name(a.rounding), " from_float for ",
                quant_mode_name(mode));
  const std::int64_t d = x.shape.back(), rows = x.numel() / d, blocks = d / ref::kGgmlBlock;
  const std::int64_t words = out.wq.shape.back();
  const std::size_t block_bytes = ref::ggml_block_bytes(mode);
  std::vector<float> row(static_cast<std::size_t>(d));
  std::vector<std::uint8_t> bytes(row_bytes(type, d)), codes(static_cast<std::size_t>(d));
  auto* wq = out.wq.as<std::uint32_t>();
  auto* scales = out.scales.as<std::uint16_t>();
  auto* biases = out.spec.has_biases() ? out.biases.as<std::uint16_t>() : nullptr;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < d; ++i) row[static_cast<std::size_t>(i)] = x.load(r * d + i);
    from_float(row.data(), bytes.data(), d);
    for (std::int64_t b = 0; b < blocks; ++b) {
      const ref::GgmlBlock block = ref::ggml_block_from_bytes(
          mode, std::span<const std::uint8_t>(bytes.data() + static_cast<std::size_t>(b) * block_bytes, block_bytes));
      std::memcpy(codes.data() + b * ref::kGgmlBlock, block.codes.data(), ref::kGgmlBlock);
      scales[r * blocks + b] = block.d;
      if (biases != nullptr) biases[r * blocks + b] = block.m;
    }
    ref::pack_codes(codes, out.spec.bits, std::span<std::uint32_t>(wq + r * words, static_cast<std::size_t>(words)));
  }
}

void dequantize(const DequantizeArgs& a) {
  const QuantizedView in = host_cview(a.in);
  const TensorView out = host_view(a.out);
  ref::validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  require_ggml_format(in.spec, "dequantize");
  ref::validate_ggml_dequantize(in.wq, in.scales, in.biases, in.spec, out);
  if (out.numel() == 0) return;
  const QuantMode mode = in.spec.mode;
  const ggml_type type = block_type(mode);
  const ggml_to_float_t to_float = ggml_get_type_traits(type)->to_float;
  KVLAB_REQUIRE(to_float != nullptr, unsupported, "ggml: no to_float for ", quant_mode_name(mode));
  const std::int64_t d = out.shape.back(), rows = out.numel() / d;
  std::vector<float> row(static_cast<std::size_t>(d));
  std::vector<std::uint8_t> bytes(row_bytes(type, d)), codes;
  for (std::int64_t r = 0; r < rows; ++r) {
    row_to_blocks(in, r, bytes.data(), codes);
    to_float(bytes.data(), row.data(), d);
    for (std::int64_t i = 0; i < d; ++i) out.store(r * d + i, row[static_cast<std::size_t>(i)]);
  }
}

}  // namespace kvlab::ggmlk

#include "kvlab/quant_spec.h"

#include <algorithm>
#include <span>

#include "kvlab/error.h"

namespace kvlab {

std::string_view rounding_name(Rounding r) {
  switch (r) {
    case Rounding::mlx_cpu: return "mlx_cpu";
    case Rounding::mlx_gpu: return "mlx_gpu";
    case Rounding::mlx: return "mlx";
    case Rounding::ggml_ref: return "ggml_ref";
    case Rounding::ggml_cpu: return "ggml_cpu";
  }
  return "?";
}

Rounding rounding_from_name(std::string_view name) {
  if (name == "mlx_cpu") return Rounding::mlx_cpu;
  if (name == "mlx_gpu") return Rounding::mlx_gpu;
  if (name == "mlx") return Rounding::mlx;
  if (name == "ggml_ref") return Rounding::ggml_ref;
  if (name == "ggml_cpu") return Rounding::ggml_cpu;
  fail(ErrorKind::invalid_argument,
       cat("unknown rounding '", name, "' (expected mlx_cpu, mlx_gpu, mlx, ggml_ref or ggml_cpu)"));
}

namespace {

constexpr int kAffineGroups[] = {32, 64, 128};
// MLX 0.32.4 accepts 1-bit affine (measured with mx.quantize; MLX's older sources
// listed 2..8): the real library wins.
constexpr int kAffineBits[] = {1, 2, 3, 4, 5, 6, 8};
constexpr int kGroup32[] = {32}, kGroup16[] = {16}, kBits4[] = {4}, kBits5[] = {5}, kBits8[] = {8};

// The format table (docs/quantization.md §Format table), in QuantMode order.
constexpr QuantFormat kFormats[] = {
    {QuantMode::affine, "affine", QuantEncoder::affine, kAffineBits, kAffineGroups, 4, 64, true,
     ScaleEncoding::input_dtype, ElementEncoding::unsigned_int, false},
    {QuantMode::mxfp4, "mxfp4", QuantEncoder::fp, kBits4, kGroup32, 4, 32, false, ScaleEncoding::e8m0,
     ElementEncoding::e2m1, false},
    {QuantMode::mxfp8, "mxfp8", QuantEncoder::fp, kBits8, kGroup32, 8, 32, false, ScaleEncoding::e8m0,
     ElementEncoding::e4m3, false},
    {QuantMode::nvfp4, "nvfp4", QuantEncoder::fp, kBits4, kGroup16, 4, 16, false, ScaleEncoding::e4m3,
     ElementEncoding::e2m1, true},
    // ggml's block formats (docs/quantization.md §ggml block formats): one block of 32 per
    // group, an f16 scale d (and an f16 min m as the bias of q4_1/q5_1).
    {QuantMode::q8_0, "q8_0", QuantEncoder::ggml, kBits8, kGroup32, 8, 32, false, ScaleEncoding::f16,
     ElementEncoding::signed_int, false},
    {QuantMode::q4_0, "q4_0", QuantEncoder::ggml, kBits4, kGroup32, 4, 32, false, ScaleEncoding::f16,
     ElementEncoding::offset_int, false},
    {QuantMode::q4_1, "q4_1", QuantEncoder::ggml, kBits4, kGroup32, 4, 32, true, ScaleEncoding::f16,
     ElementEncoding::unsigned_int, false},
    {QuantMode::q5_0, "q5_0", QuantEncoder::ggml, kBits5, kGroup32, 5, 32, false, ScaleEncoding::f16,
     ElementEncoding::offset_int, false},
    {QuantMode::q5_1, "q5_1", QuantEncoder::ggml, kBits5, kGroup32, 5, 32, true, ScaleEncoding::f16,
     ElementEncoding::unsigned_int, false},
    {QuantMode::iq4_nl, "iq4_nl", QuantEncoder::ggml, kBits4, kGroup32, 4, 32, false, ScaleEncoding::f16,
     ElementEncoding::iq4nl_table, false},
};

std::string list(std::span<const int> xs) {
  std::string out;
  for (int x : xs) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

}  // namespace

std::span<const QuantFormat> quant_formats() { return kFormats; }

const QuantFormat& quant_format(QuantMode m) {
  for (const QuantFormat& f : kFormats) {
    if (f.mode == m) return f;
  }
  fail(ErrorKind::invalid_argument, cat("invalid quantization mode ", static_cast<int>(m)));
}

std::vector<std::string> quant_mode_names() {
  std::vector<std::string> out;
  for (const QuantFormat& f : kFormats) out.emplace_back(f.name);
  return out;
}

std::string_view quant_mode_name(QuantMode m) {
  for (const QuantFormat& f : kFormats) {
    if (f.mode == m) return f.name;
  }
  return "?";
}

QuantMode quant_mode_from_name(std::string_view name) {
  std::string names;
  for (const QuantFormat& f : kFormats) {
    if (f.name == name) return f.mode;
    names += (names.empty() ? "" : ", ") + std::string(f.name);
  }
  fail(ErrorKind::invalid_argument, cat("unknown quantization mode '", name, "' (expected ", names, ")"));
}


QuantSpec QuantSpec::make(QuantMode mode, std::optional<int> bits, std::optional<int> group_size) {
  const QuantFormat& t = quant_format(mode);
  QuantSpec s{mode, bits.value_or(t.default_bits), group_size.value_or(t.default_group)};
  s.validate();
  return s;
}

void QuantSpec::validate() const {
  const QuantFormat& t = quant_format(mode);
  KVLAB_REQUIRE(std::find(t.bits.begin(), t.bits.end(), bits) != t.bits.end(), invalid_argument, "bits ", bits,
                " is not supported for mode ", quant_mode_name(mode), " (allowed: ", list(t.bits), ")");
  KVLAB_REQUIRE(std::find(t.groups.begin(), t.groups.end(), group_size) != t.groups.end(), invalid_argument,
                "group_size ", group_size, " is not supported for mode ", quant_mode_name(mode), " (allowed: ",
                list(t.groups), ")");
}

void QuantSpec::validate_dim(std::int64_t d) const {
  validate();
  KVLAB_REQUIRE(d > 0, invalid_argument, "last dimension ", d, " must be positive to quantize");
  KVLAB_REQUIRE(d % group_size == 0, invalid_argument, "last dimension ", d, " is not a multiple of group_size ",
                group_size);
}

std::int64_t QuantSpec::packed_words(std::int64_t d) const {
  validate_dim(d);
  // Divide first so a huge valid D cannot overflow; exact because group_size·bits is a
  // multiple of 32 for every table entry.
  return (d / group_size) * (group_size * bits / 32);
}

std::int64_t QuantSpec::groups(std::int64_t d) const {
  validate_dim(d);
  return d / group_size;
}

double QuantSpec::bits_per_element(DType input) const {
  validate();
  KVLAB_REQUIRE(is_float(input), dtype_mismatch, "bits_per_element needs a float input dtype, got ",
                dtype_name(input));
  const double meta_bits = static_cast<double>(dtype_size(scale_dtype(input)) * 8) * (has_biases() ? 2 : 1);
  return bits + meta_bits / group_size;
}

std::string to_string(const QuantSpec& s) {
  return cat(quant_mode_name(s.mode), ":b", s.bits, ":g", s.group_size);
}

}  // namespace kvlab

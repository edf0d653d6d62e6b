#include "kvlab/quant_spec.h"

#include <algorithm>
#include <span>

#include "kvlab/error.h"

namespace kvlab {

std::string_view quant_mode_name(QuantMode m) {
  switch (m) {
    case QuantMode::affine: return "affine";
    case QuantMode::mxfp4: return "mxfp4";
    case QuantMode::mxfp8: return "mxfp8";
    case QuantMode::nvfp4: return "nvfp4";
  }
  return "?";
}

QuantMode quant_mode_from_name(std::string_view name) {
  for (QuantMode m : {QuantMode::affine, QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4}) {
    if (quant_mode_name(m) == name) return m;
  }
  fail(ErrorKind::invalid_argument, cat("unknown quantization mode '", name, "' (expected affine, mxfp4, mxfp8, nvfp4)"));
}

std::string_view rounding_name(Rounding r) { return r == Rounding::mlx_cpu ? "mlx_cpu" : "mlx_gpu"; }

Rounding rounding_from_name(std::string_view name) {
  if (name == "mlx_cpu") return Rounding::mlx_cpu;
  if (name == "mlx_gpu") return Rounding::mlx_gpu;
  fail(ErrorKind::invalid_argument, cat("unknown rounding '", name, "' (expected mlx_cpu or mlx_gpu)"));
}

namespace {

// Spans over static arrays: an initializer_list member would dangle once table() returns.
struct ModeTable {
  std::span<const int> groups;
  std::span<const int> bits;
  int default_group, default_bits;
};

constexpr int kAffineGroups[] = {32, 64, 128};
constexpr int kAffineBits[] = {2, 3, 4, 5, 6, 8};
constexpr int kGroup32[] = {32}, kGroup16[] = {16}, kBits4[] = {4}, kBits8[] = {8};

// spec §1.1: MLX's validation table.
ModeTable table(QuantMode m) {
  switch (m) {
    case QuantMode::affine: return {kAffineGroups, kAffineBits, 64, 4};
    case QuantMode::mxfp4: return {kGroup32, kBits4, 32, 4};
    case QuantMode::mxfp8: return {kGroup32, kBits8, 32, 8};
    case QuantMode::nvfp4: return {kGroup16, kBits4, 16, 4};
  }
  fail(ErrorKind::invalid_argument, cat("invalid quantization mode ", static_cast<int>(m)));
}

std::string list(std::span<const int> xs) {
  std::string out;
  for (int x : xs) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

}  // namespace

QuantSpec QuantSpec::make(QuantMode mode, std::optional<int> bits, std::optional<int> group_size) {
  const ModeTable t = table(mode);
  QuantSpec s{mode, bits.value_or(t.default_bits), group_size.value_or(t.default_group)};
  s.validate();
  return s;
}

void QuantSpec::validate() const {
  const ModeTable t = table(mode);
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

#include "cache/cache.h"

namespace kvlab {

FetchedKV Cache::update(const DTensor&, const DTensor&) {
  // mlx-swift-lm#71 / SwiftLM#71: models called update on a QuantizedKVCache and the
  // process died with a fatalError. Here it is a recoverable, named misuse.
  fail(ErrorKind::misuse, cat("update() called on ", class_name(),
                              ", which stores quantized data; use update_quantized()"));
}

FetchedQuantizedKV Cache::update_quantized(const DTensor&, const DTensor&) {
  fail(ErrorKind::misuse, cat("update_quantized() called on ", class_name(),
                              ", which stores plain data; use update()"));
}

std::uint32_t nan_poison_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7fc00000u;
    case DType::f16: return 0x7e00u;
    case DType::bf16: return 0x7fc0u;
    default: fail(ErrorKind::dtype_mismatch, cat("NaN poison needs a float dtype, got ", dtype_name(dtype)));
  }
}

}  // namespace kvlab

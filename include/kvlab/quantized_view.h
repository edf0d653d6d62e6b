// Host views of a packed tensor of any quantization format (kvlab/quant_spec.h): what
// host kernels (reference, SIMD) read and write.
#pragma once

#include <optional>

#include "kvlab/quant_spec.h"
#include "kvlab/tensor.h"

namespace kvlab {

struct QuantizedView {
  ConstTensorView wq, scales, biases;  // biases.data == nullptr for formats without biases
  QuantSpec spec;
  std::optional<float> global_scale;   // nvfp4 only
};

struct QuantizedMutView {
  TensorView wq, scales, biases;
  QuantSpec spec;
  std::optional<float> global_scale;
};

}  // namespace kvlab

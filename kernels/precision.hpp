// Compute precision of a run. In bf16 the CPU kernels emulate bf16 by rounding fp32 values at
// the points MODELS.md §10.1.12 lists; everything between those points is fp32.
#pragma once
#include <stdexcept>
#include <string>

#include "kernels/tensor.hpp"

namespace atl {

enum class Precision { fp32, bf16 };

inline Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  throw std::invalid_argument("precision: expected fp32 or bf16, got '" + s + "'");
}
inline const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "bf16"; }
// The dtype bulk values and activations have in a run of this precision.
inline DType compute_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

// The emulation point: round to bf16 in precision bf16, leave as is in fp32.
inline void round_activation(Precision p, const Tensor& t) {
  if (p == Precision::bf16) round_to_bf16_inplace(t);
}
inline float round_activation(Precision p, float x) { return p == Precision::bf16 ? round_to_bf16(x) : x; }

}  // namespace atl

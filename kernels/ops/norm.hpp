// RMSNorm with or without gamma over the last dimension.
#pragma once
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct RmsNormForward {
  Tensor y;     // same shape as x
  Tensor rstd;  // f32 [rows]: 1 / sqrt(mean(x^2) + eps), saved for backward
};

// weight: [dim] or undefined (no gamma).
RmsNormForward rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Precision precision);
// Returns dx; accumulates dweight when both weight and dweight are given.
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor* dweight);

}  // namespace atl

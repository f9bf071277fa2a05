// Small elementwise ops the models share (residual combinations).
#pragma once
#include <vector>
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// ca * a + cb * b in fp32, rounded once (bf16 precision): the depth-scaled residual.
Tensor scaled_add(const Tensor& a, float ca, const Tensor& b, float cb, Precision precision);
// c * a as a new tensor.
Tensor scaled(const Tensor& a, float c);
void scale_inplace(const Tensor& t, float factor);
// dst += src (f32, same shape).
void add_inplace(const Tensor& dst, const Tensor& src);
// The parts' rows one after another (f32 [R_i, ...] with equal trailing dims, or [R_i]).
Tensor concat_rows(const std::vector<Tensor>& parts);

}  // namespace atl

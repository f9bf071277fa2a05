// Small pieces every family's model code uses: declaring a parameter, and the bf16 emulation
// point after a projection (MODELS.md §10.1.12).
#pragma once
#include <string>
#include <utility>

#include "graph/param.hpp"
#include "kernels/ops/matmul.hpp"
#include "kernels/precision.hpp"

namespace atl {

// Matrices decay, vectors (norms, biases, sinks) do not.
inline ParamSpec make_param(std::string name, Shape shape, Init init = Init::normal, bool island = false) {
  ParamSpec s;
  s.name = std::move(name);
  s.weight_decay = shape.size() >= 2;
  s.shape = std::move(shape);
  s.init = init;
  s.island = island;
  return s;
}

// The tensor rounded at an emulation point (unchanged in fp32).
inline Tensor rounded(Tensor t, Precision p) {
  round_activation(p, t);
  return t;
}

// A copy of t rounded at an emulation point: in bf16 one pass (bf16_rounded), not a copy and
// then a rounding pass; in fp32 a plain copy.
inline Tensor rounded_copy(const Tensor& t, Precision p) {
  return p == Precision::bf16 ? bf16_rounded(t) : t.clone();
}

// A bulk linear output: x @ w^T, rounded in bf16 (by the GEMM, as it finishes each block).
// bf16: both operands are bf16 values (rounded input, bulk weight), so the bf16-operand GEMM.
inline Tensor project(const Tensor& x, const Tensor& w, Precision p) {
  return linear_forward(x, w, p, p == Precision::bf16);
}

// The backward of project: dx returned, dw accumulated. bf16: the incoming gradient is read as
// bf16 by both products (autograd's gradient of a bf16 output is bf16); dx and dw stay fp32.
inline Tensor project_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dw, Precision p) {
  return linear_backward(x, w, dy, dw, p);
}

}  // namespace atl

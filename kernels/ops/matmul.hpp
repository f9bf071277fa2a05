// Dense projections, PyTorch Linear convention: y = x @ w^T with w[out, in], through atoll's
// batch-invariant GEMM (kernels/cpu/gemm.hpp): a row's result never depends on the other rows.
// Tensors may be f32 or bf16; accumulation is fp32.
#pragma once
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// x[..., in], w[out, in] -> y[..., out]. Precision bf16: a bulk projection, both operands read as
// bf16 (the bf16-operand GEMM path; values that are already bf16 are unchanged), fp32 result,
// rounded to bf16 inside the GEMM when round_output is set (cpu::GemmShape::round_bf16).
Tensor linear_forward(const Tensor& x, const Tensor& w, Precision operands = Precision::fp32,
                      bool round_output = false);
// Returns dx[..., in]; accumulates dw[out, in] += dy^T x when dw is given. Precision bf16: the
// backward of a bf16-operand projection, its products with bf16 operands (dy read as bf16).
Tensor linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dw,
                       Precision operands = Precision::fp32);

// Plain a[M,K] @ b[K,N] -> [M,N] (f32 or bf16 operands; result f32).
Tensor matmul(const Tensor& a, const Tensor& b);
// Returns da = dc @ b^T [M,K]; accumulates db[K,N] += a^T @ dc when db is given.
Tensor matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dc, const Tensor* db);

}  // namespace atl

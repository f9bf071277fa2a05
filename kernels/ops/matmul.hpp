// Dense projections, PyTorch Linear convention: y = x @ w^T with w[out, in].
// fp32 through OpenBLAS sgemm; bf16 operands are upcast to fp32 first (fp32 accumulation).
#pragma once
#include "kernels/tensor.hpp"

namespace atl {

// x[..., in], w[out, in] -> y[..., out]
Tensor linear_forward(const Tensor& x, const Tensor& w);
// Returns dx[..., in]; accumulates dw[out, in] += dy^T x when dw is given.
Tensor linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dw);

// Plain a[M,K] @ b[K,N] -> [M,N] (f32 or bf16 operands; result f32).
Tensor matmul(const Tensor& a, const Tensor& b);
// Returns da = dc @ b^T [M,K]; accumulates db[K,N] += a^T @ dc when db is given.
Tensor matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dc, const Tensor* db);

}  // namespace atl

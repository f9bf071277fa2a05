// Row-major GEMM on raw pointers for float (cblas_sgemm) and double (cblas_dgemm):
// C[M,N] = alpha * op(A) @ op(B) + beta * C, op = optional transpose. Leading dimensions are the
// row strides of the matrices as stored. Double exists for finite-difference reference checks.
#pragma once
#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace atl::cpu {

// OpenBLAS splits a GEMM differently for different thread counts, and the last bits of the result
// follow the split. Training runs use one BLAS thread so results do not depend on the machine's
// core count; simulated ranks (and detached compute actors) are the parallelism.
inline void use_one_blas_thread() { openblas_set_num_threads(1); }

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (m == 0 || n == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }
}

// y[N,out] = x[N,in] @ w[out,in]^T   (PyTorch Linear convention)
template <class T>
void linear_forward(const T* x, const T* w, T* y, std::int64_t rows, std::int64_t in, std::int64_t out) {
  gemm<T>(false, true, rows, out, in, T(1), x, in, w, in, T(0), y, out);
}

// dx[N,in] = dy @ w (overwritten); dw[out,in] += dy^T @ x (accumulated). Either may be null.
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, std::int64_t rows, std::int64_t in,
                     std::int64_t out) {
  if (dx) gemm<T>(false, false, rows, in, out, T(1), dy, out, w, in, T(0), dx, in);
  if (dw) gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dw, in);
}

}  // namespace atl::cpu

// atoll's own GEMM: C[M,N] (+)= op(A)[M,K] · op(B)[K,N], row-major, op = optional transpose,
// leading dimensions are row strides as stored.
//
// Batch invariance by construction: every C[i,j] is one chain of fused multiply-adds over k in a
// fixed order, started from 0 (or from C[i,j] when accumulating), whatever M, N, the tile or edge
// the element falls in, the kernel's instruction set or the thread count. Edges run the same
// micro-kernel on zero-padded panels; threads split rows or columns of C, never K. So a row of
// x·Wᵀ has the same bits alone or inside any batch, on every x86-64 CPU.
//
//   fp32 operands:  c = fma(a[k], b[k], c) for k = 0, 1, 2, ...
//   bf16 operands:  operands rounded to bf16, then pairs: c = fma(a[k+1], b[k+1], c);
//                   c = fma(a[k], b[k], c) for k = 0, 2, 4, ... (odd K padded with a zero) --
//                   exactly what AVX512_BF16's vdpbf16ps computes, so CPUs without it give the
//                   same bits from fp32 FMAs. Accumulation is fp32. Like vdpbf16ps, every input
//                   of those FMAs (the accumulator's too) and every result below FLT_MIN in
//                   magnitude counts as a zero of its sign (DAZ, FTZ; on x86-64 through MXCSR);
//                   the fp32 route keeps denormals.
// The one exception is opt-in: with use_bf16_amx (compute.bf16_gemm: amx) bf16 operands run on
// AMX tiles, whose sums are not this chain (gemm_kernel_amx.cpp): still batch, tile and thread
// invariant, but not the same bits as CPUs without AMX (Intel does not specify tdpbf16ps' sum;
// probed on Sapphire Rapids only).
// Double (finite-difference references only) is a plain loop in the fp32 order.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/precision.hpp"

namespace atl::cpu {

enum class GemmOperands { f32, bf16 };

// The operands of a precision's bulk products: bf16 in precision bf16, else fp32.
inline GemmOperands gemm_operands(Precision p) { return p == Precision::bf16 ? GemmOperands::bf16 : GemmOperands::f32; }

// A GEMM splits over the current compute pool only when every part gets at least this many
// multiply-adds: waking a pool thread costs tens of microseconds, about what 8M multiply-adds take
// (at 1<<17, beam-tiny's default run took 8.5 s on two threads against 7.6 s on one).
inline constexpr std::int64_t kGemmMinParallelWork = std::int64_t(1) << 23;

struct GemmShape {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  bool accumulate = false;  // C += (chain starts at C) instead of C =
  // Each C element rounded to bf16 (round_to_bf16) once its last K block is added: precision
  // bf16's rounding of a bulk output, done while the block is still in cache (the same bits as a
  // pass over C afterwards).
  bool round_bf16 = false;
};

// fp32 storage for both operand kinds (bf16 operands are rounded while packed; values that are
// already bf16 pass unchanged). Uses the current compute pool (compute_pool.hpp).
void gemm_f32(const GemmShape& s, const float* a, const float* b, float* c, GemmOperands operands = GemmOperands::f32);
void gemm_f64(const GemmShape& s, const double* a, const double* b, double* c);

// round_output: GemmShape::round_bf16 (a double C rounds through float, as maybe_round_bf16 does).
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, bool accumulate, T* c, std::int64_t ldc,
          GemmOperands operands = GemmOperands::f32, bool round_output = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const GemmShape s{trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate, round_output};
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(s, a, b, c, operands);
  } else {
    (void)operands;
    gemm_f64(s, a, b, c);
  }
}

// y[N,out] = x[N,in] @ w[out,in]^T   (PyTorch Linear convention); round_output as for gemm.
template <class T>
void linear_forward(const T* x, const T* w, T* y, std::int64_t rows, std::int64_t in, std::int64_t out,
                    GemmOperands operands = GemmOperands::f32, bool round_output = false) {
  gemm<T>(false, true, rows, out, in, x, in, w, in, false, y, out, operands, round_output);
}

// dx[N,in] = dy @ w (overwritten); dw[out,in] += dy^T @ x (accumulated). Either may be null.
// bf16 operands (the backward of a bulk projection in precision bf16): dy is read as bf16, as
// autograd holds the gradient of a bf16 tensor; x and w already are bf16 values.
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, std::int64_t rows, std::int64_t in,
                     std::int64_t out, GemmOperands operands = GemmOperands::f32) {
  if (dx) gemm<T>(false, false, rows, in, out, dy, out, w, in, false, dx, in, operands);
  if (dw) gemm<T>(true, false, out, in, rows, dy, out, x, in, true, dw, in, operands);
}

}  // namespace atl::cpu

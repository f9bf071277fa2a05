// AVX2 + FMA micro-kernel: 6 x 16 tile, 12 ymm accumulators. Compiled through target attributes so
// the rest of the library stays baseline x86-64 and runs anywhere.
#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

constexpr int kMr = 6, kNr = 16;

__attribute__((target("avx2,fma"))) void f32_6x16(std::int64_t kc, const float* ap, const float* bp, float* c,
                                                  std::int64_t ldc, bool accumulate) {
  __m256 c0[kMr], c1[kMr];
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    c0[r] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (std::int64_t k = 0; k < kc; ++k, ap += kMr, bp += kNr) {
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r) {
      const __m256 a = _mm256_broadcast_ss(ap + r);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    _mm256_storeu_ps(c + r * ldc, c0[r]);
    _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
  }
}

}  // namespace

F32MicroKernel f32_kernel_avx2() { return {kMr, kNr, f32_6x16}; }

}  // namespace atl::cpu::gemm_detail
#endif

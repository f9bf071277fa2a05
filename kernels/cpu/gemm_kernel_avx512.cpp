// AVX-512 micro-kernels: 12 x 32 tiles, 24 zmm accumulators. fp32 with vfmadd231ps; bf16 pairs
// with vdpbf16ps (AVX512_BF16), which per lane computes c = fma(a1, b1, c) then c = fma(a0, b0, c)
// -- the order gemm.hpp defines for bf16 operands (checked against fp32 FMAs by a test).
#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

constexpr int kMr = 12, kNr = 32;

// A 12 x 32 tile as two columns of 16 lanes; the chains start at C or at 0.
struct Tile {
  __m512 lo[kMr], hi[kMr];
};

__attribute__((target("avx512f"), always_inline)) inline void load_tile(Tile& t, const float* c, std::int64_t ldc,
                                                                       bool accumulate) {
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    t.lo[r] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    t.hi[r] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
}

__attribute__((target("avx512f"), always_inline)) inline void store_tile(const Tile& t, float* c, std::int64_t ldc) {
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    _mm512_storeu_ps(c + r * ldc, t.lo[r]);
    _mm512_storeu_ps(c + r * ldc + 16, t.hi[r]);
  }
}

__attribute__((target("avx512f"))) void f32_12x32(std::int64_t kc, const float* ap, const float* bp, float* c,
                                                  std::int64_t ldc, bool accumulate) {
  Tile t;
  load_tile(t, c, ldc, accumulate);
  for (std::int64_t k = 0; k < kc; ++k, ap += kMr, bp += kNr) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512 a = _mm512_set1_ps(ap[r]);
      t.lo[r] = _mm512_fmadd_ps(a, b0, t.lo[r]);
      t.hi[r] = _mm512_fmadd_ps(a, b1, t.hi[r]);
    }
  }
  store_tile(t, c, ldc);
}

__attribute__((target("avx512f,avx512bf16"))) void bf16_12x32(std::int64_t kpairs, const std::uint32_t* ap,
                                                              const std::uint32_t* bp, float* c, std::int64_t ldc,
                                                              bool accumulate) {
  Tile t;
  load_tile(t, c, ldc, accumulate);
  for (std::int64_t p = 0; p < kpairs; ++p, ap += kMr, bp += kNr) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r]));
      t.lo[r] = _mm512_dpbf16_ps(t.lo[r], a, b0);
      t.hi[r] = _mm512_dpbf16_ps(t.hi[r], a, b1);
    }
  }
  store_tile(t, c, ldc);
}

}  // namespace

F32MicroKernel f32_kernel_avx512() { return {kMr, kNr, f32_12x32}; }
Bf16MicroKernel bf16_kernel_avx512() { return {kMr, kNr, bf16_12x32}; }

}  // namespace atl::cpu::gemm_detail
#endif

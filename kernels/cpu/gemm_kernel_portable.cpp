// The portable micro-kernel: scalar fused multiply-adds (std::fma rounds once, like the vector
// FMA instructions), so it gives the same bits as the AVX2 and AVX-512 kernels.
#include <cmath>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

constexpr int kMr = 4, kNr = 8;

void f32_4x8(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc, bool accumulate) {
  float acc[kMr][kNr];
  for (int r = 0; r < kMr; ++r)
    for (int j = 0; j < kNr; ++j) acc[r][j] = accumulate ? c[r * ldc + j] : 0.0f;
  for (std::int64_t k = 0; k < kc; ++k, ap += kMr, bp += kNr)
    for (int r = 0; r < kMr; ++r)
      for (int j = 0; j < kNr; ++j) acc[r][j] = std::fma(ap[r], bp[j], acc[r][j]);
  for (int r = 0; r < kMr; ++r)
    for (int j = 0; j < kNr; ++j) c[r * ldc + j] = acc[r][j];
}

}  // namespace

F32MicroKernel f32_kernel_portable() { return {kMr, kNr, f32_4x8}; }

}  // namespace atl::cpu::gemm_detail

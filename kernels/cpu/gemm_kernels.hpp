// Register-blocked GEMM micro-kernels (internal to gemm.cpp). Each computes one MR x NR tile of C
// from packed panels: A as [k][MR], B as [k][NR] (fp32), or bf16 pairs [k/2][MR] and [k/2][NR]
// (two bf16 in one uint32, the even k in the low half). Each output element is one FMA chain in
// the order gemm.hpp states, so every kernel here gives the same bits.
#pragma once
#include <cstdint>

namespace atl::cpu::gemm_detail {

// c: the tile's first element, ldc its row stride; accumulate: the chains start at c, else at 0.
using F32Kernel = void (*)(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc,
                           bool accumulate);
using Bf16Kernel = void (*)(std::int64_t kpairs, const std::uint32_t* ap, const std::uint32_t* bp, float* c,
                            std::int64_t ldc, bool accumulate);

struct F32MicroKernel {
  int mr, nr;
  F32Kernel run;
};
struct Bf16MicroKernel {
  int mr, nr;
  Bf16Kernel run;
};

F32MicroKernel f32_kernel_portable();
#if defined(__x86_64__)
F32MicroKernel f32_kernel_avx2();
F32MicroKernel f32_kernel_avx512();
Bf16MicroKernel bf16_kernel_avx512();
#endif

}  // namespace atl::cpu::gemm_detail

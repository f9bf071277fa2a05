// Register-blocked GEMM micro-kernels (internal to gemm.cpp). Each computes one MR x NR tile of C
// from packed panels: A as [k][MR], B as [k][NR] (fp32), or bf16 pairs [k/2][MR] and [k/2][NR]
// (two bf16 in one uint32, the even k in the low half). Each output element is one FMA chain in
// the order gemm.hpp states, so every kernel here gives the same bits.
#pragma once
#include <cstdint>

namespace atl::cpu::gemm_detail {

// Rows of an operand packed across k are k_stride apart, often a page or more: the hardware
// prefetchers do not follow, so the packing loops ask for rows this far ahead.
inline constexpr std::int64_t kPrefetchRows = 8;

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

// Packing helpers. transpose: dst[c * width + l] = src[l * src_stride + c] for l < lines, c < cols,
// and 0 for lines <= l < width. to_bf16_bits: float_to_bf16_bits over n contiguous values.
// bf16_pairs, for lines contiguous in memory (line l, k at src[k * k_stride + l]): `count` lines
// into panels of `width` lines, panel p at dst + p * pairs * width, dst[q * width + l] =
// bits(k = 2q) | bits(k = 2q + 1) << 16 for its lines (the odd one 0 past kc), and 0 for the
// last panel's lines past `lines`.
using TransposeLines = void (*)(const std::uint32_t* src, std::int64_t src_stride, std::int64_t lines,
                                std::int64_t cols, std::uint32_t* dst, std::int64_t width);
using ToBf16Bits = void (*)(const float* in, std::int64_t n, std::uint16_t* out);
using Bf16Pairs = void (*)(const float* src, std::int64_t k_stride, std::int64_t kc, std::int64_t count,
                           std::uint32_t* dst, std::int64_t width);
// pair_lines: the same panel from k-contiguous lines (line l, k at src[l * line_stride + k]).
using PairLines = void (*)(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc,
                           std::uint32_t* dst, std::int64_t width);
struct PackKernels {
  TransposeLines transpose;
  ToBf16Bits to_bf16_bits;
  Bf16Pairs bf16_pairs;
  PairLines pair_lines;
};

F32MicroKernel f32_kernel_portable();
PackKernels pack_kernels_portable();
#if defined(__x86_64__)
F32MicroKernel f32_kernel_avx2();
F32MicroKernel f32_kernel_avx512();
Bf16MicroKernel bf16_kernel_avx512();
PackKernels pack_kernels_avx512();
#endif

}  // namespace atl::cpu::gemm_detail

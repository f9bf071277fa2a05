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

// Rows of an operand packed across k are k_stride apart, often a page or more: the hardware
// prefetchers do not follow, so the packing loops ask for rows this far ahead.
inline constexpr std::int64_t kPrefetchRows = 8;
// For packers that read rows k and k + 1 (at `row`, `count` floats each) of an operand whose
// rows are k_stride apart: asks for the pair kPrefetchRows further on.
inline void prefetch_pair_ahead(const float* row, std::int64_t k, std::int64_t kc, std::int64_t k_stride,
                                std::int64_t count) {
  if (k + kPrefetchRows + 1 >= kc) return;
  for (std::int64_t i = 0; i < count; i += 16) {
    __builtin_prefetch(row + kPrefetchRows * k_stride + i);
    __builtin_prefetch(row + (kPrefetchRows + 1) * k_stride + i);
  }
}
// k-contiguous lines read side by side defeat the prefetchers too: elements ahead in each line.
inline constexpr std::int64_t kPrefetchCols = 16;

// Packing helpers. transpose: dst[c * width + l] = src[l * src_stride + c] for l < lines, c < cols,
// and 0 for lines <= l < width.
// bf16_pairs, for lines contiguous in memory (line l, k at src[k * k_stride + l]): `count` lines
// into panels of `width` lines, panel p at dst + p * panel_pairs * width (panel_pairs >= the
// k pairs; the rows past them are left as they are), dst[q * width + l] =
// bits(k = 2q) | bits(k = 2q + 1) << 16 for its lines (the odd one 0 past kc), and 0 for the
// last panel's lines past `lines`.
// pair_lines: the same panel from k-contiguous lines (line l, k at src[l * line_stride + k]).
// swapped_rows / swapped_lines: the bf16_as_f32 panels (floats, depth 2 * pairs), laid out as
// bf16_pairs / pair_lines, with dst[2q * width + l] = round_to_bf16(k = 2q + 1) (0 past kc) and
// dst[(2q + 1) * width + l] = round_to_bf16(k = 2q): the odd k first, so fp32 FMAs over the panel
// follow the bf16 chain.
using TransposeLines = void (*)(const std::uint32_t* src, std::int64_t src_stride, std::int64_t lines,
                                std::int64_t cols, std::uint32_t* dst, std::int64_t width);
using Bf16Pairs = void (*)(const float* src, std::int64_t k_stride, std::int64_t kc, std::int64_t count,
                           std::uint32_t* dst, std::int64_t width, std::int64_t panel_pairs);
using PairLines = void (*)(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc,
                           std::uint32_t* dst, std::int64_t width);
using SwappedRows = void (*)(const float* src, std::int64_t k_stride, std::int64_t kc, std::int64_t count, float* dst,
                             std::int64_t width);
using SwappedLines = void (*)(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc,
                              float* dst, std::int64_t width);
// amx_rows: k-contiguous lines into AMX A panels (pack_kernels_amx only: null elsewhere),
// `padded_pairs` pairs (whole chunks of 16) deep; amx_rows_across_k: the same panels from lines
// contiguous in memory (the first argument is then k_stride).
using AmxRows = void (*)(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc,
                         std::uint32_t* dst, std::int64_t width, std::int64_t padded_pairs);
struct PackKernels {
  TransposeLines transpose;
  Bf16Pairs bf16_pairs;
  PairLines pair_lines;
  SwappedRows swapped_rows;
  SwappedLines swapped_lines;
  AmxRows amx_rows = nullptr;
  AmxRows amx_rows_across_k = nullptr;
};

F32MicroKernel f32_kernel_portable();
PackKernels pack_kernels_portable();
#if defined(__x86_64__)
F32MicroKernel f32_kernel_avx2();
PackKernels pack_kernels_avx2();
F32MicroKernel f32_kernel_avx512();
Bf16MicroKernel bf16_kernel_avx512();
PackKernels pack_kernels_avx512();
// The AMX route's packers (AVX512_BF16): bf16_pairs and pair_lines as avx512's but denormals
// rounded to zeros of their sign (tdpbf16ps reads bf16 denormals as zeros anyway), amx_rows and
// amx_rows_across_k.
PackKernels pack_kernels_amx();
// AMX (gemm_kernel_amx.cpp): 32 x 32 tiles; A panels as [k/32][32 rows][16 pairs], B panels as
// bf16_pairs with width 32, both zero-padded to whole chunks of 32 k. A thread loads the tile
// configuration before running the kernel and releases it after (cpu_features.hpp's
// amx_available() has asked Linux for the tile state).
void amx_tiles_on();
void amx_tiles_off();
Bf16MicroKernel bf16_kernel_amx();
#endif

}  // namespace atl::cpu::gemm_detail

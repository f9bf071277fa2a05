// AVX-512 packing helpers: the transposes that turn k-contiguous lines into [k][width] panels, and
// the fp32 -> bf16 rounding, 16 lanes at a time. Packing only moves and rounds values (rounding is
// the same integer round-to-nearest-even as float_to_bf16_bits), so it has no say in the numerics.
#if defined(__x86_64__)
// GCC 12's AVX-512 headers seed unpack/shuffle/shift results with a self-initialised
// `_mm512_undefined_epi32()`, which -Wmaybe-uninitialized reports (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

// 16 x 16 transpose of 32-bit lanes: r[i] holds row i on entry, column i on exit.
__attribute__((target("avx512f"), always_inline)) inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved per 128-bit lane
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + c] holds column c (of each lane's 4) of rows i..i+3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather the four row groups' 128-bit lanes
    const __m512i x_even = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88),
                  x_odd = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i y_even = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88),
                  y_odd = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(x_even, y_even, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(x_even, y_even, 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(x_odd, y_odd, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x_odd, y_odd, 0xDD);
  }
}

__attribute__((target("avx512f"))) void transpose_lines_avx512(const std::uint32_t* src, std::int64_t src_stride,
                                                               std::int64_t lines, std::int64_t cols,
                                                               std::uint32_t* dst, std::int64_t width) {
  for (std::int64_t l0 = 0; l0 < width; l0 += 16) {
    const std::int64_t lanes = std::int64_t{16} < width - l0 ? 16 : width - l0;
    const __mmask16 store_mask = static_cast<__mmask16>((1u << lanes) - 1u);
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      const std::int64_t n = std::int64_t{16} < cols - c0 ? 16 : cols - c0;
      const __mmask16 load_mask = static_cast<__mmask16>((1u << n) - 1u);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const std::int64_t l = l0 + i;
        if (l < lines && c0 + kPrefetchCols < cols) {  // as in pair_lines_avx512
          _mm_prefetch(reinterpret_cast<const char*>(src + l * src_stride + c0 + kPrefetchCols), _MM_HINT_T0);
        }
        r[i] = l < lines ? _mm512_maskz_loadu_epi32(load_mask, src + l * src_stride + c0) : _mm512_setzero_si512();
      }
      transpose_16x16(r);
      for (std::int64_t c = 0; c < n; ++c) _mm512_mask_storeu_epi32(dst + (c0 + c) * width + l0, store_mask, r[c]);
    }
  }
}

// float_to_bf16_bits of 16 floats (as bits), one result per 32-bit lane.
__attribute__((target("avx512f"), always_inline)) inline __m512i bf16_bits(__m512i u) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  // round to nearest even: u + 0x7fff + (bit 16 of u), then the high half
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  // NaN (all exponent bits, some mantissa bit) keeps its high half, quieted
  const __mmask16 nan =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exponent), exponent) & _mm512_test_epi32_mask(u, mantissa);
  return _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
}

// The first n lanes (none for n <= 0: a panel's padding lines read nothing).
__attribute__((target("avx512f"), always_inline)) inline __mmask16 first_lanes(std::int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// Every panel of the block at once, row pair by row pair: whole rows are read in order (the
// hardware prefetcher follows them), each panel's pair row written at its place.
__attribute__((target("avx512f"))) void bf16_pairs_avx512(const float* src, std::int64_t k_stride, std::int64_t kc,
                                                          std::int64_t count, std::uint32_t* dst, std::int64_t width,
                                                          std::int64_t panel_pairs) {
  const std::int64_t panels = (count + width - 1) / width;
  for (std::int64_t k = 0; k < kc; k += 2) {
    const float* even = src + k * k_stride;
    const float* odd = k + 1 < kc ? even + k_stride : nullptr;
    prefetch_pair_ahead(even, k, kc, k_stride, count);
    std::uint32_t* row = dst + (k / 2) * width;
    for (std::int64_t p = 0; p < panels; ++p, row += panel_pairs * width) {
      const std::int64_t first = p * width, lines = count - first < width ? count - first : width;
      for (std::int64_t i = 0; i < width; i += 16) {
        const __mmask16 m = first_lanes(lines - i), store = first_lanes(width - i);
        const __m512i lo = bf16_bits(_mm512_maskz_loadu_epi32(m, even + first + i));
        const __m512i hi = odd ? bf16_bits(_mm512_maskz_loadu_epi32(m, odd + first + i)) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(row + i, store, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
  }
}

// k-contiguous lines straight into a panel of bf16 pairs: 16 lines x 16 k transposed in registers,
// then k = 2q and 2q + 1 (now in registers 2q and 2q + 1) rounded and paired.
__attribute__((target("avx512f"))) void pair_lines_avx512(const float* src, std::int64_t line_stride,
                                                          std::int64_t lines, std::int64_t kc, std::uint32_t* dst,
                                                          std::int64_t width) {
  const std::int64_t pairs = (kc + 1) / 2;
  for (std::int64_t l0 = 0; l0 < width; l0 += 16) {
    const __mmask16 store_mask = first_lanes(width - l0);
    for (std::int64_t k0 = 0; k0 < kc; k0 += 16) {
      const __mmask16 load_mask = first_lanes(kc - k0);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const std::int64_t l = l0 + i;
        if (l < lines && k0 + kPrefetchCols < kc) {
          _mm_prefetch(reinterpret_cast<const char*>(src + l * line_stride + k0 + kPrefetchCols), _MM_HINT_T0);
        }
        r[i] = l < lines ? _mm512_maskz_loadu_epi32(load_mask, src + l * line_stride + k0) : _mm512_setzero_si512();
      }
      transpose_16x16(r);
      const std::int64_t q0 = k0 / 2, block_pairs = pairs - q0 < 8 ? pairs - q0 : 8;
      for (std::int64_t q = 0; q < block_pairs; ++q) {
        const __m512i paired = _mm512_or_si512(bf16_bits(r[2 * q]), _mm512_slli_epi32(bf16_bits(r[2 * q + 1]), 16));
        _mm512_mask_storeu_epi32(dst + (q0 + q) * width + l0, store_mask, paired);
      }
    }
  }
}

// The AMX packers round with vcvtne2ps2bf16 (every AMX CPU has AVX512_BF16): one instruction for
// 32 values where bf16_bits takes nine per 16. It is the same round-to-nearest-even, quiets NaNs
// the same way, and turns denormals into zeros of their sign, which tdpbf16ps (DAZ) reads exactly
// as it reads the bf16 denormals bf16_bits would give: the same products, the same sums.
#define ATOLL_AMX_PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// 32 floats from k0 (zero past kc) as 32 bf16, k0 in the low half.
ATOLL_AMX_PACK_TARGET inline __m512i bf16_of_32(const float* line, std::int64_t k0, std::int64_t kc) {
  const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(kc - k0), line + k0);
  const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(kc - k0 - 16), line + k0 + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// k-contiguous lines into AMX A panels (gemm_kernels.hpp): per chunk of 32 k, `width` rows of 16
// pairs, zero past kc and for lines past `lines`. Each row is read once, in order, and rounded in
// place of a pair-major pack and a transpose (which held the NT forward shapes at 3.0-4.3x fp32
// on AMX; 4.4-4.9x with this).
ATOLL_AMX_PACK_TARGET void amx_rows(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc,
                                    std::uint32_t* dst, std::int64_t width, std::int64_t padded_pairs) {
  constexpr std::int64_t kChunkPairs = 16;
  for (std::int64_t l = 0; l < width; ++l) {
    for (std::int64_t q0 = 0; q0 < padded_pairs; q0 += kChunkPairs) {
      const __m512i pairs = l < lines ? bf16_of_32(src + l * line_stride, 2 * q0, kc) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + q0 * width + l * kChunkPairs, pairs);
    }
  }
}

// The interleave of vcvtne2ps2bf16(row k + 1, row k): 16-bit lanes 0..15 hold row k, 16..31 row
// k + 1, and pair j takes lanes j and 16 + j.
ATOLL_AMX_PACK_TARGET inline __m512i pair_interleave() {
  alignas(64) std::uint16_t order[32];
  for (int j = 0; j < 16; ++j) {
    order[2 * j] = static_cast<std::uint16_t>(j);
    order[2 * j + 1] = static_cast<std::uint16_t>(16 + j);
  }
  return _mm512_load_si512(order);
}

// Lines contiguous in memory (line l, k at src[k * k_stride + l]) into AMX A panels, as amx_rows
// lays them out: per 16 lines and chunk, 32 rows of k rounded and paired, then a 16 x 16 transpose
// of pairs puts each line's 16 pairs in one register (a pair-major pack, then a transpose pass
// over it, did the same in two).
ATOLL_AMX_PACK_TARGET void amx_rows_across_k(const float* src, std::int64_t k_stride, std::int64_t lines,
                                             std::int64_t kc, std::uint32_t* dst, std::int64_t width,
                                             std::int64_t padded_pairs) {
  constexpr std::int64_t kChunkPairs = 16;
  const __m512i interleave = pair_interleave();
  for (std::int64_t q0 = 0; q0 < padded_pairs; q0 += kChunkPairs) {
    for (std::int64_t l0 = 0; l0 < width; l0 += 16) {
      const __mmask16 m = first_lanes(lines - l0);
      __m512i r[16];
      for (std::int64_t q = 0; q < kChunkPairs; ++q) {
        const std::int64_t k = 2 * (q0 + q);
        const __m512 e = k < kc ? _mm512_maskz_loadu_ps(m, src + k * k_stride + l0) : _mm512_setzero_ps();
        const __m512 o = k + 1 < kc ? _mm512_maskz_loadu_ps(m, src + (k + 1) * k_stride + l0) : _mm512_setzero_ps();
        r[q] = _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(o, e));
      }
      transpose_16x16(r);
      for (std::int64_t i = 0; i < 16; ++i) _mm512_storeu_si512(dst + q0 * width + (l0 + i) * kChunkPairs, r[i]);
    }
  }
}

// bf16_pairs_avx512's panels: rows k and k + 1 rounded by one instruction, then interleaved.
ATOLL_AMX_PACK_TARGET void bf16_pairs_amx(const float* src, std::int64_t k_stride, std::int64_t kc,
                                          std::int64_t count, std::uint32_t* dst, std::int64_t width,
                                          std::int64_t panel_pairs) {
  const std::int64_t panels = (count + width - 1) / width;
  const __m512i interleave = pair_interleave();
  for (std::int64_t k = 0; k < kc; k += 2) {
    const float* even = src + k * k_stride;
    const float* odd = k + 1 < kc ? even + k_stride : nullptr;
    prefetch_pair_ahead(even, k, kc, k_stride, count);
    std::uint32_t* row = dst + (k / 2) * width;
    for (std::int64_t p = 0; p < panels; ++p, row += panel_pairs * width) {
      const std::int64_t first = p * width, lines = count - first < width ? count - first : width;
      for (std::int64_t i = 0; i < width; i += 16) {
        const __mmask16 m = first_lanes(lines - i), store = first_lanes(width - i);
        const __m512 e = _mm512_maskz_loadu_ps(m, even + first + i);
        const __m512 o = odd ? _mm512_maskz_loadu_ps(m, odd + first + i) : _mm512_setzero_ps();
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(o, e);
        _mm512_mask_storeu_epi32(row + i, store, _mm512_permutexvar_epi16(interleave, both));
      }
    }
  }
}

// pair_lines_avx512's panels: each line's 32 k rounded to 16 pairs first, so one 16 x 16
// transpose of pairs serves 32 k (two transposes of floats did).
ATOLL_AMX_PACK_TARGET void pair_lines_amx(const float* src, std::int64_t line_stride, std::int64_t lines,
                                          std::int64_t kc, std::uint32_t* dst, std::int64_t width) {
  const std::int64_t pairs = (kc + 1) / 2;
  for (std::int64_t l0 = 0; l0 < width; l0 += 16) {
    const __mmask16 store_mask = first_lanes(width - l0);
    for (std::int64_t k0 = 0; k0 < kc; k0 += 32) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const std::int64_t l = l0 + i;
        if (l < lines && k0 + 32 < kc) {
          _mm_prefetch(reinterpret_cast<const char*>(src + l * line_stride + k0 + 32), _MM_HINT_T0);
        }
        r[i] = l < lines ? bf16_of_32(src + l * line_stride, k0, kc) : _mm512_setzero_si512();
      }
      transpose_16x16(r);
      const std::int64_t q0 = k0 / 2, block_pairs = pairs - q0 < 16 ? pairs - q0 : 16;
      for (std::int64_t q = 0; q < block_pairs; ++q) {
        _mm512_mask_storeu_epi32(dst + (q0 + q) * width + l0, store_mask, r[q]);
      }
    }
  }
}

#undef ATOLL_AMX_PACK_TARGET

}  // namespace

PackKernels pack_kernels_avx512() {
  // The bf16_as_f32 route (AVX-512 without AVX512_BF16) packs with the AVX2 helpers.
  const PackKernels avx2 = pack_kernels_avx2();
  return {transpose_lines_avx512, bf16_pairs_avx512, pair_lines_avx512, avx2.swapped_rows, avx2.swapped_lines};
}

PackKernels pack_kernels_amx() {
  const PackKernels avx512 = pack_kernels_avx512();
  return {avx512.transpose,     bf16_pairs_amx, pair_lines_amx,   avx512.swapped_rows,
          avx512.swapped_lines, amx_rows,       amx_rows_across_k};
}

}  // namespace atl::cpu::gemm_detail
#endif

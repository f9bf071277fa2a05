// AVX2 packing helpers: 8 x 8 register transposes for k-contiguous lines and the bf16 rounding of
// the bf16_as_f32 route, 8 lanes at a time. Packing only moves and rounds values (the rounding is
// float_to_bf16_bits' integer round-to-nearest-even), so it has no say in the numerics; a test
// checks every helper against the portable one element for element.
#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

// The first n lanes of p (none for n <= 0: a panel's padding lines read nothing); masked-off lanes
// are not read, so a short last line never touches memory past its end.
__attribute__((target("avx2"), always_inline)) inline __m256 load_lanes(const float* p, std::int64_t n) {
  if (n >= 8) return _mm256_loadu_ps(p);
  if (n <= 0) return _mm256_setzero_ps();
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
}

// The first n lanes of v to p, nothing past them (plain stores: masked stores are slow on AMD).
__attribute__((target("avx2"), always_inline)) inline void store_lanes(float* p, __m256 v, std::int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
    return;
  }
  __m128 part = _mm256_castps256_ps128(v);
  if (n >= 4) {
    _mm_storeu_ps(p, part);
    p += 4;
    n -= 4;
    part = _mm256_extractf128_ps(v, 1);
  }
  if (n >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
    p += 2;
    n -= 2;
    part = _mm_movehl_ps(part, part);
  }
  if (n >= 1) _mm_store_ss(p, part);
}

// 8 x 8 transpose of 32-bit lanes: r[i] holds row i on entry, column i on exit. Shuffles move
// bits only (no NaN is quieted), so the lanes may hold any 32-bit values.
__attribute__((target("avx2"), always_inline)) inline void transpose_8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {  // rows i, i+1 interleaved per 128-bit lane
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // u[i + c]: column c (and c + 4) of rows i..i+3
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // rows 0..3 and 4..7 of columns c and c + 4
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// round_to_bf16 of 8 floats, as floats: float_to_bf16_bits' rounding, kept in the high half. Eight
// vector operations: packing a bf16 panel is bound by them (it was thirteen, with an integer NaN test).
__attribute__((target("avx2"), always_inline)) inline __m256 round_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  // round to nearest even: u + 0x7fff + (bit 16 of u), then the high half
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  // NaN keeps its high half, quieted; the unordered compare reads only bits (DAZ leaves NaNs alone)
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Lines of k-contiguous values, 8 lines x 8 k at a time, into [depth][width] panels; depth >= cols,
// the k past cols zero. round_swapped: each line rounded to bf16 and its pairs swapped (odd k
// first) before the transpose; blocks start at a multiple of 8 k, so pairs stay aligned.
template <bool round_swapped>
__attribute__((target("avx2"), always_inline)) inline void transpose_blocks(const float* src, std::int64_t src_stride,
                                                                            std::int64_t lines, std::int64_t cols,
                                                                            std::int64_t depth, float* dst,
                                                                            std::int64_t width) {
  for (std::int64_t l0 = 0; l0 < width; l0 += 8) {
    for (std::int64_t c0 = 0; c0 < depth; c0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const std::int64_t l = l0 + i;
        if (l < lines && c0 + kPrefetchCols < cols) {  // 8 lines side by side defeat the hardware prefetcher
          _mm_prefetch(reinterpret_cast<const char*>(src + l * src_stride + c0 + kPrefetchCols), _MM_HINT_T0);
        }
        r[i] = l < lines ? load_lanes(src + l * src_stride + c0, cols - c0) : _mm256_setzero_ps();
        if (round_swapped) r[i] = _mm256_permute_ps(round_bf16(r[i]), 0xB1);
      }
      transpose_8x8(r);
      const std::int64_t n = depth - c0 < 8 ? depth - c0 : 8;
      for (std::int64_t c = 0; c < n; ++c) store_lanes(dst + (c0 + c) * width + l0, r[c], width - l0);
    }
  }
}

__attribute__((target("avx2"))) void transpose_lines_avx2(const std::uint32_t* src, std::int64_t src_stride,
                                                          std::int64_t lines, std::int64_t cols, std::uint32_t* dst,
                                                          std::int64_t width) {
  // Lines may hold floats or bf16 pairs: only bits move.
  transpose_blocks<false>(reinterpret_cast<const float*>(src), src_stride, lines, cols, cols,
                          reinterpret_cast<float*>(dst), width);
}

// The bf16_as_f32 panel from k-contiguous lines.
__attribute__((target("avx2"))) void swapped_lines_avx2(const float* src, std::int64_t line_stride, std::int64_t lines,
                                                        std::int64_t kc, float* dst, std::int64_t width) {
  transpose_blocks<true>(src, line_stride, lines, kc, (kc + 1) / 2 * 2, dst, width);
}

// The bf16_as_f32 panels of `count` lines contiguous in memory, every panel at once, row pair by
// row pair (whole rows read in order, as bf16_pairs does).
__attribute__((target("avx2"))) void swapped_rows_avx2(const float* src, std::int64_t k_stride, std::int64_t kc,
                                                       std::int64_t count, float* dst, std::int64_t width) {
  const std::int64_t depth = (kc + 1) / 2 * 2, panels = (count + width - 1) / width;
  for (std::int64_t k = 0; k < kc; k += 2) {
    const float* even = src + k * k_stride;
    const float* odd = k + 1 < kc ? even + k_stride : nullptr;
    prefetch_pair_ahead(even, k, kc, k_stride, count);
    float* row = dst + k * width;
    for (std::int64_t p = 0; p < panels; ++p, row += depth * width) {
      const std::int64_t first = p * width, lines = count - first < width ? count - first : width;
      for (std::int64_t i = 0; i < width; i += 8) {
        // Lanes past this panel's lines but within the rows (the next panel's) may be read whole:
        // masked loads (vmaskmovps) held most of this function's samples on Zen 3.
        const std::int64_t n = count - first - i >= 8 ? 8 : lines - i;
        const __m256 lo = round_bf16(load_lanes(even + first + i, n));
        const __m256 hi = odd ? round_bf16(load_lanes(odd + first + i, n)) : _mm256_setzero_ps();
        store_lanes(row + i, hi, width - i);
        store_lanes(row + width + i, lo, width - i);
      }
    }
  }
}

}  // namespace

PackKernels pack_kernels_avx2() {
  const PackKernels portable = pack_kernels_portable();  // bf16 pairs serve the AVX-512 dot route only
  return {transpose_lines_avx2, portable.bf16_pairs, portable.pair_lines, swapped_rows_avx2, swapped_lines_avx2};
}

}  // namespace atl::cpu::gemm_detail
#endif

// The portable micro-kernel: scalar fused multiply-adds (std::fma rounds once, like the vector
// FMA instructions), so it gives the same bits as the AVX2 and AVX-512 kernels.
#include <cmath>
#include <cstring>

#include "kernels/dtype.hpp"

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

// Blocked so that both the reads (along a line) and the writes (along a panel row) stay in cache.
// Lines may hold floats or bf16 pairs: memcpy reads their bits without breaking type aliasing.
void transpose_lines(const std::uint32_t* src, std::int64_t src_stride, std::int64_t lines, std::int64_t cols,
                     std::uint32_t* dst, std::int64_t width) {
  constexpr std::int64_t kBlock = 16;
  for (std::int64_t c0 = 0; c0 < cols; c0 += kBlock) {
    const std::int64_t c1 = c0 + kBlock < cols ? c0 + kBlock : cols;
    for (std::int64_t l = 0; l < width; ++l) {
      const std::uint32_t* line = src + l * src_stride;
      for (std::int64_t c = c0; c < c1; ++c) {
        std::uint32_t bits = 0;
        if (l < lines) std::memcpy(&bits, line + c, sizeof bits);
        dst[c * width + l] = bits;
      }
    }
  }
}

void bf16_pairs(const float* src, std::int64_t k_stride, std::int64_t kc, std::int64_t count, std::uint32_t* dst,
                std::int64_t width, std::int64_t panel_pairs) {
  for (std::int64_t p0 = 0; p0 < count; p0 += width, dst += panel_pairs * width) {
    const std::int64_t lines = std::min(width, count - p0);
    std::uint32_t* row = dst;
    for (std::int64_t k = 0; k < kc; k += 2, row += width) {
      const float* even = src + k * k_stride + p0;
      const float* odd = k + 1 < kc ? even + k_stride : nullptr;
      for (std::int64_t l = 0; l < width; ++l) {
        const std::uint32_t lo = l < lines ? float_to_bf16_bits(even[l]) : 0u;
        const std::uint32_t hi = l < lines && odd ? float_to_bf16_bits(odd[l]) : 0u;
        row[l] = lo | hi << 16;
      }
    }
  }
}

void pair_lines(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc, std::uint32_t* dst,
                std::int64_t width) {
  const std::int64_t pairs = (kc + 1) / 2;
  for (std::int64_t q = 0; q < pairs; ++q) {
    for (std::int64_t l = 0; l < width; ++l) {
      const float* line = src + l * line_stride;
      const std::uint32_t lo = l < lines ? float_to_bf16_bits(line[2 * q]) : 0u;
      const std::uint32_t hi = l < lines && 2 * q + 1 < kc ? float_to_bf16_bits(line[2 * q + 1]) : 0u;
      dst[q * width + l] = lo | hi << 16;
    }
  }
}

void swapped_rows(const float* src, std::int64_t k_stride, std::int64_t kc, std::int64_t count, float* dst,
                  std::int64_t width) {
  const std::int64_t depth = (kc + 1) / 2 * 2;
  for (std::int64_t p0 = 0; p0 < count; p0 += width, dst += depth * width) {
    const std::int64_t lines = std::min(width, count - p0);
    for (std::int64_t k = 0; k < kc; k += 2) {
      const float* even = src + k * k_stride + p0;
      const float* odd = k + 1 < kc ? even + k_stride : nullptr;
      for (std::int64_t l = 0; l < width; ++l) {
        dst[k * width + l] = l < lines && odd ? round_to_bf16(odd[l]) : 0.0f;
        dst[(k + 1) * width + l] = l < lines ? round_to_bf16(even[l]) : 0.0f;
      }
    }
  }
}

void swapped_lines(const float* src, std::int64_t line_stride, std::int64_t lines, std::int64_t kc, float* dst,
                   std::int64_t width) {
  for (std::int64_t k = 0; k < kc; k += 2) {
    for (std::int64_t l = 0; l < width; ++l) {
      const float* line = src + l * line_stride;
      dst[k * width + l] = l < lines && k + 1 < kc ? round_to_bf16(line[k + 1]) : 0.0f;
      dst[(k + 1) * width + l] = l < lines ? round_to_bf16(line[k]) : 0.0f;
    }
  }
}

}  // namespace

F32MicroKernel f32_kernel_portable() { return {kMr, kNr, f32_4x8}; }
PackKernels pack_kernels_portable() {
  return {transpose_lines, bf16_pairs, pair_lines, swapped_rows, swapped_lines};
}

}  // namespace atl::cpu::gemm_detail

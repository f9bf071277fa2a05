// AMX micro-kernel for bf16 operands (opt-in, compute.bf16_gemm: amx): 32 x 32 tiles of C as four
// 16 x 16 fp32 tile registers, fed 32 k at a time by tdpbf16ps. Not the chain gemm.hpp defines:
// tdpbf16ps adds the 32 products of a k chunk and the accumulator as one aligned sum (products far
// below the largest of them are dropped, then one rounding), which no FMA order reproduces. Each
// C element still depends only on its own row and column and on the fixed chunks k = 32q..32q+31,
// so the route keeps batch, tile, thread and layout invariance on a machine with AMX.
#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace atl::cpu::gemm_detail {

namespace {

constexpr int kTile = 16;

// Palette 1, eight tiles of 16 rows x 64 bytes: 0-3 accumulate C, 4-5 hold A, 6-7 hold B.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// A panel: per chunk of 16 pairs, 32 rows of 16 uint32 (row-major, 64 bytes a row). B panel:
// [pair][32 columns] uint32 (the vdpbf16ps layout), 128 bytes a pair row.
__attribute__((target("amx-tile,amx-bf16"))) void amx_32x32(std::int64_t kpairs, const std::uint32_t* ap,
                                                           const std::uint32_t* bp, float* c, std::int64_t ldc,
                                                           bool accumulate) {
  const std::int64_t row_bytes = ldc * static_cast<std::int64_t>(sizeof(float));
  if (accumulate) {
    _tile_loadd(0, c, row_bytes);
    _tile_loadd(1, c + kTile, row_bytes);
    _tile_loadd(2, c + kTile * ldc, row_bytes);
    _tile_loadd(3, c + kTile * ldc + kTile, row_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::int64_t q = 0; q < kpairs; q += kTile, ap += 32 * kTile, bp += kTile * 32) {
    _tile_loadd(4, ap, 64);
    _tile_loadd(5, ap + kTile * kTile, 64);
    _tile_loadd(6, bp, 128);
    _tile_loadd(7, bp + kTile, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, row_bytes);
  _tile_stored(1, c + kTile, row_bytes);
  _tile_stored(2, c + kTile * ldc, row_bytes);
  _tile_stored(3, c + kTile * ldc + kTile, row_bytes);
}

}  // namespace

__attribute__((target("amx-tile"))) void amx_tiles_on() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kTile;
    config.colsb[t] = 64;
  }
  // Not _tile_loadconfig: GCC 12 treats its operand as 16 bytes and drops the stores of the
  // tile shapes (an unconfigured tile then faults as an illegal instruction).
  asm volatile("ldtilecfg %0" : : "m"(config));
}

__attribute__((target("amx-tile"))) void amx_tiles_off() { _tile_release(); }

Bf16MicroKernel bf16_kernel_amx() { return {32, 32, amx_32x32}; }

}  // namespace atl::cpu::gemm_detail
#endif

// The GEMM driver: cache blocking (BLIS loop order), packing with zero padding, the choice of
// micro-kernel, and the split of C over the compute pool. See gemm.hpp for the numerics contract.
#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cpu/bf16_emulation.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/vector_math.hpp"
#include "kernels/kernel_clock.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace atl::cpu {

namespace {

using namespace gemm_detail;

// Block sizes: a B block (KC x NC) stays in L2, a B micro-panel (KC x NR) in L1, an A block
// (MC x KC) streams through L2. MC is a multiple of every MR; KC is even (bf16 pairs).
constexpr std::int64_t kKc = 256, kMc = 96, kNc = 512;
constexpr std::int64_t kKcBf16 = 512;  // bf16 panels take half the bytes: twice the depth fits

struct Operands {
  GemmShape s;
  const float* a;
  const float* b;
  float* c;
};

// How a GEMM's operands are packed and multiplied. bf16_amx: the opt-in AMX tiles (not the chain's
// bits: gemm_kernel_amx.cpp).
enum class Route { f32, bf16_dot, bf16_as_f32, bf16_amx };

// AMX panels hold whole chunks of 32 k (16 pairs), zero-padded.
constexpr std::int64_t kAmxChunkPairs = 16;

bool pairs_route(Route r) { return r == Route::bf16_dot || r == Route::bf16_amx; }

struct Plan {
  Route route;
  int mr, nr;
  F32Kernel f32 = nullptr;
  Bf16Kernel bf16 = nullptr;
  PackKernels pack;
};

Plan plan_for(GemmOperands operands) {
  const CpuFeatures& f = cpu_features();
  F32MicroKernel k = f32_kernel_portable();
  PackKernels pack = pack_kernels_portable();
#if defined(__x86_64__)
  if (f.isa == Isa::avx512) {
    k = f32_kernel_avx512();
    pack = pack_kernels_avx512();
  }
  if (f.isa == Isa::avx2) {
    k = f32_kernel_avx2();
    pack = pack_kernels_avx2();
  }
  if (operands == GemmOperands::bf16 && f.bf16_amx) {
    const Bf16MicroKernel b = bf16_kernel_amx();
    return {Route::bf16_amx, b.mr, b.nr, nullptr, b.run, pack_kernels_amx()};
  }
  if (operands == GemmOperands::bf16 && f.bf16_dot) {
    const Bf16MicroKernel b = bf16_kernel_avx512();
    return {Route::bf16_dot, b.mr, b.nr, nullptr, b.run, pack};
  }
#endif
  return {operands == GemmOperands::bf16 ? Route::bf16_as_f32 : Route::f32, k.mr, k.nr, k.run, nullptr, pack};
}

// Per-thread packing buffers, grown on demand and reused across calls.
struct Scratch {
  void* a = nullptr;
  void* b = nullptr;
  std::size_t a_bytes = 0, b_bytes = 0;
  float tile[32 * 32];

  ~Scratch() {
    std::free(a);
    std::free(b);
  }
  static void* grow(void*& p, std::size_t& have, std::size_t need) {
    if (need <= have) return p;
    std::free(p);
    have = 0;  // a failed allocation below must not leave a null buffer that claims the old size
    p = std::aligned_alloc(64, (need + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    have = need;
    return p;
  }
};

thread_local Scratch tls_scratch;

// A strided view of lines (rows of A, columns of B) by k: element (line, k) at
// base[line * line_stride + k * k_stride]. One of the strides is 1.
struct Lines {
  const float* base;
  std::int64_t line_stride, k_stride;
};

// A full fp32 panel of `W` lines read across k (rows of B, or of A^T): a copy of a size known at
// compile time is a few vector moves, where a copy of a runtime size was a memmove call per k
// (with A's 6 lines a panel on AVX2, the weight gradients' TN GEMMs ran at ~0.75x OpenBLAS).
template <int W>
void copy_full_panel(const float* base, std::int64_t k_stride, std::int64_t kc, float* dst) {
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* col = base + k * k_stride;
    if (k + kPrefetchRows < kc) __builtin_prefetch(col + kPrefetchRows * k_stride);  // rows a page apart
    std::memcpy(dst + k * W, col, W * sizeof(float));
  }
}
// False for a width without a fixed-size copy (the general loop packs it).
bool copy_full_panel(std::int64_t width, const float* base, std::int64_t k_stride, std::int64_t kc, float* dst) {
  switch (width) {
    case 4: copy_full_panel<4>(base, k_stride, kc, dst); return true;
    case 6: copy_full_panel<6>(base, k_stride, kc, dst); return true;
    case 8: copy_full_panel<8>(base, k_stride, kc, dst); return true;
    case 12: copy_full_panel<12>(base, k_stride, kc, dst); return true;
    case 16: copy_full_panel<16>(base, k_stride, kc, dst); return true;
    case 32: copy_full_panel<32>(base, k_stride, kc, dst); return true;
    default: return false;
  }
}

// Packs lines [0, count) x k [0, kc) into panels of `width` lines, [k'][width] each; lines past
// `count` are zero. f32: k' = k. bf16_dot: uint32 pairs (k even in the low half), k padded to even.
// bf16_as_f32: bf16-rounded floats with each pair swapped (odd k first), k padded to even.
// k-contiguous lines (rows of A, columns of B^T) are transposed into panels a register block at a time.
// (bf16_amx packs with pack_a_amx and pack_b_amx.)
void pack_lines(const Lines& src, std::int64_t count, std::int64_t kc, std::int64_t width, const Plan& plan,
                void* out) {
  const Route route = plan.route;
  const PackKernels& pk = plan.pack;
  const std::int64_t pairs = (kc + 1) / 2, depth = route == Route::f32 ? kc : 2 * pairs;
  const bool k_contiguous = src.k_stride == 1;
  if (route == Route::bf16_dot && !k_contiguous) {  // every panel at once: whole rows read in order
    pk.bf16_pairs(src.base, src.k_stride, kc, count, static_cast<std::uint32_t*>(out), width, pairs);
    return;
  }
  if (route == Route::bf16_as_f32 && !k_contiguous) {
    pk.swapped_rows(src.base, src.k_stride, kc, count, static_cast<float*>(out), width);
    return;
  }
  for (std::int64_t p0 = 0; p0 < count; p0 += width) {
    const std::int64_t lines = std::min(width, count - p0);
    if (route == Route::f32) {
      float* dst = static_cast<float*>(out) + p0 * depth;
      if (k_contiguous) {
        pk.transpose(reinterpret_cast<const std::uint32_t*>(src.base + p0 * src.line_stride), src.line_stride, lines,
                     kc, reinterpret_cast<std::uint32_t*>(dst), width);
        continue;
      }
      if (lines == width && copy_full_panel(width, src.base + p0 * src.line_stride, src.k_stride, kc, dst)) continue;
      for (std::int64_t k = 0; k < kc; ++k) {
        const float* col = src.base + k * src.k_stride + p0 * src.line_stride;
        if (k + kPrefetchRows < kc) __builtin_prefetch(col + kPrefetchRows * src.k_stride);  // rows a page apart
        std::copy(col, col + lines, dst + k * width);
        std::fill(dst + k * width + lines, dst + (k + 1) * width, 0.0f);
      }
      continue;
    }
    if (route == Route::bf16_as_f32) {
      pk.swapped_lines(src.base + p0 * src.line_stride, src.line_stride, lines, kc, static_cast<float*>(out) + p0 * depth,
                       width);
      continue;
    }
    // bf16_dot from k-contiguous lines: pairs (k even, k odd) of rounded values, the odd one 0 past kc.
    pk.pair_lines(src.base + p0 * src.line_stride, src.line_stride, lines, kc,
                  static_cast<std::uint32_t*>(out) + p0 * pairs, width);
  }
}

std::int64_t padded_pairs(std::int64_t kc) {
  return (kc + 2 * kAmxChunkPairs - 1) / (2 * kAmxChunkPairs) * kAmxChunkPairs;
}

// AMX A panels (gemm_kernels.hpp): per chunk of 16 pairs, MR rows of 16 pairs, zero past kc.
void pack_a_amx(const Lines& src, const Plan& p, std::int64_t mc, std::int64_t kc, void* out) {
  const std::int64_t padded = padded_pairs(kc), panels = (mc + p.mr - 1) / p.mr;
  const bool k_contiguous = src.k_stride == 1;
  for (std::int64_t panel = 0; panel < panels; ++panel) {
    const float* first = src.base + panel * p.mr * src.line_stride;
    const std::int64_t lines = std::min<std::int64_t>(p.mr, mc - panel * p.mr);
    std::uint32_t* dst = static_cast<std::uint32_t*>(out) + panel * p.mr * padded;
    if (k_contiguous) {
      p.pack.amx_rows(first, src.line_stride, lines, kc, dst, p.mr, padded);
    } else {
      p.pack.amx_rows_across_k(first, src.k_stride, lines, kc, dst, p.mr, padded);
    }
  }
}

// AMX B panels: bf16_dot's, each zero-padded to whole chunks. B read across k is packed in one
// pass over whole rows (panel by panel, each row would be read in 128-byte pieces).
void pack_b_amx(const Lines& src, const Plan& p, std::int64_t nc, std::int64_t kc, void* out) {
  const std::int64_t pairs = (kc + 1) / 2, padded = padded_pairs(kc), width = p.nr;
  auto* panels = static_cast<std::uint32_t*>(out);
  if (src.k_stride != 1) p.pack.bf16_pairs(src.base, src.k_stride, kc, nc, panels, width, padded);
  for (std::int64_t p0 = 0; p0 < nc; p0 += width) {
    std::uint32_t* dst = panels + p0 * padded;
    if (src.k_stride == 1) {
      p.pack.pair_lines(src.base + p0 * src.line_stride, src.line_stride, std::min(width, nc - p0), kc, dst, width);
    }
    std::fill(dst + pairs * width, dst + padded * width, 0u);
  }
}

// A rows [i0, i0+mc) x k [k0, k0+kc) into MR-row panels.
void pack_a(const Operands& o, const Plan& p, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
            void* out) {
  const GemmShape& s = o.s;
  const Lines lines = s.trans_a ? Lines{o.a + k0 * s.lda + i0, 1, s.lda} : Lines{o.a + i0 * s.lda + k0, s.lda, 1};
  if (p.route == Route::bf16_amx) {
    pack_a_amx(lines, p, mc, kc, out);
    return;
  }
  pack_lines(lines, mc, kc, p.mr, p, out);
}

// B k [k0, k0+kc) x columns [j0, j0+nc) into NR-column panels.
void pack_b(const Operands& o, const Plan& p, std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
            void* out) {
  const GemmShape& s = o.s;
  const Lines lines = s.trans_b ? Lines{o.b + j0 * s.ldb + k0, s.ldb, 1} : Lines{o.b + k0 * s.ldb + j0, 1, s.ldb};
  if (p.route == Route::bf16_amx) {
    pack_b_amx(lines, p, nc, kc, out);
    return;
  }
  pack_lines(lines, nc, kc, p.nr, p, out);
}

// One MR x NR tile; an edge tile goes through a padded buffer so it runs the same kernel.
void run_tile(const Plan& p, std::int64_t depth, const void* ap, const void* bp, float* c, std::int64_t ldc,
              std::int64_t rows, std::int64_t cols, bool accumulate, float* tile) {
  float* target = c;
  std::int64_t ld = ldc;
  const bool edge = rows < p.mr || cols < p.nr;
  if (edge) {
    target = tile;
    ld = p.nr;
    if (accumulate) {
      std::fill(tile, tile + p.mr * p.nr, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) std::memcpy(tile + r * ld, c + r * ldc, sizeof(float) * cols);
    }
  }
  if (pairs_route(p.route)) {
    p.bf16(depth / 2, static_cast<const std::uint32_t*>(ap), static_cast<const std::uint32_t*>(bp), target, ld,
           accumulate);
  } else {
    p.f32(depth, static_cast<const float*>(ap), static_cast<const float*>(bp), target, ld, accumulate);
  }
  if (edge) {
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, tile + r * ld, sizeof(float) * cols);
  }
}

// One K block's packing geometry: its k count, the packed depth (bf16: padded to pairs) and the
// bytes a panel holds per row (A) or column (B): 4 per k, or 4 per bf16 pair.
struct KBlock {
  std::int64_t kc, depth, stride;
  bool last;  // the final K block: C is complete after it
};

std::int64_t block_k(const Plan& p) { return pairs_route(p.route) ? kKcBf16 : kKc; }

KBlock k_block(const Plan& p, std::int64_t k, std::int64_t pc) {
  const std::int64_t kc = std::min(block_k(p), k - pc);
  const std::int64_t depth = p.route == Route::f32        ? kc
                             : p.route == Route::bf16_amx ? 2 * padded_pairs(kc)
                                                          : (kc + 1) / 2 * 2;
  const std::int64_t stride = static_cast<std::int64_t>(sizeof(float)) * (pairs_route(p.route) ? depth / 2 : depth);
  return {kc, depth, stride, pc + kc == k};
}

// vdpbf16ps treats denormal inputs (the accumulator's too) as zero and flushes denormal results,
// whatever MXCSR says; the fp32 FMAs that stand in for it do the same while this guard sets
// MXCSR's DAZ and FTZ bits (this thread only; restored on leaving). Packing moves and rounds bits
// with integer operations, which the bits do not touch (its one float operation, AVX2's unordered
// compare that finds NaNs, is not changed by DAZ: a denormal is ordered either way).
class Bf16DenormalRule {
 public:
  explicit Bf16DenormalRule(bool on) {
#if defined(__x86_64__)
    if (on) {
      saved_ = _mm_getcsr();
      _mm_setcsr(saved_ | kDaz | kFtz);
      active_ = true;
    }
#else
    (void)on;
#endif
  }
  ~Bf16DenormalRule() {
#if defined(__x86_64__)
    if (active_) _mm_setcsr(saved_);
#endif
  }
  Bf16DenormalRule(const Bf16DenormalRule&) = delete;
  Bf16DenormalRule& operator=(const Bf16DenormalRule&) = delete;

 private:
  static constexpr unsigned kDaz = 0x0040, kFtz = 0x8000;
  unsigned saved_ = 0;
  bool active_ = false;
};

// The tiles of C rows [ic, ic + mc) x columns [jc, jc + nc) from packed A panels (the block's first
// at ap) and packed B panels. In the final K block with round_bf16, the block's C is rounded to
// bf16 while it is still in cache.
void multiply_block(const Operands& o, const Plan& p, const KBlock& kb, const char* ap, const void* bp,
                    std::int64_t ic, std::int64_t mc, std::int64_t jc, std::int64_t nc, bool accumulate, float* tile) {
  for (std::int64_t jr = 0; jr < nc; jr += p.nr) {
    const char* b_panel = static_cast<const char*>(bp) + jr * kb.stride;
    for (std::int64_t ir = 0; ir < mc; ir += p.mr) {
      run_tile(p, kb.depth, ap + ir * kb.stride, b_panel, o.c + (ic + ir) * o.s.ldc + jc + jr, o.s.ldc,
               std::min<std::int64_t>(p.mr, mc - ir), std::min<std::int64_t>(p.nr, nc - jr), accumulate, tile);
    }
  }
  if (kb.last && o.s.round_bf16) {
    for (std::int64_t i = ic; i < ic + mc; ++i) round_to_bf16_values(o.c + i * o.s.ldc + jc, nc);
  }
}

// A packed once per K block for all of its rows (at most kWholeARows), then every column block
// of B against it: A is not packed again per column block, and an A read across k (TN) reads
// whole rows in order. Each C element still sums its K blocks in order: the same bits.
constexpr std::int64_t kWholeARows = 2048;

void gemm_serial_whole_a(const Operands& o, const Plan& p) {
  const GemmShape& s = o.s;
  Scratch& scratch = tls_scratch;
  const std::int64_t m_padded = (s.m + p.mr - 1) / p.mr * p.mr;
  for (std::int64_t pc = 0; pc < s.k; pc += block_k(p)) {
    const KBlock kb = k_block(p, s.k, pc);
    void* ap = Scratch::grow(scratch.a, scratch.a_bytes, sizeof(float) * kb.depth * m_padded);
    pack_a(o, p, 0, s.m, pc, kb.kc, ap);
    for (std::int64_t jc = 0; jc < s.n; jc += kNc) {
      const std::int64_t nc = std::min(kNc, s.n - jc);
      void* bp = Scratch::grow(scratch.b, scratch.b_bytes, sizeof(float) * kb.depth * ((nc + p.nr - 1) / p.nr * p.nr));
      pack_b(o, p, pc, kb.kc, jc, nc, bp);
      for (std::int64_t ic = 0; ic < s.m; ic += kMc) {
        multiply_block(o, p, kb, static_cast<const char*>(ap) + ic * kb.stride, bp, ic, std::min(kMc, s.m - ic), jc,
                       nc, s.accumulate || pc > 0, scratch.tile);
      }
    }
  }
}

// The AMX tile configuration, loaded on this thread for one GEMM part and released after.
class AmxTiles {
 public:
  explicit AmxTiles(bool on) : on_(on) {
#if defined(__x86_64__)
    if (on_) amx_tiles_on();
#endif
  }
  ~AmxTiles() {
#if defined(__x86_64__)
    if (on_) amx_tiles_off();
#endif
  }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;

 private:
  bool on_;
};

// BLIS order: a B block (K block x column block) packed once, A packed per row block.
void gemm_serial(const Operands& o, const Plan& p) {
  const Bf16DenormalRule denormals(p.route == Route::bf16_as_f32);  // once per call and per pool part
  const AmxTiles tiles(p.route == Route::bf16_amx);
  const GemmShape& s = o.s;
  if (s.m <= kWholeARows && (s.n > kNc || (s.trans_a && pairs_route(p.route)))) {
    gemm_serial_whole_a(o, p);
    return;
  }
  Scratch& scratch = tls_scratch;
  for (std::int64_t jc = 0; jc < s.n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, s.n - jc);
    for (std::int64_t pc = 0; pc < s.k; pc += block_k(p)) {
      const KBlock kb = k_block(p, s.k, pc);
      void* bp = Scratch::grow(scratch.b, scratch.b_bytes, sizeof(float) * kb.depth * ((nc + p.nr - 1) / p.nr * p.nr));
      pack_b(o, p, pc, kb.kc, jc, nc, bp);
      for (std::int64_t ic = 0; ic < s.m; ic += kMc) {
        const std::int64_t mc = std::min(kMc, s.m - ic);
        void* ap = Scratch::grow(scratch.a, scratch.a_bytes, sizeof(float) * kb.depth * ((mc + p.mr - 1) / p.mr * p.mr));
        pack_a(o, p, ic, mc, pc, kb.kc, ap);
        multiply_block(o, p, kb, static_cast<const char*>(ap), bp, ic, mc, jc, nc, s.accumulate || pc > 0,
                       scratch.tile);
      }
    }
  }
}

void check_shape(const GemmShape& s) {
  const bool ok = s.m >= 0 && s.n >= 0 && s.k >= 0 && s.ldc >= s.n && s.lda >= (s.trans_a ? s.m : s.k) &&
                  s.ldb >= (s.trans_b ? s.k : s.n);
  if (!ok) {
    throw std::invalid_argument("gemm: inconsistent shape m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                                " k=" + std::to_string(s.k) + " lda=" + std::to_string(s.lda) +
                                " ldb=" + std::to_string(s.ldb) + " ldc=" + std::to_string(s.ldc));
  }
}

}  // namespace

void gemm_f32(const GemmShape& s, const float* a, const float* b, float* c, GemmOperands operands) {
  KernelScope scope(KernelKind::gemm);
  check_shape(s);
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    for (std::int64_t i = 0; i < s.m; ++i) {
      if (!s.accumulate) std::fill(c + i * s.ldc, c + i * s.ldc + s.n, 0.0f);
      if (s.round_bf16) round_to_bf16_values(c + i * s.ldc, s.n);
    }
    return;
  }
  const Plan plan = plan_for(operands);
  const Operands whole{s, a, b, c};
  const int parts = useful_parts(s.m * s.n * s.k, kGemmMinParallelWork);
  if (parts == 1) {
    gemm_serial(whole, plan);
    return;
  }
  // Split C into row blocks when there are rows enough for every thread, else into column blocks;
  // the blocks are whole micro-tiles so no extra edges appear.
  const bool by_rows = s.m >= std::int64_t(parts) * 4 * plan.mr;
  const std::int64_t unit = by_rows ? plan.mr : plan.nr;
  const std::int64_t extent = by_rows ? s.m : s.n;
  const std::int64_t units = (extent + unit - 1) / unit;
  parallel_ranges(units, parts, [&](std::int64_t u0, std::int64_t u1) {
    const std::int64_t begin = u0 * unit, end = std::min(extent, u1 * unit);
    Operands part = whole;
    if (by_rows) {
      part.s.m = end - begin;
      part.a = s.trans_a ? a + begin : a + begin * s.lda;
      part.c = c + begin * s.ldc;
    } else {
      part.s.n = end - begin;
      part.b = s.trans_b ? b + begin * s.ldb : b + begin;
      part.c = c + begin;
    }
    gemm_serial(part, plan);
  });
}

void gemm_f64(const GemmShape& s, const double* a, const double* b, double* c) {
  check_shape(s);
  for (std::int64_t i = 0; i < s.m; ++i) {
    double* ci = c + i * s.ldc;
    if (!s.accumulate) std::fill(ci, ci + s.n, 0.0);
    for (std::int64_t k = 0; k < s.k; ++k) {
      const double aik = s.trans_a ? a[k * s.lda + i] : a[i * s.lda + k];
      for (std::int64_t j = 0; j < s.n; ++j) ci[j] += aik * (s.trans_b ? b[j * s.ldb + k] : b[k * s.ldb + j]);
    }
    if (s.round_bf16) {
      for (std::int64_t j = 0; j < s.n; ++j) ci[j] = maybe_round_bf16(ci[j], true);
    }
  }
}

}  // namespace atl::cpu

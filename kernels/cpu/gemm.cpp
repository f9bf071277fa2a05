// The GEMM driver: cache blocking (BLIS loop order), packing with zero padding, the choice of
// micro-kernel, and the split of C over the compute pool. See gemm.hpp for the numerics contract.
#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

using namespace gemm_detail;

// Block sizes: a B block (KC x NC) stays in L2, a B micro-panel (KC x NR) in L1, an A block
// (MC x KC) streams through L2. MC is a multiple of every MR; KC is even (bf16 pairs).
constexpr std::int64_t kKc = 256, kMc = 96, kNc = 512;
// Below this many multiply-adds a GEMM runs on the calling thread alone.
constexpr std::int64_t kMinParallelWork = std::int64_t(1) << 17;

struct Operands {
  GemmShape s;
  const float* a;
  const float* b;
  float* c;

  float a_at(std::int64_t i, std::int64_t k) const { return s.trans_a ? a[k * s.lda + i] : a[i * s.lda + k]; }
  float b_at(std::int64_t k, std::int64_t j) const { return s.trans_b ? b[j * s.ldb + k] : b[k * s.ldb + j]; }
};

// How a GEMM's operands are packed and multiplied.
enum class Route { f32, bf16_dot, bf16_as_f32 };

struct Plan {
  Route route;
  int mr, nr;
  F32Kernel f32 = nullptr;
  Bf16Kernel bf16 = nullptr;
};

Plan plan_for(GemmOperands operands) {
  const CpuFeatures& f = cpu_features();
  F32MicroKernel k = f32_kernel_portable();
#if defined(__x86_64__)
  if (f.isa == Isa::avx512) k = f32_kernel_avx512();
  if (f.isa == Isa::avx2) k = f32_kernel_avx2();
  if (operands == GemmOperands::bf16 && f.bf16_dot) {
    const Bf16MicroKernel b = bf16_kernel_avx512();
    return {Route::bf16_dot, b.mr, b.nr, nullptr, b.run};
  }
#endif
  return {operands == GemmOperands::bf16 ? Route::bf16_as_f32 : Route::f32, k.mr, k.nr, k.run, nullptr};
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
    p = std::aligned_alloc(64, (need + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    have = need;
    return p;
  }
};

thread_local Scratch tls_scratch;

std::uint32_t bf16_pair(float even, float odd) {
  return static_cast<std::uint32_t>(float_to_bf16_bits(even)) |
         (static_cast<std::uint32_t>(float_to_bf16_bits(odd)) << 16);
}

// A rows [i0, i0+mc) x k [k0, k0+kc) into MR-row panels [kc'][MR]; rows past M are zero.
// bf16_as_f32: rounded to bf16 and each k pair swapped (odd first), kc padded to even.
void pack_a(const Operands& o, const Plan& p, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc,
            void* out) {
  const std::int64_t mr = p.mr;
  for (std::int64_t ip = 0; ip < mc; ip += mr) {
    const std::int64_t rows = std::min(mr, mc - ip);
    if (p.route == Route::f32) {
      float* dst = static_cast<float*>(out) + ip * kc;
      for (std::int64_t r = 0; r < mr; ++r)
        for (std::int64_t k = 0; k < kc; ++k) dst[k * mr + r] = r < rows ? o.a_at(i0 + ip + r, k0 + k) : 0.0f;
      continue;
    }
    const std::int64_t pairs = (kc + 1) / 2;
    auto at = [&](std::int64_t r, std::int64_t k) { return r < rows && k < kc ? o.a_at(i0 + ip + r, k0 + k) : 0.0f; };
    if (p.route == Route::bf16_dot) {
      std::uint32_t* dst = static_cast<std::uint32_t*>(out) + ip * pairs;
      for (std::int64_t r = 0; r < mr; ++r)
        for (std::int64_t q = 0; q < pairs; ++q) dst[q * mr + r] = bf16_pair(at(r, 2 * q), at(r, 2 * q + 1));
    } else {
      float* dst = static_cast<float*>(out) + ip * 2 * pairs;
      for (std::int64_t r = 0; r < mr; ++r)
        for (std::int64_t q = 0; q < pairs; ++q) {
          dst[(2 * q) * mr + r] = round_to_bf16(at(r, 2 * q + 1));
          dst[(2 * q + 1) * mr + r] = round_to_bf16(at(r, 2 * q));
        }
    }
  }
}

// B k [k0, k0+kc) x columns [j0, j0+nc) into NR-column panels [kc'][NR]; columns past N are zero.
void pack_b(const Operands& o, const Plan& p, std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
            void* out) {
  const std::int64_t nr = p.nr;
  for (std::int64_t jp = 0; jp < nc; jp += nr) {
    const std::int64_t cols = std::min(nr, nc - jp);
    if (p.route == Route::f32) {
      float* dst = static_cast<float*>(out) + jp * kc;
      if (o.s.trans_b) {
        for (std::int64_t j = 0; j < nr; ++j)
          for (std::int64_t k = 0; k < kc; ++k) dst[k * nr + j] = j < cols ? o.b_at(k0 + k, j0 + jp + j) : 0.0f;
      } else {
        for (std::int64_t k = 0; k < kc; ++k)
          for (std::int64_t j = 0; j < nr; ++j) dst[k * nr + j] = j < cols ? o.b_at(k0 + k, j0 + jp + j) : 0.0f;
      }
      continue;
    }
    const std::int64_t pairs = (kc + 1) / 2;
    auto at = [&](std::int64_t k, std::int64_t j) { return j < cols && k < kc ? o.b_at(k0 + k, j0 + jp + j) : 0.0f; };
    if (p.route == Route::bf16_dot) {
      std::uint32_t* dst = static_cast<std::uint32_t*>(out) + jp * pairs;
      for (std::int64_t q = 0; q < pairs; ++q)
        for (std::int64_t j = 0; j < nr; ++j) dst[q * nr + j] = bf16_pair(at(2 * q, j), at(2 * q + 1, j));
    } else {
      float* dst = static_cast<float*>(out) + jp * 2 * pairs;
      for (std::int64_t q = 0; q < pairs; ++q)
        for (std::int64_t j = 0; j < nr; ++j) {
          dst[(2 * q) * nr + j] = round_to_bf16(at(2 * q + 1, j));
          dst[(2 * q + 1) * nr + j] = round_to_bf16(at(2 * q, j));
        }
    }
  }
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
  if (p.route == Route::bf16_dot) {
    p.bf16(depth / 2, static_cast<const std::uint32_t*>(ap), static_cast<const std::uint32_t*>(bp), target, ld,
           accumulate);
  } else {
    p.f32(depth, static_cast<const float*>(ap), static_cast<const float*>(bp), target, ld, accumulate);
  }
  if (edge) {
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, tile + r * ld, sizeof(float) * cols);
  }
}

void gemm_serial(const Operands& o, const Plan& p) {
  const GemmShape& s = o.s;
  Scratch& scratch = tls_scratch;
  const bool pairs = p.route != Route::f32;
  for (std::int64_t jc = 0; jc < s.n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, s.n - jc);
    const std::int64_t nc_padded = (nc + p.nr - 1) / p.nr * p.nr;
    for (std::int64_t pc = 0; pc < s.k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, s.k - pc);
      const std::int64_t depth = pairs ? (kc + 1) / 2 * 2 : kc;  // packed k per panel (bf16: padded to pairs)
      // Bytes a panel holds per row (A) or column (B): 4 per k, or 4 per bf16 pair.
      const std::int64_t stride = sizeof(float) * (p.route == Route::bf16_dot ? depth / 2 : depth);
      void* bp = Scratch::grow(scratch.b, scratch.b_bytes, sizeof(float) * depth * nc_padded);
      pack_b(o, p, pc, kc, jc, nc, bp);
      const bool accumulate = s.accumulate || pc > 0;
      for (std::int64_t ic = 0; ic < s.m; ic += kMc) {
        const std::int64_t mc = std::min(kMc, s.m - ic);
        const std::int64_t mc_padded = (mc + p.mr - 1) / p.mr * p.mr;
        void* ap = Scratch::grow(scratch.a, scratch.a_bytes, sizeof(float) * depth * mc_padded);
        pack_a(o, p, ic, mc, pc, kc, ap);
        for (std::int64_t jr = 0; jr < nc; jr += p.nr) {
          const char* b_panel = static_cast<const char*>(bp) + jr * stride;
          for (std::int64_t ir = 0; ir < mc; ir += p.mr) {
            const char* a_panel = static_cast<const char*>(ap) + ir * stride;
            run_tile(p, depth, a_panel, b_panel, o.c + (ic + ir) * s.ldc + jc + jr, s.ldc, std::min<std::int64_t>(p.mr, mc - ir),
                     std::min<std::int64_t>(p.nr, nc - jr), accumulate, scratch.tile);
          }
        }
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
  check_shape(s);
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    if (!s.accumulate)
      for (std::int64_t i = 0; i < s.m; ++i) std::fill(c + i * s.ldc, c + i * s.ldc + s.n, 0.0f);
    return;
  }
  const Plan plan = plan_for(operands);
  const Operands whole{s, a, b, c};
  const int parts = useful_parts(s.m * s.n * s.k, kMinParallelWork);
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
  }
}

}  // namespace atl::cpu

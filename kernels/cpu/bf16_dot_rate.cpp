// How fast vdpbf16ps multiplies compared with vfmadd231ps on this core. CPUID says whether the
// instruction exists, not what it costs: on Zen 5 bf16 GEMMs on it ran at 1.8-1.9x fp32 (earlier
// sessions' bench), on Sapphire Rapids it issues at a quarter of the FMAs' rate (half their
// multiply-adds: measured 0.50x), so there the bf16 chain is faster on fp32 FMAs. Either route
// gives the same bits (gemm.hpp), so this measurement changes speed only.
#include "kernels/cpu/cpu_features.hpp"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace atl::cpu {

#if defined(__x86_64__)
namespace {

// 12 independent chains hide either instruction's latency; the asm barrier keeps the loop from
// being folded. Seconds for `rounds` x 12 instructions.
constexpr int kChains = 12;

template <class Step>
double time_chains(long rounds, Step step) {
  const auto t0 = std::chrono::steady_clock::now();
  step(rounds);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

__attribute__((target("avx512f"))) void fma_rounds(long rounds) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(0.5f);
  for (long r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_fmadd_ps(x, x, a);
    asm volatile("" : "+v"(x));
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  asm volatile("" : : "v"(sum));
}

__attribute__((target("avx512f,avx512bf16"))) void dot_rounds(long rounds) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f003f00);  // pairs of 0.5
  for (long r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, x);
    asm volatile("" : "+v"(x));
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  asm volatile("" : : "v"(sum));
}

}  // namespace

double bf16_dot_rate_vs_fma() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  // Best of 5 interleaved tries (~1 ms in all): a busy sibling or a clock still rising after the
  // first AVX-512 instructions only slows a try down.
  constexpr long kRounds = 20000;
  double fma = 1e30, dot = 1e30;
  for (int t = 0; t < 5; ++t) {
    fma = std::min(fma, time_chains(kRounds, fma_rounds));
    dot = std::min(dot, time_chains(kRounds, dot_rounds));
  }
  return (32.0 / dot) / (16.0 / fma);  // multiply-adds per second: 32 per vdpbf16ps, 16 per FMA
}
#else
double bf16_dot_rate_vs_fma() { return 0.0; }
#endif

}  // namespace atl::cpu

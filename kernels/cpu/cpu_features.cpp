#include "kernels/cpu/cpu_features.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace atl::cpu {

CpuFeatures detected_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // The avx512 level's loops are compiled for F, BW, DQ and VL (every AVX-512 server CPU since Skylake).
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  f.isa = avx512 ? Isa::avx512 : avx2 ? Isa::avx2 : Isa::portable;
  f.bf16_dot = avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

namespace {

CpuFeatures select_features() {
  CpuFeatures f = detected_cpu_features();
  const char* cap = std::getenv("ATOLL_CPU_ISA");
  if (!cap || !*cap) return f;
  const std::string_view want(cap);
  Isa limit;
  if (want == "portable") {
    limit = Isa::portable;
  } else if (want == "avx2") {
    limit = Isa::avx2;
  } else if (want == "avx512") {
    limit = Isa::avx512;
  } else {
    throw CpuIsaError("ATOLL_CPU_ISA: expected portable, avx2 or avx512, got '" + std::string(want) + "'");
  }
  if (limit < f.isa) f.isa = limit;
  if (f.isa != Isa::avx512) f.bf16_dot = false;
  return f;
}

CpuFeatures& selected() {
  static CpuFeatures features = select_features();
  return features;
}

}  // namespace

const CpuFeatures& cpu_features() { return selected(); }

void use_cpu_features(CpuFeatures f) {
  const CpuFeatures best = detected_cpu_features();
  if (best.isa < f.isa) f.isa = best.isa;
  f.bf16_dot = f.bf16_dot && best.bf16_dot && f.isa == Isa::avx512;
  selected() = f;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

std::string kernel_description(const CpuFeatures& f) {
  return std::string(isa_name(f.isa)) + (f.bf16_dot ? " (bf16 dot)" : "");
}

}  // namespace atl::cpu

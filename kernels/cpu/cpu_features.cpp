#include "kernels/cpu/cpu_features.hpp"

#include <cstdlib>
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
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

CpuFeatures process_features() {
  CpuFeatures f = select_features();
  if (f.bf16_dot && bf16_dot_rate_vs_fma() < 1.0) {
    f.bf16_dot = false;
    f.bf16_dot_slower = true;
  }
  return f;
}

CpuFeatures& selected() {
  static CpuFeatures features = process_features();
  return features;
}

}  // namespace

const CpuFeatures& cpu_features() { return selected(); }

void use_cpu_features(CpuFeatures f) {
  const CpuFeatures best = detected_cpu_features();
  if (best.isa < f.isa) f.isa = best.isa;
  f.bf16_dot = f.bf16_dot && best.bf16_dot && f.isa == Isa::avx512;
  f.bf16_dot_slower = f.bf16_dot_slower && !f.bf16_dot;
  f.bf16_amx = f.bf16_amx && f.isa == Isa::avx512 && amx_available();
  selected() = f;
}

bool amx_in_cpu() {
#if defined(__x86_64__)
  unsigned eax = 7, ebx = 0, ecx = 0, edx = 0;
  __asm__("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
  const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
  // (The route's packers round with AVX512_BF16, which every AMX CPU so far has.)
  return tile && bf16 && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool amx_available() {
#if defined(__x86_64__)
  static const bool available = [] {
    // Linux hands out the 8 KiB tile state only on request (once per process, for every thread).
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return amx_in_cpu() && syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return available;
#else
  return false;
#endif
}

void use_bf16_amx(bool on) {
  if (on && !amx_available()) {
    throw CpuIsaError("AMX with bf16 is not available on this CPU (or Linux refused its tile state)");
  }
  if (on && selected().isa != Isa::avx512) {  // its packers are AVX-512 code
    throw CpuIsaError("AMX needs the avx512 kernel level; ATOLL_CPU_ISA caps it at " +
                      std::string(isa_name(selected().isa)));
  }
  selected().bf16_amx = on;
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
  const char* bf16 = f.bf16_amx          ? " (bf16 amx)"
                     : f.bf16_dot        ? " (bf16 dot)"
                     : f.bf16_dot_slower ? " (bf16 on FMAs: its dot is slower)"
                                         : "";
  return std::string(isa_name(f.isa)) + bf16;
}

}  // namespace atl::cpu

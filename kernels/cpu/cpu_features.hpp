// Which instruction set the CPU kernels use, chosen once per process from CPUID. Every level
// computes the same bits (each GEMM output is one fused multiply-add chain in a fixed order), so
// the choice changes speed only. ATOLL_CPU_ISA=portable|avx2|avx512 caps the level (for tests and
// for comparing kernels); it can lower the level, never raise it above what the CPU has.
#pragma once
#include <stdexcept>
#include <string>

namespace atl::cpu {

enum class Isa { portable, avx2, avx512 };

struct CpuFeatures {
  Isa isa = Isa::portable;
  bool bf16_dot = false;  // AVX512_BF16 (vdpbf16ps) and the avx512 level in use
  // The CPU has vdpbf16ps but it multiplies slower than fp32 FMAs (bf16_dot_rate_vs_fma() < 1):
  // the bf16 chain then runs on FMAs (the same bits).
  bool bf16_dot_slower = false;
  // Opt-in (compute.bf16_gemm: amx): bf16 operands on AMX tiles, faster but not the chain's bits.
  bool bf16_amx = false;
};

// A bad ATOLL_CPU_ISA value: bad input, which the apps report with exit code 2 like a bad config.
class CpuIsaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Detected once (then cached); honours ATOLL_CPU_ISA (CpuIsaError when it names no level) and
// uses vdpbf16ps only where it outpaces fp32 FMAs.
const CpuFeatures& cpu_features();
// The best level this CPU supports, ignoring ATOLL_CPU_ISA (bf16_dot: the instruction exists).
CpuFeatures detected_cpu_features();
// Multiply-adds per second of vdpbf16ps over those of vfmadd231ps on this core, measured (~1 ms);
// 0 where the CPU lacks either. Sapphire Rapids: 0.50 (Zen 5 not measured yet; its bf16 GEMMs ran
// at 1.8-1.9x fp32 on vdpbf16ps).
double bf16_dot_rate_vs_fma();

// Tests and benchmarks compare kernels in one process: every later kernel call uses `f` (capped at
// what the CPU has). Not for use while kernels run on other threads.
void use_cpu_features(CpuFeatures f);

// AMX tiles with bf16, per CPUID alone (asks Linux for nothing).
bool amx_in_cpu();
// amx_in_cpu() and Linux's permission for the tile state, asked once per process.
bool amx_available();
// compute.bf16_gemm: amx (on) or chain (off), for every later kernel call in this process; on
// throws CpuIsaError where amx_available() is false or the kernel level is below avx512 (the AMX
// route's packers are AVX-512 code).
void use_bf16_amx(bool on);

const char* isa_name(Isa isa);
// "avx512 (bf16 dot)", "avx2", "portable": the run header, run.json and the bench print this.
std::string kernel_description(const CpuFeatures& f);

}  // namespace atl::cpu

// Running a check at every CPU kernel level this machine has, then putting the process's own
// selection back (cpu_features(), which may be capped by ATOLL_CPU_ISA or use the bf16 chain on
// FMAs: not the detected best, which later tests would otherwise inherit).
#pragma once
#include <catch2/catch.hpp>

#include "kernels/cpu/cpu_features.hpp"

namespace atl::testing {

// fn() once per level (portable, avx2, avx512) up to what the CPU has, each made the process's level.
template <class Fn>
void for_each_isa_level(Fn fn) {
  const cpu::CpuFeatures saved = cpu::cpu_features(), best = cpu::detected_cpu_features();
  for (cpu::Isa isa : {cpu::Isa::portable, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best.isa)) continue;
    INFO("isa " << cpu::isa_name(isa));
    cpu::use_cpu_features({isa, false});
    fn();
  }
  cpu::use_cpu_features(saved);
}

}  // namespace atl::testing

// Running a check at every CPU kernel level this machine has, then putting the process's own
// selection back (cpu_features(), which may be capped by ATOLL_CPU_ISA or use the bf16 chain on
// FMAs: not the detected best, which later tests would otherwise inherit).
#pragma once
#include <catch2/catch.hpp>

#include "kernels/cpu/cpu_features.hpp"

namespace atl::testing {

// fn() once per level (portable, avx2, avx512) up to what the CPU has, each made the process's
// level. Levels the CPU lacks are named in a warning: such a machine checks less. The process's
// selection comes back even when fn throws (a failed REQUIRE).
template <class Fn>
void for_each_isa_level(Fn fn) {
  struct Restore {
    cpu::CpuFeatures saved = cpu::cpu_features();
    ~Restore() { cpu::use_cpu_features(saved); }
  } restore;
  const cpu::CpuFeatures best = cpu::detected_cpu_features();
  for (cpu::Isa isa : {cpu::Isa::portable, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best.isa)) {
      WARN("this CPU has no " << cpu::isa_name(isa) << " kernels: that level is not checked here");
      continue;
    }
    INFO("isa " << cpu::isa_name(isa));
    cpu::use_cpu_features({isa, false});
    fn();
  }
}

}  // namespace atl::testing

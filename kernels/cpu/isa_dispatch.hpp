// One loop, compiled once per instruction-set level and picked at run time (cpu_features()).
// Body is a type whose operator() is [[gnu::always_inline]]: it is inlined into each target-
// specific wrapper below and vectorized there. Only for loops whose every operation is exact in
// IEEE terms (add, multiply, divide, sqrt, fma, integer bit work) or elementwise: the vector width
// then changes speed, never a bit of the result.
#pragma once
#include "kernels/cpu/cpu_features.hpp"

namespace atl::cpu {

#if defined(__x86_64__)
template <class Body, class... Args>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) void run_body_avx512(Args... args) {
  Body{}(args...);
}
template <class Body, class... Args>
__attribute__((target("avx2,fma"))) void run_body_avx2(Args... args) {
  Body{}(args...);
}
#endif

template <class Body, class... Args>
void run_for_isa(Args... args) {
#if defined(__x86_64__)
  switch (cpu_features().isa) {
    case Isa::avx512:
      return run_body_avx512<Body>(args...);
    case Isa::avx2:
      return run_body_avx2<Body>(args...);
    case Isa::portable:
      break;
  }
#endif
  Body{}(args...);
}

}  // namespace atl::cpu

// Rounding to bf16 for the templated CPU kernels: floats round when asked, doubles (used only by
// finite-difference checks) never do.
#pragma once
#include <type_traits>

#include "kernels/dtype.hpp"

namespace atl::cpu {

template <class T>
inline T maybe_round_bf16(T v, bool round) {
  if constexpr (std::is_same_v<T, float>) {
    return round ? round_to_bf16(v) : v;
  } else {
    (void)round;
    return v;
  }
}

}  // namespace atl::cpu

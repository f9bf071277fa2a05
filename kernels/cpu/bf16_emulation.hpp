// Rounding to bf16 for the templated CPU kernels, when asked: a double rounds through float, so a
// double run in precision bf16 sees the same grid as a float one (the finite-difference checks run
// in double with rounding off).
#pragma once

#include "kernels/dtype.hpp"

namespace atl::cpu {

template <class T>
inline T maybe_round_bf16(T v, bool round) {
  return round ? static_cast<T>(round_to_bf16(static_cast<float>(v))) : v;
}

}  // namespace atl::cpu

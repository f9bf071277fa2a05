// Float results of libm functions, computed in double and rounded once. glibc promises no
// correctly rounded results and has replaced float implementations between releases; its double
// functions err by well under an ulp of double, so the float they round to is the same from one
// libm to the next unless the exact value lies within an ulp of double of a midpoint between two
// floats (a band 2^-28 of an fp32 ulp wide). Used where a libm result feeds training bits: RoPE
// tables, SSMax factors and attention's log-sum-exp (exp and tanh are atoll's own,
// kernels/cpu/vector_math.hpp).
#pragma once
#include <cmath>

namespace atl::cpu {

inline float sin_rounded(float x) { return static_cast<float>(std::sin(static_cast<double>(x))); }
inline float cos_rounded(float x) { return static_cast<float>(std::cos(static_cast<double>(x))); }
inline float log_rounded(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
inline float pow_rounded(float x, float y) {
  return static_cast<float>(std::pow(static_cast<double>(x), static_cast<double>(y)));
}
// The double overloads: the finite-difference references run the kernels in double.
inline double log_rounded(double x) { return std::log(x); }

}  // namespace atl::cpu

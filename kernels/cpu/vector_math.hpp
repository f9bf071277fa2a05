// Elementwise math with the same bits on every CPU: exp from a Cody-Waite range reduction and a
// degree-5 polynomial (Cephes' expf coefficients), sigmoid and tanh built on it, every step an
// IEEE add, multiply, divide or fused multiply-add, so the AVX-512, AVX2 and portable builds of
// the loop agree exactly. libm's expf
// is not a fixed function across machines (glibc picks an FMA or SSE2 variant at load time), and
// it is scalar. Relative error against exp in double: below 2^-22 (a test bounds it).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace atl::cpu {

// x[i] = exp(x[i]) for i < n. Below -87.3 (where exp leaves the normal range) the result is 0,
// above 88.7 it is +inf; NaN stays NaN.
void exp_inplace(float* x, std::int64_t n);

// x[i] = 1 / (1 + exp(-x[i])), as e / (1 + e) with e = exp(-|x|) for x < 0 (no overflow).
void sigmoid_inplace(float* x, std::int64_t n);

// x[i] = tanh(x[i]) from exp's pieces (Cephes' tanhf scheme): the same bits on every CPU, unlike
// libm's tanhf; relative error below 2^-22 against tanh in double (a test bounds it).
void tanh_inplace(float* x, std::int64_t n);

// x[i] = round_to_bf16(x[i]) (dtype.hpp: nearest even, NaN quieted), vectorized per ISA.
void round_to_bf16_values(float* x, std::int64_t n);
// dst[i] = round_to_bf16(src[i]); src and dst must not overlap.
void round_to_bf16_copy(const float* src, float* dst, std::int64_t n);

// The same functions for one value (bitwise equal to the loops on it).
float exp_f32(float x);
float tanh_f32(float x);

// exp_f32 for float; std::exp for double (the finite-difference references).
template <class T>
T exp_value(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_f32(x);
  } else {
    return std::exp(x);
  }
}

// tanh_inplace for float; std::tanh for double.
template <class T>
void tanh_values(T* x, std::int64_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if constexpr (std::is_same_v<T, float>) {
    tanh_inplace(x, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i]);
  }
}

// exp_inplace for float; std::exp for double.
template <class T>
void exp_values(T* x, std::int64_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if constexpr (std::is_same_v<T, float>) {
    exp_inplace(x, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
  }
}

// sigmoid_inplace for float; the same formula with std::exp for double.
template <class T>
void sigmoid_values(T* x, std::int64_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if constexpr (std::is_same_v<T, float>) {
    sigmoid_inplace(x, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const double e = std::exp(-std::fabs(x[i]));
      x[i] = (x[i] >= 0 ? 1.0 : e) / (1.0 + e);
    }
  }
}

// out = softmax(x) over n >= 1 values: the max subtracted, exp_values, each divided by the sum
// added in index order. Returns the max and the sum (a log-sum-exp is max + log(sum)).
template <class T>
std::pair<T, T> softmax_values(const T* x, std::int64_t n, T* out) {
  T mx = x[0];
  for (std::int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] - mx;
  exp_values(out, n);
  T sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += out[i];
  for (std::int64_t i = 0; i < n; ++i) out[i] /= sum;
  return {mx, sum};
}

}  // namespace atl::cpu

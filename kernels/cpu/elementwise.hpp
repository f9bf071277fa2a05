// Elementwise float loops on raw pointers, one build per instruction set (isa_dispatch.hpp): each
// element is one IEEE multiply or add (and optionally a bf16 rounding), so every build gives the
// same bits. Outputs may equal an input exactly (in place) but must not partly overlap one.
#pragma once
#include <cstdint>

namespace atl::cpu {

// dst[i] += src[i]
void add_values(float* dst, const float* src, std::int64_t n);
// y[i] = c * a[i] (in place: y == a)
void scaled_values(const float* a, float c, float* y, std::int64_t n);
// y[i] = ca * a[i] + cb * b[i], rounded to bf16 when round_bf16
void scaled_sum_values(const float* a, float ca, const float* b, float cb, bool round_bf16, float* y, std::int64_t n);

// The same for the double kernels (finite-difference references): plain loops. Float calls take
// the per-ISA functions above (a non-template is the better match).
template <class T>
void add_values(T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}
template <class T>
void scaled_values(const T* a, T c, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = c * a[i];
}

}  // namespace atl::cpu

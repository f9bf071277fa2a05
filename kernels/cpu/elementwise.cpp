#include "kernels/cpu/elementwise.hpp"

#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

struct AddLoop {
  [[gnu::always_inline]] void operator()(float* dst, const float* src, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
};

struct ScaledLoop {
  [[gnu::always_inline]] void operator()(const float* a, float c, float* y, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) y[i] = c * a[i];
  }
};

template <bool Round>
struct ScaledSumLoop {
  [[gnu::always_inline]] void operator()(const float* a, float ca, const float* b, float cb, float* y,
                                         std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = ca * a[i] + cb * b[i];
      y[i] = Round ? round_to_bf16(v) : v;
    }
  }
};

}  // namespace

void add_values(float* dst, const float* src, std::int64_t n) { run_for_isa<AddLoop>(dst, src, n); }

void scaled_values(const float* a, float c, float* y, std::int64_t n) { run_for_isa<ScaledLoop>(a, c, y, n); }

void scaled_sum_values(const float* a, float ca, const float* b, float cb, bool round_bf16, float* y, std::int64_t n) {
  if (round_bf16) {
    run_for_isa<ScaledSumLoop<true>>(a, ca, b, cb, y, n);
  } else {
    run_for_isa<ScaledSumLoop<false>>(a, ca, b, cb, y, n);
  }
}

}  // namespace atl::cpu

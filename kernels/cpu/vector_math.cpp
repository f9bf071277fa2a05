#include "kernels/cpu/vector_math.hpp"

#include <cmath>

#include "kernels/cpu/lane_math.hpp"
#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/dtype.hpp"

namespace atl::cpu {

namespace {

// x[i] = Lane(x[i]) over n values.
template <float (*Lane)(float)>
struct MapLoop {
  [[gnu::always_inline]] void operator()(float* x, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) x[i] = Lane(x[i]);
  }
};

struct RoundBf16Loop {
  [[gnu::always_inline]] void operator()(float* x, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
  }
};

// A separate loop from the in-place one, with __restrict pointers: the copy must not overlap.
struct RoundBf16CopyLoop {
  [[gnu::always_inline]] void operator()(const float* __restrict src, float* __restrict dst, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = round_to_bf16(src[i]);
  }
};

}  // namespace

void round_to_bf16_values(float* x, std::int64_t n) { run_for_isa<RoundBf16Loop>(x, n); }

void round_to_bf16_copy(const float* src, float* dst, std::int64_t n) { run_for_isa<RoundBf16CopyLoop>(src, dst, n); }

void exp_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<exp_lane>>(x, n); }
void sigmoid_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<sigmoid_lane>>(x, n); }
void tanh_inplace(float* x, std::int64_t n) { run_for_isa<MapLoop<tanh_lane>>(x, n); }

float exp_f32(float x) { return exp_lane(x); }
float tanh_f32(float x) { return tanh_lane(x); }

}  // namespace atl::cpu

#include "kernels/cpu/attention_rows.hpp"

#include <cassert>

#include "kernels/cpu/lane_math.hpp"
#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/lane_sum.hpp"

namespace atl::cpu {

namespace {

// The visible span apart from the fills on either side, and the keys' flags read as ints: with
// one condition per element the loop vectorizes (the span test inside the loop kept it scalar).
struct MaskLoop {
  [[gnu::always_inline]] void operator()(float* __restrict row, const bool* __restrict ok, std::int64_t begin,
                                         std::int64_t end, std::int64_t n, float scale, float fill, bool* any) const {
    assert(0 <= begin && begin <= end && end <= n);
    for (std::int64_t j = 0; j < begin; ++j) row[j] = fill;
    const auto* flags = reinterpret_cast<const unsigned char*>(ok);  // a bool load found no vector type
    int kept = 0;
    for (std::int64_t j = begin; j < end; ++j) {
      const int keep = flags[j];
      const float s = scale * row[j] + 0.0f;
      row[j] = keep != 0 ? s : fill;
      kept |= keep;
    }
    for (std::int64_t j = end; j < n; ++j) row[j] = fill;
    *any = kept != 0;
  }
};

struct SoftmaxLoop {
  [[gnu::always_inline]] void operator()(float* p, std::int64_t n, float sink, bool has_sink, KeySoftmax* out) const {
    const float m = lane_max<float>(n, sink, [p](std::int64_t j) { return p[j]; });
    for (std::int64_t j = 0; j < n; ++j) p[j] = exp_lane(p[j] - m);
    const float sink_term = has_sink ? exp_lane(sink - m) : 0.0f;
    const float sum = sink_term + lane_sum<float>(n, [p](std::int64_t j) { return p[j]; });
    const float inv_sum = 1.0f / sum;
    for (std::int64_t j = 0; j < n; ++j) p[j] *= inv_sum;
    *out = {m, sum};
  }
};

struct SoftmaxGradLoop {
  [[gnu::always_inline]] void operator()(float* __restrict p, float* __restrict ds, std::int64_t n, float lse,
                                         float scale, float* delta_out) const {
    for (std::int64_t j = 0; j < n; ++j) p[j] = exp_lane(p[j] - lse);
    const float delta = lane_sum<float>(n, [p, ds](std::int64_t j) { return p[j] * ds[j]; });
    for (std::int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - delta) * scale;
    *delta_out = delta;
  }
};

}  // namespace

bool mask_score_row(float* row, const bool* ok, std::int64_t begin, std::int64_t end, std::int64_t n, float scale,
                    float fill) {
  bool any = false;
  run_for_isa<MaskLoop>(row, ok, begin, end, n, scale, fill, &any);
  return any;
}

KeySoftmax softmax_key_row(float* p, std::int64_t n, float sink, bool has_sink) {
  KeySoftmax out{};
  run_for_isa<SoftmaxLoop>(p, n, sink, has_sink, &out);
  return out;
}

float softmax_grad_key_row(float* p, float* ds, std::int64_t n, float lse, float scale) {
  float delta = 0.0f;
  run_for_isa<SoftmaxGradLoop>(p, ds, n, lse, scale, &delta);
  return delta;
}

}  // namespace atl::cpu

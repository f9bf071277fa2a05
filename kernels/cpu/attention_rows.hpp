// The float row loops of attention.hpp for scores without a bias, one build per instruction set
// (isa_dispatch.hpp): the same operations in the same order as attention.hpp's generic loops run
// with a zero bias, so the same bits, vectorized (the generic loops ran scalar: together ~7% of a
// two-thread beam-small AMX step, the masking alone ~3.7%).
#pragma once
#include <cstdint>

namespace atl::cpu {

// One query's row of n scores: row[j] = scale * row[j] + 0 where begin <= j < end and ok[j]
// (the + 0 is the generic loop's zero bias: it turns a -0 into +0), `fill` everywhere else.
// Requires 0 <= begin <= end <= n (a query's visible span inside its tile). Returns whether any
// score was kept.
bool mask_score_row(float* row, const bool* ok, std::int64_t begin, std::int64_t end, std::int64_t n, float scale,
                    float fill);

struct KeySoftmax {
  float max, sum;
};

// Softmax of one query over its n >= 1 visible scores, with a sink logit in the denominator when
// has_sink (without one, pass sink = -inf: it starts the max): m = max(sink, p) (lane_max),
// p[j] = exp(p[j] - m), sum = exp(sink - m) (0 without a sink) + the lane_sum of p, then
// p[j] *= 1 / sum. Returns m and sum.
KeySoftmax softmax_key_row(float* p, std::int64_t n, float sink, bool has_sink);

// Backward of one query's row of n visible keys, p holding its scores: p[j] = exp(p[j] - lse),
// delta = lane_sum of p[j] * ds[j], ds[j] = p[j] * (ds[j] - delta) * scale. Returns delta.
float softmax_grad_key_row(float* p, float* ds, std::int64_t n, float lse, float scale);

}  // namespace atl::cpu

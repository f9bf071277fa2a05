// Fixed-order sums that vectorize: 16 running partial sums (element i goes to partial i mod 16, in
// index order), then the partials added in one fixed tree. The order depends only on n, so a row's
// sum has the same bits at every instruction-set level (the vector width only changes how many
// partials one register holds) and wherever the row sits in a batch.
#pragma once
#include <cstdint>

namespace atl::cpu {

inline constexpr int kSumLanes = 16;

// sum_i term(i) for i < n, in the lane order above.
template <class T, class Term>
[[gnu::always_inline]] inline T lane_sum(std::int64_t n, Term term) {
  T acc[kSumLanes] = {};
  std::int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) acc[l] += term(i + l);
  }
  for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
  for (int width = kSumLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  return acc[0];
}

}  // namespace atl::cpu

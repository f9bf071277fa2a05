// Fixed-order sums that vectorize: 16 running partial sums (element i goes to partial i mod 16, in
// index order), then the partials added in one fixed tree. The order depends only on n, so a row's
// sum has the same bits at every instruction-set level (the vector width only changes how many
// partials one register holds) and wherever the row sits in a batch. lane_max keeps the same
// shape for a maximum.
#pragma once
#include <algorithm>
#include <cstdint>

namespace atl::cpu {

inline constexpr int kSumLanes = 16;

// op folded over init and term(i) for i < n, in the lane order above. Every lane starts at init,
// so init must leave op unchanged when folded in more than once (0 for +, any start for max).
template <class T, class Term, class Op>
[[gnu::always_inline]] inline T lane_fold(std::int64_t n, T init, Term term, Op op) {
  T acc[kSumLanes];
  for (int l = 0; l < kSumLanes; ++l) acc[l] = init;
  std::int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) acc[l] = op(acc[l], term(i + l));
  }
  for (int l = 0; i + l < n; ++l) acc[l] = op(acc[l], term(i + l));
  for (int width = kSumLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = op(acc[l], acc[l + width]);
  }
  return acc[0];
}

// sum_i term(i) for i < n, in the lane order above.
template <class T, class Term>
[[gnu::always_inline]] inline T lane_sum(std::int64_t n, Term term) {
  return lane_fold<T>(n, T(0), term, [](T a, T b) { return a + b; });
}

// max(init, term(i) for i < n) as std::max folds it (a NaN term is passed over). The result is
// the largest value whatever the order, up to the sign of a zero maximum.
template <class T, class Term>
[[gnu::always_inline]] inline T lane_max(std::int64_t n, T init, Term term) {
  return lane_fold<T>(n, init, term, [](T a, T b) { return std::max(a, b); });
}

}  // namespace atl::cpu

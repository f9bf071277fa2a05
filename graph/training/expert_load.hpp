// Router load: how many tokens each routed expert of each MoE layer received in a step, summed
// over micro-batches and ranks (integers: the order does not matter), and the busiest expert's
// share against the mean, per layer (1 = perfectly balanced; E = every token on one expert).
// Padding tokens are routed but never dispatched, so they do not count.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/training/staged_model.hpp"

namespace atl {

struct ExpertCounts {
  std::int64_t experts = 0;           // routed experts per MoE layer (E)
  std::vector<std::int64_t> counts;   // [MoE layer (routing record order)][E], flat

  // Adds one micro-batch: its routing records (indices i32 [T, K]) and valid bool [B, S] (T = B*S).
  void add(const std::vector<RoutingRecord>& routing, const Tensor& valid);
  // Adds another count of the same layout (another rank's); empty adds nothing.
  void add(const std::vector<std::int64_t>& other);
  // Per MoE layer: max over experts / mean over experts (0 when the layer got no token).
  std::vector<double> max_over_mean() const;
};

}  // namespace atl

// Shared by the model tests of every family: the fp32 forward through the staged ops with the
// router choices it made, for gradient checks that must not count a step that flips an expert.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "graph/models/model.hpp"

namespace atl::testing {

// Mean loss of the fp32 forward; `routing` gets the router choices of every sparse layer.
inline double mean_loss_with_routing(const Model& model, const TensorMap& w, const Batch& batch,
                                     std::vector<RoutingRecord>* routing = nullptr) {
  std::unique_ptr<MicroBatchRun> run = model.start(batch, Precision::fp32, 1.0f);
  for (int op = 0; op < model.op_count(); ++op) run->forward(op, w);
  if (routing) *routing = run->routing();
  return run->loss_sum() / static_cast<double>(run->targets());
}

inline bool same_layer_routing(const std::vector<RoutingRecord>& a, const std::vector<RoutingRecord>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t l = 0; l < a.size(); ++l) {
    const auto x = a[l].indices.span<std::int32_t>(), y = b[l].indices.span<std::int32_t>();
    if (a[l].layer != b[l].layer || !std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
  }
  return true;
}

}  // namespace atl::testing

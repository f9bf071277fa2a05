// Shared by the model tests of every family: the fp32 forward through the staged ops with the
// router choices it made, for gradient checks that must not count a step that flips an expert.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

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

// The same experts chosen for every token of every layer, in any order: two chosen experts trading
// places in the score order change no loss (the weighted sum over them is the same up to rounding);
// only a different set is a jump.
inline bool same_expert_sets(const std::vector<RoutingRecord>& a, const std::vector<RoutingRecord>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t l = 0; l < a.size(); ++l) {
    const Tensor& x = a[l].indices;
    const Tensor& y = b[l].indices;
    if (a[l].layer != b[l].layer || x.shape() != y.shape()) return false;
    const std::int64_t tokens = x.size(0), k = x.size(1);
    std::vector<std::int32_t> xs(static_cast<std::size_t>(k)), ys(static_cast<std::size_t>(k));
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::copy_n(x.data<std::int32_t>() + t * k, k, xs.begin());
      std::copy_n(y.data<std::int32_t>() + t * k, k, ys.begin());
      std::sort(xs.begin(), xs.end());
      std::sort(ys.begin(), ys.end());
      if (xs != ys) return false;
    }
  }
  return true;
}

// MODELS.md §6.9: in a packed row of `batch` (one row, several documents), changing every token
// before the last document start leaves that document's logits bitwise unchanged and does change
// the earlier ones. Checks with Catch; returns the last document's start column.
inline std::int64_t check_document_isolation(const Model& model, const TensorMap& w, const Batch& batch) {
  const std::int64_t seq = batch.seq_len(), vocab = model.vocab_size(), usable = model.unpadded_vocab_size();
  const std::int64_t* pos = batch.positions.data<std::int64_t>();
  std::int64_t last_start = 0;
  for (std::int64_t t = 1; t < seq; ++t) {
    if (pos[t] == 0) last_start = t;
  }
  REQUIRE(last_start > 0);
  Batch changed{batch.input_ids.clone(), batch.positions, batch.valid, batch.targets};
  for (std::int64_t t = 0; t < last_start; ++t) {
    changed.input_ids.data<std::int64_t>()[t] = (batch.input_ids.data<std::int64_t>()[t] + 17) % usable;
  }
  Tensor la, lb;
  model.forward(w, batch, Precision::fp32, &la);
  model.forward(w, changed, Precision::fp32, &lb);
  for (std::int64_t t = last_start; t < seq; ++t) {
    for (std::int64_t v = 0; v < usable; ++v) {
      CHECK(la.data<float>()[t * vocab + v] == lb.data<float>()[t * vocab + v]);
    }
  }
  CHECK(la.data<float>()[0] != lb.data<float>()[0]);  // the changed document did change
  return last_start;
}

}  // namespace atl::testing

// Shared by the model tests of every family: how bf16 tracks fp32, and the fp32 forward through
// the staged ops with the router choices it made, for gradient checks that must not count a step
// that flips an expert.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "graph/models/model.hpp"
#include "graph/param.hpp"
#include "tests/graph/beam_test_support.hpp"

namespace atl::testing {

// How precision bf16 moves one step from fp32's on the same weights: the loss difference as a
// fraction of the fp32 loss's distance from the uniform prediction's (targets x ln V, what constant
// logits score: at init most of the loss, so a bound relative to the loss alone would hold for a
// model that output nothing), the fraction of router choices that agree, and each parameter's
// gradient cosine.
struct Bf16Tracking {
  double loss_gap = 0;         // |l16 - l32| / (l32 - targets ln V)
  double excess = 0;           // (l32 - targets ln V) / targets: what the model says, per target
  bool rounded = false;        // l16 != l32: bf16 rounded something
  double route_agreement = 1;  // over every (token, slot) of every sparse layer
  std::vector<std::pair<std::string, double>> cosines;
};

inline Bf16Tracking bf16_tracking(const Model& model, const TensorMap& master, const Batch& batch) {
  TensorMap g32 = TensorMap::zeros_like(model.specs()), g16 = TensorMap::zeros_like(model.specs());
  std::vector<RoutingRecord> r32, r16;
  const LossSum l32 = model.forward_backward(compute_weights(model.specs(), master, Precision::fp32), batch,
                                             Precision::fp32, 1.0f, g32, &r32);
  const LossSum l16 = model.forward_backward(compute_weights(model.specs(), master, Precision::bf16), batch,
                                             Precision::bf16, 1.0f, g16, &r16);
  Bf16Tracking t;
  const double uniform = static_cast<double>(l32.targets) * std::log(static_cast<double>(model.unpadded_vocab_size()));
  t.excess = (l32.loss_sum - uniform) / static_cast<double>(l32.targets);
  t.loss_gap = std::abs(l16.loss_sum - l32.loss_sum) / (l32.loss_sum - uniform);
  t.rounded = l16.loss_sum != l32.loss_sum;
  REQUIRE(r32.size() == r16.size());
  std::int64_t same = 0, total = 0;
  for (std::size_t i = 0; i < r32.size(); ++i) {
    const auto a = r32[i].indices.span<std::int32_t>(), b = r16[i].indices.span<std::int32_t>();
    for (std::size_t j = 0; j < a.size(); ++j) {
      same += a[j] == b[j];
      ++total;
    }
  }
  if (total > 0) t.route_agreement = static_cast<double>(same) / static_cast<double>(total);
  for (const auto& s : model.specs()) {
    const auto a = g32.at(s.name).span<float>(), b = g16.at(s.name).span<float>();
    double ab = 0, aa = 0, bb = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ab += static_cast<double>(a[i]) * b[i];
      aa += static_cast<double>(a[i]) * a[i];
      bb += static_cast<double>(b[i]) * b[i];
    }
    // (Both zero, as a selection-only parameter's: they agree; one zero: they do not.)
    t.cosines.emplace_back(s.name, aa == 0 && bb == 0 ? 1.0 : aa == 0 || bb == 0 ? 0.0 : ab / std::sqrt(aa * bb));
  }
  return t;
}

// The family tests' bf16 check, on weights of std 0.1 (at init_std a model adds ~0.005 nats per
// target to the uniform guess's ln V, so a bound relative to the loss would hold for logits that
// were all zero): the loss within 5% of what the model adds, the same experts for 90% of the
// choices, every gradient's cosine above `min_cosine`.
inline void check_bf16_tracks_fp32(const Model& model, double min_cosine) {
  const Bf16Tracking t = bf16_tracking(model, TensorMap::initialized(model.specs(), 3, 0.1f), synthetic_batch(2, 32, 6));
  REQUIRE(t.excess > 0.1);
  CHECK(t.rounded);  // bf16 really rounded something
  CHECK(t.loss_gap < 0.05);
  CHECK(t.route_agreement > 0.9);
  for (const auto& [name, cosine] : t.cosines) {
    INFO(name);
    CHECK(cosine > min_cosine);
  }
}

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

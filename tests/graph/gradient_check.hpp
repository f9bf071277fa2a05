// Whole-model gradient check shared by the three families (MODELS.md §6): for every parameter
// tensor, directional derivatives of the fp32 model by finite differences against the analytic
// gradient g, along several directions:
//   - g/|g| itself (analytic: |g|), and
//   - `random_directions` mixes (g/|g| + r)/sqrt(2), r a random unit vector orthogonal to g (from
//     the counter RNG: fixed per tensor name). Analytic: |g|/sqrt(2). The gradient direction alone
//     hides an error e orthogonal to g (a missing contribution): along g/|g| the numeric value is
//     still |g|; along the mix it is off by e.r/sqrt(2).
// Measured power (a one-off experiment on beam-tiny-moe, 2026-11-30: the analytic gradient of the
// first 10% or 50% of one tensor's elements set to 0 before the check, a "missing contribution"
// the g direction alone never sees): caught for model.norm.weight (64 elements) at 10%, for
// layers.2 mlp.experts.down_projs at 50% (not 10%), not for q_proj (4,096) or the embedding (16,384):
// a random direction sees an error e as e.r ~ |e|/sqrt(n), below fp32 noise for big tensors. Those
// are guarded by the op-level finite-difference tests in double (tests/kernels).
// Each direction is tried on a ladder of steps (curvature vs fp32 rounding noise) and the best
// agreement counts. A shift that changes a router choice is not used (a top-k flip is a jump, not
// a gradient error): each step contributes the central difference when neither side flips, else
// the one-sided difference of the side that does not. One ulp of the loss over the widest step is
// the resolution floor and is not counted as error. Error: |numeric - analytic| / analytic.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "graph/models/model.hpp"
#include "kernels/rng.hpp"
#include "tests/graph/model_test_support.hpp"

namespace atl::testing {

struct GradientCheck {
  double worst = 0;        // worst relative error over tensors and directions
  std::string worst_name;  // which tensor and direction, with analytic and numeric values
};

inline GradientCheck check_whole_model_gradient(const Model& model, TensorMap& w, const Batch& batch,
                                                int random_directions,
                                                const std::function<bool(const std::string&)>& zero_gradient = {}) {
  TensorMap grads = TensorMap::zeros_like(model.specs());
  LossSum l = model.forward_backward(w, batch, Precision::fp32, 1.0f / static_cast<float>(batch.target_count()), grads);
  REQUIRE(l.targets == batch.target_count());
  std::vector<RoutingRecord> base_routing;
  const double base_loss = mean_loss_with_routing(model, w, batch, &base_routing);
  constexpr double kSteps[] = {1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5};
  const float loss32 = static_cast<float>(base_loss);
  const double fd_resolution = (std::nextafter(loss32, INFINITY) - loss32) / (2 * kSteps[0]);
  GradientCheck out;
  for (const auto& s : model.specs()) {
    const Tensor g = grads.at(s.name);
    const auto n = static_cast<std::size_t>(g.numel());
    const std::span<const float> gs = g.span<float>();
    double norm = 0;
    for (float v : gs) norm += static_cast<double>(v) * v;
    norm = std::sqrt(norm);
    if (zero_gradient && zero_gradient(s.name)) {
      CHECK(norm == 0.0);  // e.g. selection-only parameters (MODELS.md §10.1.7)
      continue;
    }
    INFO(s.name);
    REQUIRE(norm > 0);
    // The directions, unit length, in double.
    std::vector<std::vector<double>> directions(1, std::vector<double>(n));
    for (std::size_t i = 0; i < n; ++i) directions[0][i] = gs[i] / norm;
    for (int k = 0; k < random_directions; ++k) {
      CounterRng rng(1000 + static_cast<std::uint64_t>(k), s.name);
      std::vector<double> r(n);
      double along = 0;
      for (std::size_t i = 0; i < n; ++i) {
        r[i] = rng.normal(static_cast<std::int64_t>(i));
        along += r[i] * directions[0][i];
      }
      double r_norm = 0;
      for (std::size_t i = 0; i < n; ++i) {
        r[i] -= along * directions[0][i];  // orthogonal to g
        r_norm += r[i] * r[i];
      }
      r_norm = std::sqrt(r_norm);
      if (r_norm == 0) continue;  // a 1-element tensor has no orthogonal direction
      std::vector<double> d(n);
      for (std::size_t i = 0; i < n; ++i) d[i] = (directions[0][i] + r[i] / r_norm) / std::sqrt(2.0);
      directions.push_back(std::move(d));
    }
    Tensor p = w.at(s.name);
    const Tensor saved = p.clone();
    for (std::size_t k = 0; k < directions.size(); ++k) {
      const std::vector<double>& d = directions[k];
      const double analytic = k == 0 ? norm : norm / std::sqrt(2.0);
      auto shifted_loss = [&](double eps, bool* same) {
        float* pp = p.data<float>();
        const float* ps = saved.data<float>();
        for (std::size_t i = 0; i < n; ++i) pp[i] = ps[i] + static_cast<float>(eps * d[i]);
        std::vector<RoutingRecord> routing;
        const double loss = mean_loss_with_routing(model, w, batch, &routing);
        *same = same_layer_routing(routing, base_routing);
        return loss;
      };
      double err = 1e30, numeric = 0;
      auto consider = [&](double estimate) {
        const double e = std::max(0.0, std::abs(estimate - analytic) - fd_resolution) / analytic;
        if (e < err) {
          err = e;
          numeric = estimate;
        }
      };
      for (double step : kSteps) {
        bool up_same = false, down_same = false;
        const double up = shifted_loss(step, &up_same), down = shifted_loss(-step, &down_same);
        if (up_same && down_same) consider((up - down) / (2 * step));
        if (up_same) consider((up - base_loss) / step);
        if (down_same) consider((base_loss - down) / step);
      }
      p.copy_from(saved);
      CHECK(err < 1e29);  // at least one shift kept every router choice
      const std::string what = s.name + (k == 0 ? " along g" : " along random mix " + std::to_string(k));
      // GRAD_VERBOSE=1 prints every agreement (a debugging aid; asserts nothing).
      if (std::getenv("GRAD_VERBOSE")) std::printf("%-60s %.3e analytic %.3e numeric %.3e\n", what.c_str(), err, analytic, numeric);
      if (err > out.worst) {
        out.worst = err;
        out.worst_name = what + " (analytic " + std::to_string(analytic) + ", numeric " + std::to_string(numeric) + ")";
      }
    }
  }
  return out;
}

}  // namespace atl::testing

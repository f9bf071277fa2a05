// Whole-model gradient check shared by the three families (MODELS.md §6): for every parameter
// tensor, directional derivatives of the fp32 model by finite differences against the analytic
// gradient g along unit directions d (analytic value g.d, in double):
//   - g/|g| itself;
//   - `random_directions` mixes (g/|g| + r)/sqrt(2), r a random unit vector orthogonal to g (from
//     the counter RNG: fixed per tensor name). Along g alone an error e orthogonal to g (a missing
//     contribution) is invisible; along a mix it is off by e.r/sqrt(2);
//   - the same mix restricted to each of `row_blocks` blocks of rows (the first, the last and
//     evenly between; a block is 1/8 of the rows: one head's rows of a projection, one expert). A
//     random direction over a whole tensor of n elements sees an error e as e.r ~ |e|/sqrt(n),
//     below fp32 noise for a big tensor; on a block the gradient's own part dominates, so a block
//     whose gradient is missing or wrong is off by about its whole size.
// The estimate (estimate_derivative below) never looks at the analytic value, so a gradient 2% off
// cannot borrow a lucky estimate. Shifts that change a router choice are not used (a top-k flip is
// a jump, not a gradient error). Error: |numeric - analytic| / max(|numeric|, |analytic|), less the
// estimate's fp32 noise floor. A direction whose derivative is below 10x its floor is unresolved;
// at least half must be resolved (measured: 69-99% per model).
// The check's power is tested: tests/graph/test_gradient_check_power.cpp corrupts one tensor's
// analytic gradient (half or 10% of it zeroed, one expert's part zeroed, scaled by 1.02) and
// requires the check to fail.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/models/model.hpp"
#include "kernels/rng.hpp"
#include "tests/graph/model_test_support.hpp"

namespace atl::testing {

// The stated tolerance on the worst relative error (the worst measured on the seven model checks:
// 1.4e-3). A gradient 2% off in one tensor fails it (tests/graph/test_gradient_check_power.cpp).
inline constexpr double kGradientTolerance = 5e-3;

struct GradientCheckOptions {
  int random_directions = 2;  // whole-tensor mixes of g with a random direction
  int row_blocks = 3;         // block mixes: the first, the last, and evenly between
  // Parameters whose gradient must be exactly zero (e.g. selection-only ones, MODELS.md §10.1.7).
  std::function<bool(const std::string&)> zero_gradient;
  // Only these parameters are checked (all when empty).
  std::function<bool(const std::string&)> only;
  // Alters the analytic gradient before the check (to show the check catches an error).
  std::function<void(const std::string&, Tensor&)> corrupt;
};

struct GradientCheck {
  double worst = 0;        // worst relative error over tensors and directions
  std::string worst_name;  // which tensor and direction, with analytic and numeric values
  int directions = 0;      // how many directions were compared
  int resolved = 0;        // of which the derivative was at least 10x the noise floor
};

namespace gradient_check_detail {

// A unit direction supported on [begin, end): (g/|g| + r)/sqrt(2) with r a random unit vector
// orthogonal to g there, g/|g| alone when `mix` is false, r alone where g is zero there.
inline std::optional<std::vector<double>> direction(std::span<const float> g, std::size_t begin, std::size_t end,
                                                    bool mix, const CounterRng& rng) {
  std::vector<double> d(g.size(), 0.0);
  double g_norm = 0;
  for (std::size_t i = begin; i < end; ++i) g_norm += static_cast<double>(g[i]) * g[i];
  g_norm = std::sqrt(g_norm);
  if (!mix) {
    if (g_norm == 0) return std::nullopt;
    for (std::size_t i = begin; i < end; ++i) d[i] = g[i] / g_norm;
    return d;
  }
  std::vector<double> r(g.size(), 0.0);
  double along = 0;
  for (std::size_t i = begin; i < end; ++i) {
    r[i] = rng.normal(static_cast<std::int64_t>(i));
    if (g_norm > 0) along += r[i] * g[i] / g_norm;
  }
  double r_norm = 0;
  for (std::size_t i = begin; i < end; ++i) {
    if (g_norm > 0) r[i] -= along * g[i] / g_norm;  // orthogonal to g
    r_norm += r[i] * r[i];
  }
  r_norm = std::sqrt(r_norm);
  if (r_norm == 0) return std::nullopt;  // a 1-element block has no orthogonal direction
  const double g_part = g_norm > 0 ? 1.0 / std::sqrt(2.0) : 0.0;
  const double r_part = g_norm > 0 ? 1.0 / std::sqrt(2.0) : 1.0;
  for (std::size_t i = begin; i < end; ++i) d[i] = g_part * (g_norm > 0 ? g[i] / g_norm : 0.0) + r_part * r[i] / r_norm;
  return d;
}


struct Estimate {
  double value = NAN;  // the directional derivative
  double floor = 0;    // three standard deviations of its fp32 rounding noise
  std::string steps;   // the steps tried, "(flip)" where a router choice flipped (for GRAD_VERBOSE)
};

// Central differences c(h) down a ladder of steps; Richardson's extrapolation of two neighbours
// (9 c(s) - c(3s)) / 8 removes the h^2 term. The estimate is the first one that agrees with the
// one from the next larger pair (so the steps are small enough for the extrapolation to hold);
// the ladder's last one otherwise. Where no two neighbouring steps keep every router choice on
// both sides, a one-sided extrapolation (3 f(s) - f(3s)) / 2 on a side that does, from steps
// <= 1e-2 (its error is first order in the step before the extrapolation). The choice never
// looks at the analytic value. Noise gains (std per unit of loss noise, times s): 0.80 central,
// 2.13 one-sided.
inline Estimate estimate_derivative(const std::function<std::optional<double>(double)>& shifted_loss,
                                    double base_loss, double loss_noise) {
  constexpr double kSteps[] = {3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5};
  constexpr std::size_t kCount = std::size(kSteps);
  std::vector<double> up(kCount, NAN), down(kCount, NAN);
  Estimate previous, out;
  auto central = [&](std::size_t i) { return (up[i] - down[i]) / (2 * kSteps[i]); };
  for (std::size_t i = 0; i < kCount; ++i) {
    up[i] = shifted_loss(kSteps[i]).value_or(NAN);
    down[i] = shifted_loss(-kSteps[i]).value_or(NAN);
    char step[32];
    std::snprintf(step, sizeof step, " %g%s", kSteps[i], std::isnan(up[i] - down[i]) ? "(flip)" : "");
    out.steps += step;
    if (i == 0 || std::isnan(central(i) - central(i - 1))) {
      previous.value = NAN;
      continue;
    }
    Estimate current{(9 * central(i) - central(i - 1)) / 8, 3 * 0.80 * loss_noise / kSteps[i], {}};
    const bool agrees = std::abs(current.value - previous.value) <=
                        previous.floor + current.floor + 3e-4 * std::abs(current.value);  // false when NaN
    previous = current;
    if (agrees) break;
  }
  if (!std::isnan(previous.value)) {
    out.value = previous.value, out.floor = previous.floor;
    return out;
  }
  for (std::size_t i = 1; i < kCount; ++i) {
    if (kSteps[i - 1] > 1e-2) continue;
    for (const std::vector<double>* side : {&up, &down}) {
      const double sign = side == &up ? 1 : -1;
      const double f3s = sign * ((*side)[i - 1] - base_loss) / kSteps[i - 1];
      const double fs = sign * ((*side)[i] - base_loss) / kSteps[i];
      if (std::isnan(f3s - fs) || !std::isnan(out.value)) continue;
      out.value = (3 * fs - f3s) / 2, out.floor = 3 * 2.13 * loss_noise / kSteps[i];
    }
  }
  return out;
}

}  // namespace gradient_check_detail

inline GradientCheck check_whole_model_gradient(const Model& model, TensorMap& w, const Batch& batch,
                                                const GradientCheckOptions& options = {}) {
  TensorMap grads = TensorMap::zeros_like(model.specs());
  const float loss_scale = 1.0f / static_cast<float>(batch.target_count());
  const LossSum l = model.forward_backward(w, batch, Precision::fp32, loss_scale, grads);
  REQUIRE(l.targets == batch.target_count());
  std::vector<RoutingRecord> base_routing;
  const double base_loss = mean_loss_with_routing(model, w, batch, &base_routing);
  // fp32 rounding noise of the loss: half an ulp per token, averaged over the targets (measured
  // noise is below it: the median error of a resolved direction is ~1/20 of the floor).
  const float loss32 = static_cast<float>(base_loss);
  const double loss_noise = 0.5 * (std::nextafter(loss32, INFINITY) - loss32) /
                            std::sqrt(static_cast<double>(batch.target_count()));
  const bool verbose = std::getenv("GRAD_VERBOSE") != nullptr;  // a debugging aid; asserts nothing
  GradientCheck out;
  for (const auto& s : model.specs()) {
    if (options.only && !options.only(s.name)) continue;
    Tensor g = grads.at(s.name);
    if (options.corrupt) options.corrupt(s.name, g);
    const auto n = static_cast<std::size_t>(g.numel());
    const std::span<const float> gs = g.span<float>();
    if (options.zero_gradient && options.zero_gradient(s.name)) {
      CHECK(std::all_of(gs.begin(), gs.end(), [](float v) { return v == 0.0f; }));
      continue;
    }
    INFO(s.name);
    // The directions and their names.
    std::vector<std::pair<std::string, std::vector<double>>> directions;
    auto add = [&](std::string what, std::optional<std::vector<double>> d) {
      if (d) directions.emplace_back(s.name + " " + what, std::move(*d));
    };
    add("along g", gradient_check_detail::direction(gs, 0, n, false, CounterRng(1000, s.name)));
    REQUIRE(!directions.empty());  // a zero gradient is wrong for every parameter not listed above
    for (int k = 0; k < options.random_directions; ++k) {
      add("along random mix " + std::to_string(k + 1),
          gradient_check_detail::direction(gs, 0, n, true, CounterRng(1001 + static_cast<std::uint64_t>(k), s.name)));
    }
    const auto rows = static_cast<std::size_t>(s.shape.at(0));
    const std::size_t row_size = n / rows, block_rows = std::max<std::size_t>(1, rows / 8);
    for (int b = 0; b < options.row_blocks && rows > block_rows; ++b) {
      const auto blocks = static_cast<std::size_t>(options.row_blocks);
      const std::size_t first = blocks == 1 ? 0 : (rows - block_rows) * static_cast<std::size_t>(b) / (blocks - 1);
      add("on rows [" + std::to_string(first) + ", " + std::to_string(first + block_rows) + ")",
          gradient_check_detail::direction(gs, first * row_size, (first + block_rows) * row_size, true,
                                           CounterRng(2000 + static_cast<std::uint64_t>(b), s.name)));
    }
    Tensor p = w.at(s.name);
    const Tensor saved = p.clone();
    for (const auto& [what, d] : directions) {
      double analytic = 0;
      for (std::size_t i = 0; i < n; ++i) analytic += gs[i] * d[i];
      // The loss with the parameter shifted by eps * d; nullopt where a router choice flips.
      auto shifted_loss = [&](double eps) -> std::optional<double> {
        float* pp = p.data<float>();
        const float* ps = saved.data<float>();
        for (std::size_t i = 0; i < n; ++i) pp[i] = ps[i] + static_cast<float>(eps * d[i]);
        std::vector<RoutingRecord> routing;
        const double loss = mean_loss_with_routing(model, w, batch, &routing);
        if (!same_layer_routing(routing, base_routing)) return std::nullopt;
        return loss;
      };
      const gradient_check_detail::Estimate estimate =
          gradient_check_detail::estimate_derivative(shifted_loss, base_loss, loss_noise);
      p.copy_from(saved);
      CHECK(!std::isnan(estimate.value));  // two neighbouring steps kept every router choice on one side
      const double numeric = estimate.value, floor = estimate.floor;
      const double scale = std::max(std::abs(numeric), std::abs(analytic));
      const double err = scale == 0 ? 0 : std::max(0.0, std::abs(numeric - analytic) - floor) / scale;
      if (scale > 10 * floor) ++out.resolved;
      ++out.directions;
      if (verbose) {
        std::printf("%-60s %.3e analytic %.6e numeric %.6e floor %.1e steps%s\n", what.c_str(), err, analytic, numeric,
                    floor, estimate.steps.c_str());
      }
      if (err > out.worst) {
        out.worst = err;
        out.worst_name = what + " (analytic " + std::to_string(analytic) + ", numeric " + std::to_string(numeric) + ")";
      }
    }
  }
  if (verbose) std::printf("%d directions, %d resolved\n", out.directions, out.resolved);
  CHECK(2 * out.resolved >= out.directions);  // a check that resolves little proves little
  return out;
}

}  // namespace atl::testing

// Whole-model gradient check shared by the three families (MODELS.md §6): for every parameter
// tensor, directional derivatives of the fp32 model by finite differences against the analytic
// gradient g along unit directions d (analytic value g.d, in double):
//   - g/|g| itself;
//   - `random_directions` mixes (g/|g| + r)/sqrt(2), r a random unit vector orthogonal to g (from
//     the counter RNG: fixed per tensor name). Along g alone an error e orthogonal to g (a missing
//     contribution) is invisible; along a mix it is off by e.r/sqrt(2);
//   - the same mix on each of `row_blocks` blocks of rows that together cover the tensor (a row is
//     everything after dimension 0: an expert of an experts tensor, part of a head of a
//     projection). A random direction over a whole tensor of n elements sees an error e as
//     e.r ~ |e|/sqrt(n), below fp32 noise for a big tensor; on a block the gradient's own part
//     dominates, so a block whose gradient is missing or wrong is off by about its whole size;
//   - for a tensor of at most kCoordinateTensor elements (biases, sinks, clip scales), each element.
// The estimate (estimate_derivative below) never looks at the analytic value, so a gradient 2% off
// cannot borrow a lucky estimate. Shifts that change a router's chosen set are not used (a top-k
// flip is a jump, not a gradient error). Error: |numeric - analytic| / max(|numeric|, |analytic|),
// less the estimate's noise floor (kFloorSigmas standard deviations of its fp32 rounding noise).
// A direction whose derivative is below 10x its floor is unresolved; at least half must be
// resolved (measured: 59-95% per model). A tensor none of whose directions can show a gradient 2%
// off is listed (blind_to_2_percent: routers, norms, clip scales, sinks, short convolutions, whose
// derivatives sit near fp32's noise); a tensor of kBlindTensorLimit elements or more may not be.
// The check's power is tested: tests/graph/test_gradient_check_power.cpp corrupts one tensor's
// analytic gradient (a half, a tenth, a head, an expert or an element zeroed; scaled by 1.02) and
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
// 1.1e-3). A gradient 2% off in one tensor fails it unless the tensor is listed as blind to that
// (GradientCheck::blind_to_2_percent; tests/graph/test_gradient_check_power.cpp).
inline constexpr double kGradientTolerance = 5e-3;

struct GradientCheckOptions {
  int random_directions = 1;       // whole-tensor mixes of g with a random direction
  std::size_t row_blocks = 8;      // block mixes: the rows in this many blocks, all of them
  // Parameters whose gradient must be exactly zero (e.g. selection-only ones, MODELS.md §10.1.7).
  std::function<bool(const std::string&)> zero_gradient;
  // Only these parameters are checked (all when empty).
  std::function<bool(const std::string&)> only;
  // Alters the analytic gradient before the check (to show the check catches an error).
  std::function<void(const std::string&, Tensor&)> corrupt;
  // At least half the directions must resolve (a check that resolves little proves little). Off
  // only for tensors whose derivatives sit near fp32's noise, where a test shows instead what the
  // check still catches (Inkling2's islands in the power test).
  bool require_resolved_half = true;
};

// A tensor this big must be able to show a gradient 2% off along at least one direction.
inline constexpr std::size_t kBlindTensorLimit = 4096;

// Tensors of at most this many elements are checked element by element instead of by blocks.
inline constexpr std::size_t kCoordinateTensor = 16;

struct GradientCheck {
  double worst = 0;        // worst relative error over tensors and directions
  std::string worst_name;  // which tensor and direction, with analytic and numeric values
  int directions = 0;      // how many directions were compared
  int resolved = 0;        // of which the derivative was at least 10x the noise floor
  // Tensors no direction of which could show a gradient 2% off (the floor hides it): the best
  // direction's floor / |derivative| + the tolerance exceeds 0.02. With that best ratio.
  std::vector<std::pair<std::string, double>> blind_to_2_percent;
};

namespace gradient_check_detail {

// A unit direction supported on [begin, end): g/|g| there when `mix` is false; else
// (g/|g| + r)/sqrt(2) with r a random unit vector orthogonal to g there, or r alone where g is 0.
inline std::optional<std::vector<double>> direction(std::span<const float> g, std::size_t begin, std::size_t end,
                                                    bool mix, const CounterRng& rng) {
  double g_norm = 0;
  for (std::size_t i = begin; i < end; ++i) g_norm += static_cast<double>(g[i]) * g[i];
  g_norm = std::sqrt(g_norm);
  std::vector<double> unit_g(g.size(), 0.0);  // g/|g| on the block (0 where g is 0)
  if (g_norm > 0) {
    for (std::size_t i = begin; i < end; ++i) unit_g[i] = g[i] / g_norm;
  }
  if (!mix) return g_norm > 0 ? std::optional(unit_g) : std::nullopt;
  std::vector<double> r(g.size(), 0.0);
  double along = 0;
  for (std::size_t i = begin; i < end; ++i) {
    r[i] = rng.normal(static_cast<std::int64_t>(i));
    along += r[i] * unit_g[i];
  }
  double r_norm = 0;
  for (std::size_t i = begin; i < end; ++i) {
    r[i] -= along * unit_g[i];  // orthogonal to g
    r_norm += r[i] * r[i];
  }
  r_norm = std::sqrt(r_norm);
  if (r_norm == 0) return std::nullopt;  // a 1-element block has no orthogonal direction
  const double weight = g_norm > 0 ? 1.0 / std::sqrt(2.0) : 1.0;
  for (std::size_t i = begin; i < end; ++i) r[i] = weight * (unit_g[i] + r[i] / r_norm);
  return r;
}

// The noise floor in standard deviations of an estimate's fp32 noise: thousands of directions are
// compared per model, and none may fail by chance when a change moves the rounding.
inline constexpr double kFloorSigmas = 4.5;

struct Estimate {
  double value = NAN;  // the directional derivative
  double floor = 0;    // kFloorSigmas standard deviations of its fp32 rounding noise
  std::string steps;   // the steps tried, "(flip)" where a router choice flipped (for GRAD_VERBOSE)
};

// Central differences c(h) down a ladder of steps h = 3e-2 / 3^i; Richardson's extrapolation of
// two neighbours, (9 c(s) - c(3s)) / 8, removes the h^2 term. The estimate is the first
// extrapolation that agrees with the one before it (the steps are then small enough for it to
// hold), else the ladder's last. Where no two neighbouring steps keep every router choice on both
// sides, a one-sided extrapolation (3 f(s) - f(3s)) / 2 on a side that does, from 3s <= 1e-2 (its
// error is first order in the step before the extrapolation). The choice never looks at the
// analytic value. Noise gains (std per unit of loss noise, times s): 0.80 central
// (sqrt(81/2 + 1/18) / 8), 2.01 one-sided (coefficients 3/2, -1/6 and -4/3 on the base loss).
inline Estimate estimate_derivative(const std::function<std::optional<double>(double)>& shifted_loss,
                                    double base_loss, double loss_noise) {
  constexpr std::size_t kCount = 7;
  std::vector<double> steps(kCount), up(kCount, NAN), down(kCount, NAN);  // NaN: a router choice flipped
  for (std::size_t i = 0; i < kCount; ++i) steps[i] = 3e-2 / std::pow(3.0, static_cast<double>(i));
  Estimate previous, out;
  auto central = [&](std::size_t i) { return (up[i] - down[i]) / (2 * steps[i]); };
  for (std::size_t i = 0; i < kCount; ++i) {
    up[i] = shifted_loss(steps[i]).value_or(NAN);
    down[i] = shifted_loss(-steps[i]).value_or(NAN);
    char step[32];
    std::snprintf(step, sizeof step, " %g%s", steps[i], std::isnan(up[i] - down[i]) ? "(flip)" : "");
    out.steps += step;
    if (i == 0 || std::isnan(central(i) - central(i - 1))) {
      previous.value = NAN;
      continue;
    }
    Estimate current{(9 * central(i) - central(i - 1)) / 8, kFloorSigmas * 0.80 * loss_noise / steps[i], {}};
    // Within two standard deviations of their difference's noise (a kink near the base point, an
    // L2 clip switching on, drifts the extrapolations by less than the floor but more than this).
    // False while `previous` is NaN.
    const double sigmas = std::hypot(previous.floor, current.floor) / kFloorSigmas;
    const bool agrees = std::abs(current.value - previous.value) <= 2 * sigmas + 3e-4 * std::abs(current.value);
    previous = current;
    if (agrees) break;
  }
  if (!std::isnan(previous.value)) {
    out.value = previous.value, out.floor = previous.floor;
    return out;
  }
  for (std::size_t i = 1; i < kCount; ++i) {
    if (steps[i - 1] > 1e-2) continue;
    for (const double sign : {1.0, -1.0}) {
      const std::vector<double>& side = sign > 0 ? up : down;
      const double f3s = sign * (side[i - 1] - base_loss) / steps[i - 1], fs = sign * (side[i] - base_loss) / steps[i];
      if (std::isnan(f3s - fs)) continue;
      out.value = (3 * fs - f3s) / 2, out.floor = kFloorSigmas * 2.01 * loss_noise / steps[i];
      return out;
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
  // The standard deviation of the loss's fp32 rounding noise: half an ulp per token, averaged over
  // the targets (calibrated: with it, the errors of the 4,274 resolved directions of the seven
  // model checks have a median of 0.13 of the floor and a 99th percentile of 0.5, as Gaussian
  // noise at kFloorSigmas = 4.5 would).
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
    if (n <= kCoordinateTensor) {
      // A small tensor (a bias, sinks, a clip scale): every element on its own.
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> d(n, 0.0);
        d[i] = 1.0;
        add("element " + std::to_string(i), std::move(d));
      }
    } else {
      // Blocks of rows covering the tensor (a row is everything after dimension 0).
      const auto rows = static_cast<std::size_t>(s.shape.at(0));
      const std::size_t row_size = n / rows, blocks = std::min<std::size_t>(rows, options.row_blocks);
      for (std::size_t b = 0; b < blocks && blocks > 1; ++b) {
        const std::size_t first = rows * b / blocks, last = rows * (b + 1) / blocks;
        add("on rows [" + std::to_string(first) + ", " + std::to_string(last) + ")",
            gradient_check_detail::direction(gs, first * row_size, last * row_size, true,
                                             CounterRng(2000 + static_cast<std::uint64_t>(b), s.name)));
      }
    }
    Tensor p = w.at(s.name);
    const Tensor saved = p.clone();
    double best_floor_ratio = INFINITY;  // over the directions: floor / |derivative|
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
        if (!same_expert_sets(routing, base_routing)) return std::nullopt;
        return loss;
      };
      const gradient_check_detail::Estimate estimate =
          gradient_check_detail::estimate_derivative(shifted_loss, base_loss, loss_noise);
      p.copy_from(saved);
      CHECK(!std::isnan(estimate.value));  // two neighbouring steps kept every router choice on one side
      const double numeric = estimate.value, floor = estimate.floor;
      const double scale = std::max(std::abs(numeric), std::abs(analytic));
      // A NaN or infinite analytic value (a NaN gradient) is the worst error, never a quiet 0.
      const double err = !std::isfinite(analytic) ? INFINITY
                         : scale == 0            ? 0
                                                 : std::max(0.0, std::abs(numeric - analytic) - floor) / scale;
      if (scale > 10 * floor) ++out.resolved;
      if (scale > 0) best_floor_ratio = std::min(best_floor_ratio, floor / scale);
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
    if (best_floor_ratio + kGradientTolerance > 0.02) {
      out.blind_to_2_percent.emplace_back(s.name, best_floor_ratio);
      // Only small tensors (norms, routers, clip scales, sinks, convolutions) may be: their
      // derivatives sit near fp32's noise. Projections, experts, embedding and head may not.
      CHECK(n < kBlindTensorLimit);
    }
  }
  if (verbose) {
    std::printf("%d directions, %d resolved; blind to 2%%:", out.directions, out.resolved);
    for (const auto& [name, ratio] : out.blind_to_2_percent) std::printf(" %s (%.3f)", name.c_str(), ratio);
    std::printf("\n");
  }
  if (options.require_resolved_half) CHECK(2 * out.resolved >= out.directions);
  return out;
}

}  // namespace atl::testing

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/dtype.hpp"
#include "kernels/ops/optim.hpp"
#include "tests/support/isa_levels.hpp"

using namespace atl;

TEST_CASE("AdamW matches a hand computation of two steps", "[optim]") {
  Tensor p = Tensor::from_floats({2}, std::vector<float>{1.0f, -2.0f});
  Tensor g = Tensor::from_floats({2}, std::vector<float>{0.5f, 0.25f});
  Tensor m = Tensor::zeros({2}), v = Tensor::zeros({2});
  AdamWHyper h{0.1f, 0.9f, 0.99f, 1e-8f, 0.01f};
  double pd[2] = {1.0, -2.0}, md[2] = {0, 0}, vd[2] = {0, 0}, gd[2] = {0.5, 0.25};
  for (int step = 1; step <= 2; ++step) {
    adamw_step(p, g, m, v, h, step);
    for (int i = 0; i < 2; ++i) {
      pd[i] *= 1 - 0.1 * 0.01;
      md[i] = 0.9 * md[i] + 0.1 * gd[i];
      vd[i] = 0.99 * vd[i] + 0.01 * gd[i] * gd[i];
      double mhat = md[i] / (1 - std::pow(0.9, step)), vhat = vd[i] / (1 - std::pow(0.99, step));
      pd[i] -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  CHECK(p.data<float>()[0] == Approx(pd[0]).epsilon(1e-6));
  CHECK(p.data<float>()[1] == Approx(pd[1]).epsilon(1e-6));
}

TEST_CASE("Global grad-norm clipping scales to the limit", "[optim]") {
  Tensor a = Tensor::from_floats({2}, std::vector<float>{3.0f, 0.0f});
  Tensor b = Tensor::from_floats({1}, std::vector<float>{4.0f});
  double norm = global_grad_norm({a, b});
  CHECK(norm == 5.0);
  double factor = clip_grad_norm({a, b}, norm, 1.0);
  CHECK(factor == Approx(1.0 / 5.0).epsilon(1e-6));
  CHECK(global_grad_norm({a, b}) == Approx(1.0).epsilon(1e-6));
  CHECK(clip_grad_norm({a, b}, 1.0, 10.0) == 1.0);  // below the limit: untouched
}

TEST_CASE("Warmup + cosine schedule hits its anchors", "[optim]") {
  CHECK(warmup_cosine_lr(5, 10, 110, 1.0, 0.1) == Approx(0.5));
  CHECK(warmup_cosine_lr(10, 10, 110, 1.0, 0.1) == Approx(1.0));
  CHECK(warmup_cosine_lr(60, 10, 110, 1.0, 0.1) == Approx(0.55));
  CHECK(warmup_cosine_lr(110, 10, 110, 1.0, 0.1) == Approx(0.1));
}

TEST_CASE("AdamW gives the bits of a scalar loop at every instruction-set level, tails included", "[optim][isa]") {
  // Lengths around the vector widths (8, 16) and their multiples: the vectorized body and its tail.
  for (const std::int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 1003}) {
    INFO("n " << n);
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p0(static_cast<std::size_t>(n)), g(p0.size()), m0(p0.size()), v0(p0.size());
    for (std::size_t i = 0; i < p0.size(); ++i) {
      p0[i] = normal(rng);
      g[i] = normal(rng) * 1e-2f;
      m0[i] = normal(rng) * 1e-3f;
      v0[i] = std::abs(normal(rng)) * 1e-5f;
    }
    const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const std::int64_t step = 7;
    // The scalar loop, written from adamw_step's documented operations (no FMA: -ffp-contract=off).
    std::vector<float> pe = p0, me = m0, ve = v0;
    const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), 7.0));
    const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), 7.0));
    for (std::size_t i = 0; i < pe.size(); ++i) {
      pe[i] *= 1.0f - lr * wd;
      me[i] = beta1 * me[i] + (1.0f - beta1) * g[i];
      ve[i] = beta2 * ve[i] + (1.0f - beta2) * g[i] * g[i];
      pe[i] -= lr / bias1 * me[i] / (std::sqrt(ve[i]) / std::sqrt(bias2) + eps);
    }
    testing::for_each_isa_level([&] {
      for (bool with_copy : {false, true}) {  // the fused bf16 copy leaves the update's bits alone
        INFO("bf16 copy " << with_copy);
        std::vector<float> p = p0, m = m0, v = v0, copy(p0.size(), -1.0f);
        cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, step,
                        with_copy ? copy.data() : nullptr);
        CHECK(std::memcmp(p.data(), pe.data(), p.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(m.data(), me.data(), m.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(v.data(), ve.data(), v.size() * sizeof(float)) == 0);
        for (std::size_t i = 0; i < copy.size(); ++i) {
          const float want = with_copy ? round_to_bf16(pe[i]) : -1.0f;
          CHECK(std::memcmp(&copy[i], &want, sizeof(float)) == 0);
        }
      }
    });
  }
}

// The order written out from cpu::sum_of_squares' comment (lane_sum.hpp): element i into partial
// i mod 16, then partial l += partial l + w for w = 8, 4, 2, 1.
static double lane_order_sum_of_squares(const std::vector<float>& x) {
  double partial[16] = {};
  for (std::size_t i = 0; i < x.size(); ++i) partial[i % 16] += static_cast<double>(x[i]) * x[i];
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) partial[l] += partial[l + w];
  }
  return partial[0];
}

TEST_CASE("The sum of squares adds in its fixed lane order at every instruction-set level", "[optim][isa]") {
  // 2^27 then fifteen ones: in index order each 1 is lost against 2^54 (its ulp is 4), giving 2^54;
  // the exact sum is 2^54 + 15; the lane order gives 2^54 + 12 (worked by hand: the ones meet in
  // pairs, fours and eights before they reach 2^54).
  std::vector<float> probe(16, 1.0f);
  probe[0] = 134217728.0f;  // 2^27
  const double two54 = 18014398509481984.0;
  testing::for_each_isa_level([&] {
    CHECK(cpu::sum_of_squares(probe.data(), 16) == two54 + 12);
    for (const std::int64_t n : {0, 1, 15, 16, 17, 33, 1003, 100000}) {
      INFO("n " << n);
      std::mt19937 rng(static_cast<unsigned>(n) + 1);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& v : x) v = normal(rng) * std::exp2(static_cast<float>(rng() % 40) - 20.0f);
      CHECK(cpu::sum_of_squares(x.data(), n) == lane_order_sum_of_squares(x));
    }
  });
}

TEST_CASE("AdamW's bf16 copy must be a tensor of its own, of the param's shape", "[optim]") {
  Tensor p = Tensor::from_floats({3}, std::vector<float>{1.0f, 2.0f, 3.0f});
  Tensor g = Tensor::full({3}, 0.5f), m = Tensor::zeros({3}), v = Tensor::zeros({3});
  const AdamWHyper h{0.1f, 0.9f, 0.99f, 1e-8f, 0.0f};
  CHECK_THROWS_WITH(adamw_step(p, g, m, v, h, 1, &p), Catch::Contains("overlap"));
  Tensor wrong = Tensor::zeros({2});
  CHECK_THROWS_WITH(adamw_step(p, g, m, v, h, 1, &wrong), Catch::Contains("bf16_copy"));
  Tensor copy = Tensor::zeros({3});
  adamw_step(p, g, m, v, h, 1, &copy);
  for (int i = 0; i < 3; ++i) CHECK(copy.data<float>()[i] == round_to_bf16(p.data<float>()[i]));
}

#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/ops/optim.hpp"

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

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/router.hpp"
#include "kernels/ops/router.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

RouterConfig make_config(std::int64_t experts, std::int64_t k, ScoreFunction score) {
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = k;
  c.score = score;
  return c;
}

std::vector<std::int32_t> indices_of(const RouterForward& f) {
  auto s = f.indices.span<std::int32_t>();
  return {s.begin(), s.end()};
}

std::vector<float> weights_of(const RouterForward& f) {
  auto s = f.weights.span<float>();
  return {s.begin(), s.end()};
}

// Routes one token with all-zero logits (every sigmoid is 0.5) so only the bias decides the selection.
RouterForward route_with_bias(const RouterConfig& c, const std::vector<float>& bias) {
  return router_forward(Tensor::zeros({1, c.num_experts}), Tensor::from_floats({c.num_experts}, bias), c,
                        Precision::fp32);
}

}  // namespace

TEST_CASE("router backward matches finite differences with the selection held fixed", "[router]") {
  const std::int64_t rows = 3, experts = 8;
  struct Case {
    ScoreFunction score;
    std::int64_t k, n_group, topk_group;
    bool norm, norm_top1;
  };
  const std::vector<Case> cases = {
      {ScoreFunction::sigmoid_with_bias, 3, 1, 1, true, false},
      {ScoreFunction::sigmoid_with_bias, 3, 4, 2, true, false},
      {ScoreFunction::sigmoid_with_bias, 3, 1, 1, false, false},
      {ScoreFunction::sigmoid_with_bias, 1, 1, 1, true, true},
      {ScoreFunction::sigmoid_with_bias, 1, 1, 1, true, false},
      {ScoreFunction::softmax, 3, 1, 1, false, false},
      {ScoreFunction::softmax, 3, 1, 1, true, false},
      {ScoreFunction::softmax_before_topk, 3, 1, 1, false, false},
      {ScoreFunction::softmax_before_topk, 3, 1, 1, true, false},
      {ScoreFunction::softmax_before_topk, 1, 1, 1, true, true},
  };
  for (const Case& tc : cases) {
    RouterConfig c = make_config(experts, tc.k, tc.score);
    c.n_group = tc.n_group;
    c.topk_group = tc.topk_group;
    c.norm_topk_prob = tc.norm;
    c.norm_topk_prob_top1 = tc.norm_top1;
    c.route_scale = 2.5f;
    const auto logits = random_vector(rows * experts, 51, 1.5, "logits");
    const auto bias = random_vector(experts, 52, 0.3, "bias");
    const auto r = random_vector(rows * tc.k, 53, 1.0, "r");
    std::vector<double> scores(rows * experts), weights(rows * tc.k);
    std::vector<std::int32_t> idx(rows * tc.k);
    cpu::router_forward(logits.data(), bias.data(), rows, c, Precision::fp32, idx.data(), weights.data(),
                        scores.data());
    auto loss = [&](const std::vector<double>& l) {
      std::vector<double> s(rows * experts), w(rows * tc.k);
      cpu::router_scores(l.data(), rows, c, s.data());
      cpu::router_weights(s.data(), idx.data(), rows, c, Precision::fp32, w.data());
      return weighted_sum(w, r);
    };
    std::vector<double> d_logits(rows * experts);
    cpu::router_backward(r.data(), idx.data(), scores.data(), rows, c, d_logits.data());
    INFO("score " << static_cast<int>(tc.score) << " k " << tc.k << " norm " << tc.norm << " top1 " << tc.norm_top1);
    CHECK(scaled_max_error(d_logits, numeric_gradient(loss, logits)) < 1e-6);
  }
}

TEST_CASE("grouped sigmoid router: group choice by top-2 sum, ties to the lower id", "[router]") {
  // Biased scores c = 0.5 + bias; groups of 2: g0 {0.625, 0.5} = 1.125, g1 {0.75, 0.25} = 1.0,
  // g2 {0.5625, 0.5625} = 1.125, g3 {0.6875, 0.25} = 0.9375. g1 holds the best single expert but loses.
  RouterConfig c = make_config(8, 3, ScoreFunction::sigmoid_with_bias);
  c.n_group = 4;
  c.topk_group = 2;
  const std::vector<float> bias = {0.125f, 0.f, 0.25f, -0.25f, 0.0625f, 0.0625f, 0.1875f, -0.25f};
  RouterForward f = route_with_bias(c, bias);
  // Kept groups g0, g2; experts 4 and 5 tie, the lower id first.
  CHECK(indices_of(f) == std::vector<std::int32_t>{0, 4, 5});
  // Weights are the unbiased sigmoids (all 0.5), normalised.
  for (float w : weights_of(f)) CHECK(w == Approx(1.0 / 3.0).epsilon(1e-6));

  // One group kept: g0 and g2 tie at 1.125, g0 (lower id) wins.
  c.topk_group = 1;
  c.top_k = 2;
  CHECK(indices_of(route_with_bias(c, bias)) == std::vector<std::int32_t>{0, 1});

  // Ungrouped: plain top-3 on the biased scores.
  c.n_group = 1;
  c.top_k = 3;
  CHECK(indices_of(route_with_bias(c, bias)) == std::vector<std::int32_t>{2, 6, 0});
}

TEST_CASE("grouped router drops groups to -inf, and uses top-1 for one-expert groups", "[router]") {
  // Kept group g0 has negative biased scores; dropped g1 must not win with a 0 score.
  RouterConfig c = make_config(4, 2, ScoreFunction::sigmoid_with_bias);
  c.n_group = 2;
  c.topk_group = 1;
  CHECK(indices_of(route_with_bias(c, {-1.5f, -1.75f, -3.f, -3.5f})) == std::vector<std::int32_t>{0, 1});

  // Group size 1: the group score is the expert's own biased score (a top-2 sum would be -inf for all).
  RouterConfig one = make_config(4, 2, ScoreFunction::sigmoid_with_bias);
  one.n_group = 4;
  one.topk_group = 2;
  CHECK(indices_of(route_with_bias(one, {0.1f, 0.2f, 0.9f, 0.8f})) == std::vector<std::int32_t>{2, 3});
}

TEST_CASE("router normalisation, top-1 rule and route scale", "[router]") {
  const float logit = 0.7f;
  const double s = 1 / (1 + std::exp(-0.7));
  Tensor logits = Tensor::from_floats({1, 3}, std::vector<float>{-1.f, logit, 0.2f});
  RouterConfig c = make_config(3, 1, ScoreFunction::sigmoid_with_bias);
  c.route_scale = 2.0f;
  // k = 1 without the top-1 switch: the raw sigmoid, scaled.
  RouterForward raw = router_forward(logits, Tensor(), c, Precision::fp32);
  CHECK(indices_of(raw) == std::vector<std::int32_t>{1});
  CHECK(weights_of(raw)[0] == Approx(2.0 * s).epsilon(1e-6));
  // With norm_topk_prob_top1: w / (w + 1e-20) = 1, scaled.
  c.norm_topk_prob_top1 = true;
  RouterForward top1 = router_forward(logits, Tensor(), c, Precision::fp32);
  CHECK(weights_of(top1)[0] == Approx(2.0).epsilon(1e-6));
  // Its gradient vanishes: a normalised single weight does not depend on the logit.
  Tensor d = router_backward(Tensor::full({1, 1}, 1.0f), top1, c);
  for (float x : d.span<float>()) CHECK(std::abs(x) < 1e-6);

  // k = 2 normalised: the two weights sum to route_scale.
  c.top_k = 2;
  c.norm_topk_prob_top1 = false;
  RouterForward two = router_forward(logits, Tensor(), c, Precision::fp32);
  CHECK(indices_of(two) == std::vector<std::int32_t>{1, 2});
  CHECK(weights_of(two)[0] + weights_of(two)[1] == Approx(2.0).epsilon(1e-6));
}

TEST_CASE("softmax score functions and top-k ties", "[router]") {
  Tensor logits = Tensor::from_floats({1, 4}, std::vector<float>{0.5f, 2.0f, 0.5f, 1.0f});
  // softmax: top-2 on raw logits {1, 3}, softmax over the two.
  RouterConfig c = make_config(4, 2, ScoreFunction::softmax);
  c.norm_topk_prob = false;
  RouterForward f = router_forward(logits, Tensor(), c, Precision::fp32);
  CHECK(indices_of(f) == std::vector<std::int32_t>{1, 3});
  const double e1 = std::exp(2.0), e3 = std::exp(1.0);
  CHECK(weights_of(f)[0] == Approx(e1 / (e1 + e3)).epsilon(1e-6));
  CHECK(weights_of(f)[1] == Approx(e3 / (e1 + e3)).epsilon(1e-6));

  // softmax_before_topk: softmax over all four, gathered, not renormalised.
  c.score = ScoreFunction::softmax_before_topk;
  c.top_k = 3;
  RouterForward g = router_forward(logits, Tensor(), c, Precision::fp32);
  // Experts 0 and 2 tie at 0.5: the lower id comes first and only it makes the top 3.
  CHECK(indices_of(g) == std::vector<std::int32_t>{1, 3, 0});
  const double z = std::exp(0.5) * 2 + std::exp(2.0) + std::exp(1.0);
  CHECK(weights_of(g)[0] == Approx(std::exp(2.0) / z).epsilon(1e-6));
  CHECK(weights_of(g)[2] == Approx(std::exp(0.5) / z).epsilon(1e-6));

  // All-equal logits: ids ascend.
  c.score = ScoreFunction::sigmoid_with_bias;
  c.top_k = 4;
  CHECK(indices_of(router_forward(Tensor::zeros({1, 4}), Tensor(), c, Precision::fp32)) ==
        std::vector<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("router Tensor backward agrees with the double kernel, unselected experts get no gradient", "[router]") {
  const std::int64_t rows = 5, experts = 6, k = 2;
  RouterConfig c = make_config(experts, k, ScoreFunction::sigmoid_with_bias);
  const auto lv = random_vector(rows * experts, 61, 1.0, "logits");
  const auto bv = random_vector(experts, 62, 0.5, "bias");
  const auto dv = random_vector(rows * k, 63, 1.0, "dw");
  std::vector<float> lf(lv.begin(), lv.end()), bf(bv.begin(), bv.end()), df(dv.begin(), dv.end());
  RouterForward f = router_forward(Tensor::from_floats({rows, experts}, lf), Tensor::from_floats({experts}, bf), c,
                                   Precision::fp32);
  Tensor d = router_backward(Tensor::from_floats({rows, k}, df), f, c);
  // The reference: the double kernel (checked by finite differences above) on the same float
  // inputs and the forward's selection.
  const float* scores = f.scores.data<float>();
  const std::vector<double> dd(df.begin(), df.end()), sd(scores, scores + rows * experts);
  std::vector<double> expect(rows * experts);
  cpu::router_backward(dd.data(), f.indices.data<std::int32_t>(), sd.data(), rows, c, expect.data());
  for (std::int64_t t = 0; t < rows; ++t) {
    for (std::int64_t e = 0; e < experts; ++e) {
      CHECK(d.data<float>()[t * experts + e] == Approx(expect[t * experts + e]).epsilon(1e-5).margin(1e-6));
      bool selected = false;
      for (std::int64_t j = 0; j < k; ++j) selected |= f.indices.data<std::int32_t>()[t * k + j] == e;
      if (!selected) CHECK(d.data<float>()[t * experts + e] == 0.0f);
    }
  }
}

TEST_CASE("router weights are rounded to bf16 in bf16 unless router_weights_fp32", "[router]") {
  const std::int64_t rows = 8, experts = 16, k = 4;
  RouterConfig c = make_config(experts, k, ScoreFunction::sigmoid_with_bias);
  c.route_scale = 1.7f;
  const auto lv = random_vector(rows * experts, 71, 1.0, "logits");
  std::vector<float> lf(lv.begin(), lv.end());
  Tensor logits = Tensor::from_floats({rows, experts}, lf);
  RouterForward hi = router_forward(logits, Tensor(), c, Precision::fp32);
  RouterForward lo = router_forward(logits, Tensor(), c, Precision::bf16);
  CHECK(indices_of(hi) == indices_of(lo));  // the router itself stays fp32
  for (std::int64_t i = 0; i < rows * k; ++i) {
    const float w = lo.weights.data<float>()[i], ref = hi.weights.data<float>()[i];
    CHECK(w == round_to_bf16(ref));
    CHECK(std::abs(w - ref) <= 4e-3 * std::abs(ref));  // bf16 keeps 8 significant bits
  }
  c.router_weights_fp32 = true;
  RouterForward kept = router_forward(logits, Tensor(), c, Precision::bf16);
  CHECK(weights_of(kept) == weights_of(hi));
}

TEST_CASE("router rejects bad configs and shapes", "[router]") {
  RouterConfig c = make_config(4, 5, ScoreFunction::softmax);
  CHECK_THROWS_AS(router_forward(Tensor::zeros({2, 4}), Tensor(), c, Precision::fp32), std::invalid_argument);
  c.top_k = 2;
  c.n_group = 3;
  CHECK_THROWS_AS(router_forward(Tensor::zeros({2, 4}), Tensor(), c, Precision::fp32), std::invalid_argument);
  c.n_group = 2;
  c.topk_group = 1;
  c.top_k = 3;  // more than one kept group of 2 can supply
  CHECK_THROWS_AS(router_forward(Tensor::zeros({2, 4}), Tensor(), c, Precision::fp32), std::invalid_argument);
  c.n_group = 1;
  CHECK_THROWS_AS(router_forward(Tensor::zeros({2, 5}), Tensor(), c, Precision::fp32), std::invalid_argument);
  CHECK_THROWS_AS(router_forward(Tensor::zeros({2, 4}), Tensor::zeros({3}), c, Precision::fp32),
                  std::invalid_argument);
}

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/loss.hpp"
#include "kernels/ops/loss.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;

namespace {

Tensor tensor_of(Shape shape, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_floats(std::move(shape), f);
}

Tensor targets_of(const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::i64);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int64_t>()[i] = v[i];
  return t;
}

}  // namespace

TEST_CASE("loss backward matches finite differences through the softcap and mask", "[loss]") {
  const std::int64_t rows = 4, vocab = 7, usable = 5;
  const std::vector<std::int64_t> targets = {3, -100, 0, 4};
  const auto logits = random_vector(rows * vocab, 141, 3.0, "logits");
  const double scale = 0.37;
  for (double cap : {2.0, 0.0}) {
    auto loss = [&](const std::vector<double>& z) {
      std::vector<double> capped(rows * vocab), probs(rows * vocab);
      std::int64_t count = 0;
      return scale * cpu::logit_loss_forward(z.data(), targets.data(), rows, vocab, usable, cap, capped.data(),
                                             probs.data(), &count);
    };
    std::vector<double> capped(rows * vocab), probs(rows * vocab), d(rows * vocab);
    std::int64_t count = 0;
    cpu::logit_loss_forward(logits.data(), targets.data(), rows, vocab, usable, cap, capped.data(), probs.data(),
                            &count);
    CHECK(count == 3);
    cpu::logit_loss_backward(probs.data(), capped.data(), targets.data(), rows, vocab, usable, cap, scale, d.data());
    INFO("cap " << cap);
    CHECK(scaled_max_error(d, numeric_gradient(loss, logits)) < 1e-6);
  }
}

TEST_CASE("softcap bounds logits, masked columns are -inf with probability 0 and zero gradient", "[loss]") {
  const std::int64_t rows = 3, vocab = 6, usable = 4;
  const float cap = 5.0f;
  const auto z = random_vector(rows * vocab, 151, 20.0, "logits");  // far beyond the cap
  const std::vector<std::int64_t> tg = {1, 3, -100};
  LogitLossForward f = logit_loss_forward(tensor_of({rows, vocab}, z), targets_of(tg), usable, cap);
  Tensor d = logit_loss_backward(f, targets_of(tg), usable, cap, 1.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    double prob_sum = 0;
    for (std::int64_t v = 0; v < vocab; ++v) {
      const std::int64_t i = r * vocab + v;
      if (v < usable) {
        CHECK(std::abs(f.capped.data<float>()[i]) <= cap);
        CHECK(f.capped.data<float>()[i] == Approx(cap * std::tanh(z[i] / cap)).epsilon(1e-5));
      } else {
        CHECK(f.capped.data<float>()[i] == -std::numeric_limits<float>::infinity());
        CHECK(f.probs.data<float>()[i] == 0.0f);
        CHECK(d.data<float>()[i] == 0.0f);
      }
      if (tg[r] == -100) CHECK(d.data<float>()[i] == 0.0f);  // ignored row
      prob_sum += f.probs.data<float>()[i];
    }
    CHECK(prob_sum == Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("cross entropy value, sum and count", "[loss]") {
  // Row 0: z = [0, ln 3], target 1 -> CE = ln(1 + 3) - ln 3. Row 1 ignored. No cap, no mask.
  Tensor logits = Tensor::from_floats({2, 2}, std::vector<float>{0.f, std::log(3.f), 9.f, -9.f});
  LogitLossForward f = logit_loss_forward(logits, targets_of({1, -100}), 2, 0.0f);
  CHECK(f.count == 1);
  CHECK(f.loss_sum == Approx(std::log(4.0) - std::log(3.0)).epsilon(1e-6));
  // Backward with scale 1/count: softmax minus one-hot.
  Tensor d = logit_loss_backward(f, targets_of({1, -100}), 2, 0.0f, 1.0f);
  CHECK(d.data<float>()[0] == Approx(0.25).epsilon(1e-6));
  CHECK(d.data<float>()[1] == Approx(-0.25).epsilon(1e-6));
  CHECK(d.data<float>()[2] == 0.0f);
  CHECK(d.data<float>()[3] == 0.0f);

  // Huge logits without a cap stay finite.
  Tensor big = Tensor::from_floats({1, 3}, std::vector<float>{1e4f, -1e4f, 0.f});
  LogitLossForward fb = logit_loss_forward(big, targets_of({1}), 3, 0.0f);
  CHECK(fb.loss_sum == Approx(2e4).epsilon(1e-6));
}

TEST_CASE("all-ignored targets give count 0, sum 0 and zero gradient", "[loss]") {
  Tensor logits = tensor_of({3, 4}, random_vector(12, 161, 1.0, "logits"));
  const auto tg = targets_of({-100, -100, -100});
  LogitLossForward f = logit_loss_forward(logits, tg, 4, 30.0f);
  CHECK(f.count == 0);
  CHECK(f.loss_sum == 0.0);
  Tensor d = logit_loss_backward(f, tg, 4, 30.0f, 1.0f);
  for (float x : d.span<float>()) CHECK(x == 0.0f);
}

TEST_CASE("loss rejects bad targets and shapes", "[loss]") {
  Tensor logits = Tensor::zeros({2, 5});
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({0, 4}), 4, 0.f), std::invalid_argument);  // masked column
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({0, 5}), 5, 0.f), std::invalid_argument);
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({-1, 0}), 5, 0.f), std::invalid_argument);
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({-101, 0}), 5, 0.f), std::invalid_argument);
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({0}), 5, 0.f), std::invalid_argument);
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({0, 0}), 6, 0.f), std::invalid_argument);
  CHECK_THROWS_AS(logit_loss_forward(logits, targets_of({0, 0}), 0, 0.f), std::invalid_argument);
  CHECK_NOTHROW(logit_loss_forward(logits, targets_of({-100, 4}), 5, 0.f));
}

TEST_CASE("loss on bf16-rounded logits agrees with fp32", "[loss]") {
  const std::int64_t rows = 8, vocab = 64, usable = 50;
  const auto z = random_vector(rows * vocab, 171, 4.0, "logits");
  std::vector<std::int64_t> tg;
  for (std::int64_t r = 0; r < rows; ++r) tg.push_back(r == 3 ? -100 : (r * 7) % usable);
  Tensor exact = tensor_of({rows, vocab}, z);
  Tensor rounded = exact.clone();
  round_to_bf16_inplace(rounded);
  LogitLossForward hi = logit_loss_forward(exact, targets_of(tg), usable, 30.0f);
  LogitLossForward lo = logit_loss_forward(rounded, targets_of(tg), usable, 30.0f);
  CHECK(hi.count == lo.count);
  CHECK(lo.loss_sum / lo.count == Approx(hi.loss_sum / hi.count).epsilon(1e-2));
  Tensor dh = logit_loss_backward(hi, targets_of(tg), usable, 30.0f, 1.0f / hi.count);
  Tensor dl = logit_loss_backward(lo, targets_of(tg), usable, 30.0f, 1.0f / lo.count);
  double scale = 0, err = 0;
  for (std::int64_t i = 0; i < dh.numel(); ++i) {
    scale = atl::testing::worst_of(scale, static_cast<double>(std::abs(dh.data<float>()[i])));
    err = atl::testing::worst_of(err, static_cast<double>(std::abs(dh.data<float>()[i] - dl.data<float>()[i])));
  }
  CHECK(err <= 2e-2 * scale);
}

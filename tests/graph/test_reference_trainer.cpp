#include <catch2/catch.hpp>

#include <bit>
#include <cmath>

#include "graph/reference/trainer.hpp"
#include "kernels/tree_sum.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;

namespace {

// The tree written out recursively, independently of the streaming implementation.
double recursive_tree(const std::vector<double>& v, std::size_t lo, std::size_t n) {
  if (n == 1) return v[lo];
  std::size_t p = 1;
  while (p * 2 < n) p *= 2;
  return recursive_tree(v, lo, p) + recursive_tree(v, lo + p, n - p);
}

std::shared_ptr<const BeamModel> tiny(const char* preset) {
  return std::make_shared<const BeamModel>(beam_preset(preset));
}

}  // namespace

TEST_CASE("The streaming pairwise sum follows the fixed tree over indices", "[trainer][tree]") {
  // Values of wildly different magnitude so that every association order rounds differently.
  std::vector<double> v;
  for (int i = 0; i < 13; ++i) v.push_back(std::ldexp(1.0 + 0.1 * i, (i * 37) % 60 - 30) * (i % 3 ? 1 : -1));
  for (std::size_t n = 1; n <= v.size(); ++n) {
    auto tree = make_tree_sum<double>([](double& a, const double& b) { a += b; });
    for (std::size_t i = 0; i < n; ++i) tree.push(v[i]);
    CHECK(std::bit_cast<std::uint64_t>(tree.finish()) == std::bit_cast<std::uint64_t>(recursive_tree(v, 0, n)));
  }
  // The tree is not the left-to-right sum: ((1e16 + 1) - 1e16) + 1 = 1, (1e16 + 1) + (-1e16 + 1) = 0.
  auto tree = make_tree_sum<double>([](double& a, const double& b) { a += b; });
  for (double x : {1e16, 1.0, -1e16, 1.0}) tree.push(x);
  CHECK(tree.finish() == 0.0);
}

TEST_CASE("Step loss is the global batch's CE sum over its target count", "[trainer]") {
  auto model = tiny("beam-tiny-moe");
  TensorMap w0 = TensorMap::initialized(model->specs(), 21, 0.02f);
  Batch batch = testing::synthetic_batch(4, 32, 22);
  LossSum expect = model->forward(w0, batch, Precision::fp32);
  ReferenceTrainer trainer(model, w0.clone(), Precision::fp32, 2, OptimizerSettings{});
  StepResult r = trainer.step(batch);
  CHECK(r.targets == batch.target_count());
  CHECK(r.loss == Approx(expect.loss_sum / static_cast<double>(expect.targets)).epsilon(1e-6));
  CHECK(r.grad_norm > 0);
}

TEST_CASE("Gradient accumulation over micro-batches equals one large batch", "[trainer]") {
  for (const char* preset : {"beam-tiny-moe", "beam-tiny-dense"}) {
    auto model = tiny(preset);
    TensorMap w0 = TensorMap::initialized(model->specs(), 23, 0.02f);
    OptimizerSettings opt;
    opt.lr = 1e-3;
    opt.total_steps = 3;
    ReferenceTrainer whole(model, w0.clone(), Precision::fp32, 4, opt);
    ReferenceTrainer split(model, w0.clone(), Precision::fp32, 1, opt);
    for (int s = 0; s < 3; ++s) {
      Batch batch = testing::synthetic_batch(4, 32, 30 + static_cast<std::uint64_t>(s));
      StepResult a = whole.step(batch), b = split.step(batch);
      CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
      CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-4));
    }
    double max_diff = 0;
    for (const auto& name : whole.master().names()) {
      const auto pa = whole.master().at(name).span<float>(), pb = split.master().at(name).span<float>();
      for (std::size_t i = 0; i < pa.size(); ++i) {
        max_diff = testing::worst_of(max_diff, static_cast<double>(std::abs(pa[i] - pb[i])));
      }
    }
    // Micro-batching changes the summation order (rounding ~1e-7 relative); AdamW normalises each
    // element, so near-zero gradients can move by a sizeable part of lr: bound at 0.1 * lr.
    INFO(preset);
    CHECK(max_diff < 1e-4);
  }
}

TEST_CASE("The reference trainer is deterministic and learns", "[trainer]") {
  auto model = tiny("beam-tiny-dense");
  OptimizerSettings opt;
  opt.lr = 1e-2;
  opt.total_steps = 40;
  auto run = [&] {
    ReferenceTrainer t(model, TensorMap::initialized(model->specs(), 5, 0.02f), Precision::bf16, 2, opt);
    auto data = make_data_source(DataConfig{}, 250, 100);  // one Markov source: something to learn
    std::vector<double> losses;
    for (int s = 0; s < 40; ++s) losses.push_back(t.step(data->next(8, 32)).loss);
    return losses;
  };
  std::vector<double> a = run(), b = run();
  CHECK(a == b);  // bitwise: same seed, same data, same order
  CHECK(a.back() < a.front() - 0.3);
}

TEST_CASE("A bf16 trainer rebuilt from its state before every step gives the continuing one's bits",
          "[trainer]") {
  // The continuing trainer reads bf16 weights its AdamW wrote; a rebuilt one rounds them afresh
  // from the masters. Stale or differently rounded weights would part the two at the next step.
  auto model = tiny("beam-tiny-moe");
  OptimizerSettings opt;
  opt.lr = 1e-2;
  opt.total_steps = 4;
  ReferenceTrainer going(model, TensorMap::initialized(model->specs(), 8, 0.02f), Precision::bf16, 2, opt);
  for (int s = 0; s < 4; ++s) {
    INFO("step " << s + 1);
    const Batch batch = testing::synthetic_batch(4, 32, 40 + static_cast<std::uint64_t>(s));
    ReferenceTrainer rebuilt(model, going.state(), Precision::bf16, 2, opt);
    const StepResult a = going.step(batch), b = rebuilt.step(batch);
    CHECK(std::bit_cast<std::uint64_t>(a.loss) == std::bit_cast<std::uint64_t>(b.loss));
    CHECK(std::bit_cast<std::uint64_t>(a.grad_norm) == std::bit_cast<std::uint64_t>(b.grad_norm));
    for (const auto& name : going.master().names()) {
      INFO(name);
      CHECK(testing::same_bits(going.master().at(name), rebuilt.master().at(name)));
    }
  }
}

TEST_CASE("Rows that are not a multiple of the micro-batch are rejected", "[trainer]") {
  auto model = tiny("beam-tiny-dense");
  ReferenceTrainer t(model, TensorMap::initialized(model->specs(), 5, 0.02f), Precision::fp32, 3, OptimizerSettings{});
  CHECK_THROWS_WITH(t.step(testing::synthetic_batch(4, 32, 1)), Catch::Contains("micro_batch"));
}

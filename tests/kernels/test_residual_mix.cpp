#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/residual_mix.hpp"
#include "kernels/ops/residual_mix.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using namespace atl::testing;

namespace {
std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Sources stored back to back in one vector: [N, rows, dim].
std::vector<double> mix(const std::vector<double>& src, const std::vector<double>& w, std::int64_t n, std::int64_t rows,
                        std::int64_t dim) {
  std::vector<const double*> p;
  for (std::int64_t s = 0; s < n; ++s) p.push_back(src.data() + s * rows * dim);
  std::vector<double> out(static_cast<std::size_t>(rows * dim)), a(static_cast<std::size_t>(rows * n)),
      rs(static_cast<std::size_t>(rows * n));
  cpu::residual_mix_forward<double>(p.data(), n, w.data(), out.data(), a.data(), rs.data(), rows, dim, 1e-6, false);
  return out;
}
}  // namespace

TEST_CASE("Residual mix backward matches finite differences for every source and the query", "[residual_mix][grad]") {
  for (std::int64_t n : {2, 3, 5}) {
    const std::int64_t rows = 4, dim = 6;
    auto src = random_vector(n * rows * dim, 1 + n), w = random_vector(dim, 2, 0.7), r = random_vector(rows * dim, 3);
    std::vector<const double*> p;
    std::vector<double> dsrc(src.size()), dw(dim, 0.0);
    std::vector<double*> dp;
    for (std::int64_t s = 0; s < n; ++s) {
      p.push_back(src.data() + s * rows * dim);
      dp.push_back(dsrc.data() + s * rows * dim);
    }
    std::vector<double> out(rows * dim), a(rows * n), rs(rows * n);
    cpu::residual_mix_forward<double>(p.data(), n, w.data(), out.data(), a.data(), rs.data(), rows, dim, 1e-6, false);
    cpu::residual_mix_backward<double>(r.data(), p.data(), n, w.data(), a.data(), rs.data(), dp.data(), dw.data(), rows,
                                       dim);
    auto loss_src = [&](const std::vector<double>& v) { return weighted_sum(mix(v, w, n, rows, dim), r); };
    auto loss_w = [&](const std::vector<double>& v) { return weighted_sum(mix(src, v, n, rows, dim), r); };
    INFO("sources " << n);
    CHECK(scaled_max_error(dsrc, numeric_gradient(loss_src, src)) < 1e-7);
    CHECK(scaled_max_error(dw, numeric_gradient(loss_w, w)) < 1e-7);
  }
}

TEST_CASE("Residual mix with a zero query is the mean of the sources, weights sum to 1", "[residual_mix]") {
  std::vector<Tensor> sources;
  for (int s = 0; s < 3; ++s) sources.push_back(Tensor::from_floats({4, 8}, to_floats(random_vector(32, 10 + s))));
  ResidualMixForward f = residual_mix_forward(sources, Tensor::zeros({8}), 1e-6f, Precision::fp32);
  for (std::int64_t i = 0; i < 32; ++i) {
    const float mean = (sources[0].data<float>()[i] + sources[1].data<float>()[i] + sources[2].data<float>()[i]) / 3;
    CHECK(f.out.data<float>()[i] == Approx(mean).margin(1e-6));
  }
  ResidualMixForward g = residual_mix_forward(sources, Tensor::from_floats({1, 8}, to_floats(random_vector(8, 4))),
                                              1e-6f, Precision::fp32);
  for (std::int64_t r = 0; r < 4; ++r) {
    double sum = 0;
    for (int s = 0; s < 3; ++s) sum += g.weights.data<float>()[r * 3 + s];
    CHECK(sum == Approx(1.0).epsilon(1e-6));
  }
  // Keys are RMS-normalised: scaling a source does not change the mixture weights.
  std::vector<Tensor> scaled = sources;
  scaled[1] = sources[1].clone();
  for (float& v : scaled[1].span<float>()) v *= 4.0f;
  ResidualMixForward h =
      residual_mix_forward(scaled, Tensor::from_floats({8}, to_floats(random_vector(8, 4))), 1e-6f, Precision::fp32);
  for (std::int64_t i = 0; i < 12; ++i)
    CHECK(h.weights.data<float>()[i] == Approx(g.weights.data<float>()[i]).epsilon(1e-5));
}

TEST_CASE("Residual mix of one source returns it unchanged", "[residual_mix]") {
  Tensor x = Tensor::from_floats({2, 4}, to_floats(random_vector(8, 5)));
  ResidualMixForward f = residual_mix_forward({x}, Tensor(), 1e-6f, Precision::bf16);
  CHECK(f.out.storage() == x.storage());  // the identity: no query, no copy, no rounding
  Tensor d = Tensor::full({2, 4}, 1.5f);
  auto g = residual_mix_backward(d, {x}, Tensor(), f, nullptr);
  REQUIRE(g.size() == 1);
  CHECK(g[0].data<float>()[3] == 1.5f);
}

TEST_CASE("Residual mix in bf16 agrees with fp32 and rounds its output once", "[residual_mix][bf16]") {
  std::vector<Tensor> s32, s16;
  for (int s = 0; s < 4; ++s) {
    s32.push_back(Tensor::from_floats({6, 16}, to_floats(random_vector(96, 20 + s))));
    s16.push_back(s32.back().clone());
    round_to_bf16_inplace(s16.back());
  }
  Tensor w = Tensor::from_floats({16}, to_floats(random_vector(16, 30, 0.5)));  // fp32 island
  ResidualMixForward f32 = residual_mix_forward(s32, w, 1e-6f, Precision::fp32);
  ResidualMixForward f16 = residual_mix_forward(s16, w, 1e-6f, Precision::bf16);
  for (std::int64_t i = 0; i < 96; ++i) {
    CHECK(f16.out.data<float>()[i] == round_to_bf16(f16.out.data<float>()[i]));
    CHECK(f16.out.data<float>()[i] == Approx(f32.out.data<float>()[i]).epsilon(2e-2).margin(2e-2));
  }
  int unrounded = 0;  // the mixture weights stay fp32
  for (std::int64_t i = 0; i < 24; ++i) {
    unrounded += f16.weights.data<float>()[i] != round_to_bf16(f16.weights.data<float>()[i]);
    CHECK(f16.weights.data<float>()[i] == Approx(f32.weights.data<float>()[i]).epsilon(2e-2));
  }
  CHECK(unrounded > 0);
}

TEST_CASE("Residual mix rejects mismatched sources and queries", "[residual_mix]") {
  CHECK_THROWS_WITH(
      residual_mix_forward({Tensor::zeros({2, 4}), Tensor::zeros({2, 5})}, Tensor::zeros({4}), 1e-6f, Precision::fp32),
      Catch::Contains("residual_mix_forward") && Catch::Contains("sources[1]"));
  CHECK_THROWS_WITH(
      residual_mix_forward({Tensor::zeros({2, 4}), Tensor::zeros({2, 4})}, Tensor::zeros({3}), 1e-6f, Precision::fp32),
      Catch::Contains("H = 4"));
  CHECK_THROWS_WITH(residual_mix_forward({}, Tensor(), 1e-6f, Precision::fp32), Catch::Contains("at least one"));
}

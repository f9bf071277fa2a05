// RoPE and SSMax: finite-difference gradients in double, the rotate-half formula, orthogonality,
// relative-position invariance, the SSMax factor and bf16-vs-fp32 agreement.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/rope.hpp"
#include "kernels/ops/rope.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

Tensor f32_tensor(Shape shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  for (std::size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = static_cast<float>(values[i]);
  return t;
}

Tensor i64_tensor(Shape shape, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty(std::move(shape), DType::i64);
  for (std::size_t i = 0; i < values.size(); ++i) t.data<std::int64_t>()[i] = values[i];
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    m = atl::testing::worst_of(m, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  }
  return m;
}

}  // namespace

TEST_CASE("rope: backward matches finite differences in double", "[rope]") {
  const std::int64_t tokens = 3, heads = 2, dim = 6;
  const std::vector<std::int64_t> pos{0, 5, 17};
  const std::size_t n = static_cast<std::size_t>(tokens * heads * dim);
  const auto x = random_vector(n, 1);
  const auto r = random_vector(n, 2);
  auto loss = [&](const std::vector<double>& xs) {
    std::vector<double> y(n);
    cpu::rope_forward<double>(xs.data(), pos.data(), y.data(), tokens, heads, dim, 10000.0f);
    return weighted_sum(y, r);
  };
  std::vector<double> dx(n);
  cpu::rope_backward<double>(r.data(), pos.data(), dx.data(), tokens, heads, dim, 10000.0f);
  REQUIRE(scaled_max_error(dx, numeric_gradient(loss, x)) < 1e-6);
}

TEST_CASE("rope: matches the rotate-half formula, position 0 is the identity", "[rope]") {
  // D = 4, theta = 10000: inv_freq = {1, 10000^-0.5 = 0.01}.
  const std::vector<double> x{0.3, -1.2, 0.7, 2.0, /*token 2*/ 0.3, -1.2, 0.7, 2.0};
  const Tensor y = rope_forward(f32_tensor({2, 1, 4}, x), i64_tensor({2}, {3, 0}), 10000.0f);
  const float* yd = y.data<float>();
  const double a0 = 3.0, a1 = 0.03;
  CHECK(yd[0] == Approx(x[0] * std::cos(a0) - x[2] * std::sin(a0)).margin(1e-6));
  CHECK(yd[1] == Approx(x[1] * std::cos(a1) - x[3] * std::sin(a1)).margin(1e-6));
  CHECK(yd[2] == Approx(x[2] * std::cos(a0) + x[0] * std::sin(a0)).margin(1e-6));
  CHECK(yd[3] == Approx(x[3] * std::cos(a1) + x[1] * std::sin(a1)).margin(1e-6));
  for (int i = 0; i < 4; ++i) CHECK(yd[4 + i] == static_cast<float>(x[static_cast<std::size_t>(i)]));
}

TEST_CASE("rope: backward of forward with dy = y returns x (orthogonal rotation)", "[rope]") {
  const Shape shape{2, 5, 3, 8};  // [B, S, heads, D], positions [B, S]
  const Tensor x = f32_tensor(shape, random_vector(2 * 5 * 3 * 8, 3));
  const Tensor pos = i64_tensor({2, 5}, {0, 1, 2, 0, 1, /*row 2*/ 40, 41, 0, 1, 2});
  const Tensor y = rope_forward(x, pos, 10000.0f);
  const Tensor back = rope_backward(y, pos, 10000.0f);
  REQUIRE(max_abs_diff(back, x) < 1e-6);
  // The rotation keeps every head vector's norm.
  for (std::int64_t row = 0; row < 2 * 5 * 3; ++row) {
    double nx = 0, ny = 0;
    for (std::int64_t d = 0; d < 8; ++d) {
      nx += std::pow(x.data<float>()[row * 8 + d], 2);
      ny += std::pow(y.data<float>()[row * 8 + d], 2);
    }
    CHECK(std::sqrt(ny) == Approx(std::sqrt(nx)).epsilon(1e-6));
  }
}

TEST_CASE("rope: rotated dot products depend only on the position difference", "[rope]") {
  const std::int64_t dim = 8;
  const auto q = random_vector(dim, 4);
  const auto k = random_vector(dim, 5);
  auto rotated_dot = [&](std::int64_t m, std::int64_t n) {
    std::vector<double> qr(dim), kr(dim);
    cpu::rope_forward<double>(q.data(), &m, qr.data(), 1, 1, dim, 10000.0f);
    cpu::rope_forward<double>(k.data(), &n, kr.data(), 1, 1, dim, 10000.0f);
    double s = 0;
    for (std::int64_t d = 0; d < dim; ++d) s += qr[static_cast<std::size_t>(d)] * kr[static_cast<std::size_t>(d)];
    return s;
  };
  // fp32 angle tables limit the agreement to ~1e-6 of the angle.
  CHECK(rotated_dot(5, 2) == Approx(rotated_dot(13, 10)).margin(1e-5));
  CHECK(rotated_dot(7, 7) == Approx(rotated_dot(0, 0)).margin(1e-5));
}

TEST_CASE("rope: rejects odd head dims and mismatched positions", "[rope]") {
  CHECK_THROWS_AS(rope_forward(Tensor::zeros({2, 1, 5}), i64_tensor({2}, {0, 1}), 10000.0f), std::invalid_argument);
  CHECK_THROWS_AS(rope_forward(Tensor::zeros({2, 1, 4}), i64_tensor({3}, {0, 1, 2}), 10000.0f),
                  std::invalid_argument);
  CHECK_THROWS_AS(rope_backward(Tensor::zeros({2, 1, 4}), Tensor::zeros({2}), 10000.0f), std::invalid_argument);
}

TEST_CASE("ssmax: factor is (1 + (pos+1)/base)^exponent in fp32", "[rope][ssmax]") {
  const Tensor q = Tensor::full({3, 2, 4}, 1.0f);
  const Tensor y = ssmax_forward(q, i64_tensor({3}, {0, 2047, 5}), 2048.0f, 0.1f);
  // The fp32 value nearest the power (base and exponent are fp32 values; libm's double pow rounded
  // once, kernels/cpu/libm_float.hpp), not powf's, whose last bit may differ.
  const float at0 = static_cast<float>(std::pow(double{1.0f + 1.0f / 2048.0f}, double{0.1f}));
  CHECK(y.data<float>()[0] == at0);
  CHECK(y.data<float>()[7] == at0);  // every channel of token 0
  CHECK(y.data<float>()[8] == Approx(std::pow(2.0, 0.1)).epsilon(1e-6));
  CHECK(static_cast<double>(at0) == Approx(std::pow(1.0 + 1.0 / 2048.0, 0.1)).epsilon(1e-7));
}

TEST_CASE("ssmax: backward matches finite differences in double", "[rope][ssmax]") {
  const std::int64_t tokens = 4, row = 6;
  const std::vector<std::int64_t> pos{0, 1, 0, 300};
  const std::size_t n = static_cast<std::size_t>(tokens * row);
  const auto x = random_vector(n, 7);
  const auto r = random_vector(n, 8);
  auto loss = [&](const std::vector<double>& xs) {
    std::vector<double> y(n);
    cpu::ssmax_forward<double>(xs.data(), pos.data(), y.data(), tokens, row, 2048.0f, 0.1f);
    return weighted_sum(y, r);
  };
  std::vector<double> dx(n);
  cpu::ssmax_backward<double>(r.data(), pos.data(), dx.data(), tokens, row, 2048.0f, 0.1f);
  REQUIRE(scaled_max_error(dx, numeric_gradient(loss, x)) < 1e-6);
  // Tensor API agrees with the template.
  const Tensor dq = ssmax_backward(f32_tensor({tokens, 2, 3}, r), i64_tensor({tokens}, pos), 2048.0f, 0.1f);
  for (std::size_t i = 0; i < n; ++i) CHECK(dq.data<float>()[i] == Approx(dx[i]).margin(1e-6));
}


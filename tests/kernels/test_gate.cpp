// Beam output gate y = o * sigmoid(gate + bias[head]): finite-difference gradients in double,
// head broadcast of the bias, saturation, d_bias accumulation and bf16-vs-fp32 agreement.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/gate.hpp"
#include "kernels/ops/gate.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

Tensor gate_test_tensor(Shape shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  for (std::size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = static_cast<float>(values[i]);
  return t;
}

}  // namespace

TEST_CASE("output gate: gradients of o, gate and bias match finite differences in double", "[gate]") {
  const std::int64_t rows = 3, heads = 2, dim = 3;
  const std::size_t n = static_cast<std::size_t>(rows * heads * dim);
  const auto o = random_vector(n, 11);
  const auto gate = random_vector(n, 12, 2.0);
  const auto bias = random_vector(static_cast<std::size_t>(heads), 13);
  const auto r = random_vector(n, 14);
  auto forward = [&](const std::vector<double>& os, const std::vector<double>& gs, const std::vector<double>& bs) {
    std::vector<double> y(n);
    cpu::output_gate_forward<double>(os.data(), gs.data(), bs.data(), y.data(), rows, heads, dim);
    return weighted_sum(y, r);
  };
  std::vector<double> d_o(n), d_gate(n), d_bias(static_cast<std::size_t>(heads), 0.0);
  cpu::output_gate_backward<double>(r.data(), o.data(), gate.data(), bias.data(), d_o.data(), d_gate.data(),
                                    d_bias.data(), rows, heads, dim);
  CHECK(scaled_max_error(d_o, numeric_gradient([&](const auto& x) { return forward(x, gate, bias); }, o)) < 1e-6);
  CHECK(scaled_max_error(d_gate, numeric_gradient([&](const auto& x) { return forward(o, x, bias); }, gate)) < 1e-6);
  CHECK(scaled_max_error(d_bias, numeric_gradient([&](const auto& x) { return forward(o, gate, x); }, bias)) < 1e-6);
}

TEST_CASE("output gate: bias broadcasts per head and the sigmoid saturates without overflow", "[gate]") {
  // 1 row, 2 heads of D = 2; head 0 bias 0 with gate 0 -> factor 1/2; head 1 bias -1000 / +1000.
  const Tensor o = Tensor::from_floats({1, 4}, std::vector<float>{2.0f, -4.0f, 3.0f, 5.0f});
  const Tensor gate = Tensor::from_floats({1, 4}, std::vector<float>{0.0f, 0.0f, 0.0f, 2000.0f});
  const Tensor bias = Tensor::from_floats({2}, std::vector<float>{0.0f, -1000.0f});
  const Tensor y = output_gate_forward(o, gate, bias);
  CHECK(y.data<float>()[0] == 1.0f);
  CHECK(y.data<float>()[1] == -2.0f);
  CHECK(y.data<float>()[2] == 0.0f);  // sigmoid(-1000) underflows to 0, not NaN
  CHECK(y.data<float>()[3] == 5.0f);  // sigmoid(+1000) is 1
}

TEST_CASE("output gate: d_bias accumulates into the caller's tensor", "[gate]") {
  const Tensor o = gate_test_tensor({2, 3, 4}, random_vector(24, 15));  // [B, S, Hq*D], Hq = 2
  const Tensor gate = gate_test_tensor({2, 3, 4}, random_vector(24, 16));
  const Tensor bias = gate_test_tensor({2}, {0.1, -0.2});
  const Tensor dy = gate_test_tensor({2, 3, 4}, random_vector(24, 17));
  Tensor d_bias = Tensor::zeros({2});
  const OutputGateGrads g = output_gate_backward(dy, o, gate, bias, &d_bias);
  double head0 = 0, head1 = 0;
  for (std::int64_t i = 0; i < 24; ++i) ((i % 4) < 2 ? head0 : head1) += g.d_gate.data<float>()[i];
  CHECK(d_bias.data<float>()[0] == Approx(head0).margin(1e-6));
  CHECK(d_bias.data<float>()[1] == Approx(head1).margin(1e-6));
  output_gate_backward(dy, o, gate, bias, &d_bias);
  CHECK(d_bias.data<float>()[0] == Approx(2 * head0).margin(1e-6));
  CHECK(d_bias.data<float>()[1] == Approx(2 * head1).margin(1e-6));
}

TEST_CASE("output gate: rejects mismatched shapes", "[gate]") {
  const Tensor bias = Tensor::zeros({3});
  CHECK_THROWS_AS(output_gate_forward(Tensor::zeros({2, 4}), Tensor::zeros({2, 4}), bias), std::invalid_argument);
  CHECK_THROWS_AS(output_gate_forward(Tensor::zeros({2, 6}), Tensor::zeros({2, 3}), bias), std::invalid_argument);
  Tensor wrong_bias_grad = Tensor::zeros({2});
  CHECK_THROWS_AS(
      output_gate_backward(Tensor::zeros({2, 6}), Tensor::zeros({2, 6}), Tensor::zeros({2, 6}), bias, &wrong_bias_grad),
      std::invalid_argument);
}

TEST_CASE("output gate: d_bias sums each channel over the rows, then a head's channels in lane order", "[gate]") {
  // gate + bias = 0 gives s = 1/2, so with o = 4 each d_gate is exactly dy. Values of mixed
  // magnitudes make every summation order round differently; three rows and 17 channels (more
  // than the 16 lanes) tell the specified order from a chain, from rows of channels, and from a
  // plain chain over the channel sums.
  constexpr std::int64_t rows = 3, dim = 17, n = rows * dim;
  std::vector<float> dy(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float m = std::ldexp(1.0f + static_cast<float>((i * 37) % 101) / 101.0f, static_cast<int>((i * 7) % 29) - 8);
    dy[static_cast<std::size_t>(i)] = i % 3 == 1 ? -m : m;
  }
  const std::vector<float> o(n, 4.0f), gate(n, 0.0f), bias{0.0f};
  std::vector<float> d_o(n), d_gate(n);
  float d_bias = 0.0f;
  cpu::output_gate_backward<float>(dy.data(), o.data(), gate.data(), bias.data(), d_o.data(), d_gate.data(), &d_bias,
                                   rows, 1, dim);
  REQUIRE(d_gate == dy);
  // The specified order, written out: channel sums over rows, then lanes l and l + 16, then the tree.
  std::vector<float> channel(dim, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < dim; ++d)
      channel[static_cast<std::size_t>(d)] += dy[static_cast<std::size_t>(r * dim + d)];
  float lanes[16];
  for (int l = 0; l < 16; ++l) lanes[l] = 0.0f + channel[static_cast<std::size_t>(l)];
  lanes[0] += channel[16];
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  CHECK(d_bias == lanes[0]);
  // The other orders differ on these values, so the check above pins this one.
  float chain = 0.0f, rows_of_channels = 0.0f, channel_chain = 0.0f;
  for (const float x : dy) chain += x;
  for (std::int64_t r = 0; r < rows; ++r) {
    float row = 0.0f;
    for (std::int64_t d = 0; d < dim; ++d) row += dy[static_cast<std::size_t>(r * dim + d)];
    rows_of_channels += row;
  }
  for (const float c : channel) channel_chain += c;
  CHECK(chain != lanes[0]);
  CHECK(rows_of_channels != lanes[0]);
  CHECK(channel_chain != lanes[0]);
}

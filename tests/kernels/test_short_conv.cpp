#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/short_conv.hpp"
#include "kernels/ops/short_conv.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

// Two rows of 9 tokens: row 0 has documents starting at 0 and 4 and a padding token at 7; row 1
// starts inside a document (pos[0] = 2) and has a new document at 5.
const std::vector<std::int64_t> kPositions = {0, 1, 2, 3, 0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 0, 1, 2, 3};
const std::vector<bool> kValid = {true, true, true, true, true, true, true, false, true,
                                  true, true, true, true, true, true, true, true,  true};
constexpr std::int64_t kB = 2, kS = 9;

Tensor positions_tensor() {
  Tensor t = Tensor::empty({kB, kS}, DType::i64);
  std::copy(kPositions.begin(), kPositions.end(), t.data<std::int64_t>());
  return t;
}
Tensor valid_tensor() {
  Tensor t = Tensor::empty({kB, kS}, DType::boolean);
  for (std::size_t i = 0; i < kValid.size(); ++i) t.data<bool>()[i] = kValid[i];
  return t;
}
std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

std::vector<double> run_conv(const std::vector<double>& x, const std::vector<double>& taps, std::int64_t stride,
                             const cpu::ShortConvDims& d) {
  std::vector<double> y(x.size());
  bool valid[kB * kS];
  for (std::size_t i = 0; i < kValid.size(); ++i) valid[i] = kValid[i];
  cpu::short_conv_forward<double>(x.data(), taps.data(), stride, kPositions.data(), valid, y.data(), d, false);
  return y;
}

}  // namespace

TEST_CASE("Static short conv backward matches finite differences for x and the taps", "[short_conv][grad]") {
  const cpu::ShortConvDims d{kB, kS, 3, 2, 4};  // 6 channels in 3 groups of 2
  auto x = random_vector(kB * kS * 6, 1), w = random_vector(3 * 4, 2, 0.5), r = random_vector(kB * kS * 6, 3);
  bool valid[kB * kS];
  for (std::size_t i = 0; i < kValid.size(); ++i) valid[i] = kValid[i];
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  cpu::short_conv_backward<double>(r.data(), x.data(), w.data(), 0, kPositions.data(), valid, dx.data(), dw.data(), d);
  auto loss_x = [&](const std::vector<double>& v) { return weighted_sum(run_conv(v, w, 0, d), r); };
  auto loss_w = [&](const std::vector<double>& v) { return weighted_sum(run_conv(x, v, 0, d), r); };
  CHECK(scaled_max_error(dx, numeric_gradient(loss_x, x)) < 1e-7);
  CHECK(scaled_max_error(dw, numeric_gradient(loss_w, w)) < 1e-7);
  // The padding token's input gets no gradient.
  for (std::int64_t c = 0; c < 6; ++c) CHECK(dx[7 * 6 + c] == 0.0);
}

TEST_CASE("Dynamic short conv backward matches finite differences for x and the taps", "[short_conv][grad]") {
  const cpu::ShortConvDims d{kB, kS, 2, 3, 3};  // 2 heads of 3 channels, width 3
  auto x = random_vector(kB * kS * 6, 4), taps = random_vector(kB * kS * 2 * 3, 5, 0.5),
       r = random_vector(kB * kS * 6, 6);
  bool valid[kB * kS];
  for (std::size_t i = 0; i < kValid.size(); ++i) valid[i] = kValid[i];
  std::vector<double> dx(x.size()), dtaps(taps.size(), 0.0);
  cpu::short_conv_backward<double>(r.data(), x.data(), taps.data(), 6, kPositions.data(), valid, dx.data(),
                                   dtaps.data(), d);
  auto loss_x = [&](const std::vector<double>& v) { return weighted_sum(run_conv(v, taps, 6, d), r); };
  auto loss_t = [&](const std::vector<double>& v) { return weighted_sum(run_conv(x, v, 6, d), r); };
  CHECK(scaled_max_error(dx, numeric_gradient(loss_x, x)) < 1e-7);
  CHECK(scaled_max_error(dtaps, numeric_gradient(loss_t, taps)) < 1e-7);
}

TEST_CASE("Short conv lags stay inside the document and the row", "[short_conv]") {
  // One channel, taps (w0..w3) = (0.5, 0.25, 0.125, 1): hand-computed outputs.
  const std::vector<double> w = {0.5, 0.25, 0.125, 1.0};
  std::vector<double> x(kB * kS);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  auto y = run_conv(x, w, 0, {kB, kS, 1, 1, 4});
  CHECK(y[0] == 1.5 * x[0]);                                            // document start: only j = 0
  CHECK(y[3] == 1.5 * x[3] + 0.25 * x[2] + 0.125 * x[1] + 1.0 * x[0]);  // all lags inside doc 0
  CHECK(y[4] == 1.5 * x[4]);                                            // new document at 4: no lag into doc 0
  CHECK(y[6] == 1.5 * x[6] + 0.25 * x[5] + 0.125 * x[4]);               // lag 3 would cross the start
  CHECK(y[7] == 0.25 * x[6] + 0.125 * x[5] + 1.0 * x[4]);               // padding input reads 0
  CHECK(y[8] == 1.5 * x[8] + 0.125 * x[6] + 1.0 * x[5]);                // lag 1 is the padding token
  CHECK(y[9] == 1.5 * x[9]);                                            // row 1 starts at pos 2: nothing before the row
  CHECK(y[10] == 1.5 * x[10] + 0.25 * x[9]);
  CHECK(y[14] == 1.5 * x[14]);  // document start in row 1
}

TEST_CASE("Static taps equal dynamic taps that repeat them at every token", "[short_conv]") {
  Tensor pos = positions_tensor(), valid = valid_tensor();
  auto xv = random_vector(kB * kS * 4 * 2, 7), wv = random_vector(4 * 3, 8, 0.3);
  Tensor x = Tensor::from_floats({kB, kS, 4 * 2}, to_floats(xv));
  Tensor w = Tensor::from_floats({4, 3}, to_floats(wv));
  Tensor taps = Tensor::empty({kB, kS, 4, 3});
  for (std::int64_t t = 0; t < kB * kS; ++t) {
    std::copy(w.data<float>(), w.data<float>() + 12, taps.data<float>() + t * 12);
  }
  Tensor ys = short_conv_forward(x, w, pos, valid, Precision::fp32);
  Tensor yd = dynamic_short_conv_forward(x.reshape({kB, kS, 4, 2}), taps, pos, valid, Precision::fp32);
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(ys.data<float>()[i] == yd.data<float>()[i]);

  // Gradients agree too: the static dW is the token sum of the dynamic dτ.
  auto rv = random_vector(x.numel(), 9);
  Tensor dy = Tensor::from_floats(x.shape(), to_floats(rv));
  Tensor dw = Tensor::zeros({4, 3});
  Tensor dxs = short_conv_backward(dy, x, w, pos, valid, &dw);
  DynamicShortConvGrads gd =
      dynamic_short_conv_backward(dy.reshape({kB, kS, 4, 2}), x.reshape({kB, kS, 4, 2}), taps, pos, valid);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    CHECK(dxs.data<float>()[i] == Approx(gd.dx.data<float>()[i]).margin(1e-6));
  for (std::int64_t k = 0; k < 12; ++k) {
    double sum = 0;
    for (std::int64_t t = 0; t < kB * kS; ++t) sum += gd.dtaps.data<float>()[t * 12 + k];
    CHECK(dw.data<float>()[k] == Approx(sum).margin(1e-5));
  }
}

TEST_CASE("Short conv ignores the values of invalid tokens", "[short_conv]") {
  Tensor pos = positions_tensor(), valid = valid_tensor();
  auto xv = random_vector(kB * kS * 4, 10), wv = random_vector(2 * 4, 11, 0.3);
  Tensor x = Tensor::from_floats({kB * kS, 4}, to_floats(xv)), w = Tensor::from_floats({2, 4}, to_floats(wv));
  Tensor y1 = short_conv_forward(x, w, pos, valid, Precision::fp32);
  Tensor x2 = x.clone();
  for (std::int64_t c = 0; c < 4; ++c) x2.data<float>()[7 * 4 + c] = 1000.0f;
  Tensor y2 = short_conv_forward(x2, w, pos, valid, Precision::fp32);
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(y1.data<float>()[i] == y2.data<float>()[i]);
}

TEST_CASE("Short conv in bf16 agrees with fp32 and rounds its output", "[short_conv][bf16]") {
  Tensor pos = positions_tensor(), valid = valid_tensor();
  auto xv = random_vector(kB * kS * 8, 12), wv = random_vector(2 * 4, 13, 0.3),
       tv = random_vector(kB * kS * 2 * 4, 14, 0.3);
  Tensor x = Tensor::from_floats({kB, kS, 8}, to_floats(xv)), w = Tensor::from_floats({2, 4}, to_floats(wv));
  Tensor taps = Tensor::from_floats({kB, kS, 2, 4}, to_floats(tv));
  Tensor xb = x.clone(), wb = w.clone(), tb = taps.clone();
  round_to_bf16_inplace(xb);
  round_to_bf16_inplace(wb);
  round_to_bf16_inplace(tb);
  Tensor y32 = short_conv_forward(x, w, pos, valid, Precision::fp32);
  Tensor y16 = short_conv_forward(xb, wb, pos, valid, Precision::bf16);
  Tensor d32 = dynamic_short_conv_forward(x.reshape({kB, kS, 2, 4}), taps, pos, valid, Precision::fp32);
  Tensor d16 = dynamic_short_conv_forward(xb.reshape({kB, kS, 2, 4}), tb, pos, valid, Precision::bf16);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    CHECK(y16.data<float>()[i] == round_to_bf16(y16.data<float>()[i]));
    CHECK(y16.data<float>()[i] == Approx(y32.data<float>()[i]).epsilon(2e-2).margin(2e-2));
    CHECK(d16.data<float>()[i] == round_to_bf16(d16.data<float>()[i]));
    CHECK(d16.data<float>()[i] == Approx(d32.data<float>()[i]).epsilon(2e-2).margin(2e-2));
  }
}

TEST_CASE("Short conv rejects mismatched shapes", "[short_conv]") {
  Tensor pos = positions_tensor(), valid = valid_tensor();
  CHECK_THROWS_WITH(short_conv_forward(Tensor::zeros({kB * kS, 6}), Tensor::zeros({4, 4}), pos, valid, Precision::fp32),
                    Catch::Contains("short_conv_forward") && Catch::Contains("[G, W]"));
  CHECK_THROWS_WITH(
      short_conv_forward(Tensor::zeros({kB * kS + 1, 6}), Tensor::zeros({3, 4}), pos, valid, Precision::fp32),
      Catch::Contains("tokens"));
  CHECK_THROWS_WITH(dynamic_short_conv_forward(Tensor::zeros({kB, kS, 2, 4}), Tensor::zeros({kB, kS, 3, 4}), pos, valid,
                                               Precision::fp32),
                    Catch::Contains("same Hh"));
}

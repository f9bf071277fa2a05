#include <catch2/catch.hpp>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/bf16_emulation.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/norm.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using namespace atl::testing;

namespace {
std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST_CASE("RMSNorm backward matches finite differences, with and without gamma", "[norm][grad]") {
  const std::int64_t rows = 3, dim = 6;
  auto x = random_vector(rows * dim, 11), w = random_vector(dim, 12), r = random_vector(rows * dim, 13);
  for (bool with_gamma : {true, false}) {
    const double* wp = with_gamma ? w.data() : nullptr;
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>& ws) {
      std::vector<double> y(rows * dim), rstd(rows);
      cpu::rmsnorm_forward<double>(xs.data(), with_gamma ? ws.data() : nullptr, y.data(), rstd.data(), rows, dim,
                                   1e-6, false);
      return weighted_sum(y, r);
    };
    std::vector<double> y(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0.0);
    cpu::rmsnorm_forward<double>(x.data(), wp, y.data(), rstd.data(), rows, dim, 1e-6, false);
    cpu::rmsnorm_backward<double>(r.data(), x.data(), wp, rstd.data(), dx.data(), with_gamma ? dw.data() : nullptr,
                                  rows, dim);
    CHECK(scaled_max_error(dx, numeric_gradient([&](const auto& v) { return loss(v, w); }, x)) < 1e-7);
    if (with_gamma) CHECK(scaled_max_error(dw, numeric_gradient([&](const auto& v) { return loss(x, v); }, w)) < 1e-7);
  }
}

TEST_CASE("RMSNorm output has unit mean square without gamma", "[norm]") {
  auto x = random_vector(16, 14, 3.0);
  auto out = rmsnorm_forward(Tensor::from_floats({2, 8}, to_floats(x)), Tensor(), 1e-6f, Precision::fp32);
  for (int r = 0; r < 2; ++r) {
    double ms = 0;
    for (int i = 0; i < 8; ++i) ms += std::pow(out.y.data<float>()[r * 8 + i], 2);
    CHECK(ms / 8 == Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("RMSNorm in bf16 rounds twice and stays within bf16 of fp32", "[norm][bf16]") {
  auto x = random_vector(64, 15), w = random_vector(32, 16);
  Tensor xt = Tensor::from_floats({2, 32}, to_floats(x)), wt = Tensor::from_floats({32}, to_floats(w));
  auto f32 = rmsnorm_forward(xt, wt, 1e-6f, Precision::fp32);
  auto b16 = rmsnorm_forward(xt, wt, 1e-6f, Precision::bf16);
  for (std::int64_t i = 0; i < 64; ++i) {
    float v = b16.y.data<float>()[i];
    CHECK(v == round_to_bf16(v));  // output is bf16-representable
    CHECK(v == Approx(f32.y.data<float>()[i]).epsilon(1e-2).margin(1e-2));
  }
  // The spec's two roundings, on every element: gamma multiplies the already rounded normalised
  // value. rstd is the kernel's (its exact float), checked here against a double computation.
  int single_rounding_differs = 0;
  for (int r = 0; r < 2; ++r) {
    const float rstd = b16.rstd.data<float>()[r];
    const float* xr = xt.data<float>() + r * 32;
    double mean_square = 0;
    for (int c = 0; c < 32; ++c) mean_square += double(xr[c]) * xr[c] / 32;
    CHECK(rstd == Approx(1 / std::sqrt(mean_square + 1e-6)).epsilon(1e-6));
    for (int c = 0; c < 32; ++c) {
      const float w_c = wt.data<float>()[c];
      CHECK(b16.y.data<float>()[r * 32 + c] == round_to_bf16(w_c * round_to_bf16(xr[c] * rstd)));
      if (round_to_bf16(w_c * (xr[c] * rstd)) != round_to_bf16(w_c * round_to_bf16(xr[c] * rstd))) {
        ++single_rounding_differs;
      }
    }
  }
  CHECK(single_rounding_differs > 0);  // the inputs tell the two roundings from one
}

TEST_CASE("Embedding backward accumulates repeated ids in token order", "[embedding][grad]") {
  const std::int64_t vocab = 5, dim = 3, tokens = 6;
  std::vector<std::int64_t> ids = {1, 3, 1, 0, 4, 1};
  auto table = random_vector(vocab * dim, 17), r = random_vector(tokens * dim, 18);
  auto loss = [&](const std::vector<double>& t) {
    std::vector<double> y(tokens * dim);
    cpu::embedding_forward<double>(t.data(), ids.data(), y.data(), tokens, dim);
    return weighted_sum(y, r);
  };
  std::vector<double> dtable(vocab * dim, 0.0);
  cpu::embedding_backward<double>(r.data(), ids.data(), dtable.data(), tokens, dim);
  CHECK(scaled_max_error(dtable, numeric_gradient(loss, table)) < 1e-7);
  CHECK(dtable[2 * dim] == 0.0);  // id 2 never appears
}

TEST_CASE("Embedding rejects ids outside the table", "[embedding]") {
  Tensor ids = Tensor::zeros({2}, DType::i64);
  ids.data<std::int64_t>()[1] = 9;
  CHECK_THROWS_WITH(embedding_forward(Tensor::zeros({4, 2}), ids), Catch::Contains("token id 9"));
}

TEST_CASE("Embedding of a bf16 table equals the fp32 lookup of the rounded table exactly", "[embedding][bf16]") {
  auto table = random_vector(6 * 4, 19);
  Tensor t32 = Tensor::from_floats({6, 4}, to_floats(table));
  Tensor ids = Tensor::zeros({3}, DType::i64);
  ids.data<std::int64_t>()[0] = 5;
  ids.data<std::int64_t>()[2] = 2;
  Tensor from_bf16 = embedding_forward(t32.to(DType::bf16), ids);
  REQUIRE(from_bf16.shape() == Shape{3, 4});
  const std::int64_t rows[3] = {5, 0, 2};
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 4; ++i) {
      const float expect = static_cast<float>(table[static_cast<std::size_t>(rows[t] * 4 + i)]);
      CHECK(from_bf16.data<float>()[t * 4 + i] == round_to_bf16(expect));            // the row, rounded once
      CHECK(std::abs(from_bf16.data<float>()[t * 4 + i] - expect) <= std::abs(expect) * 0x1p-8f);  // bf16 half ulp
    }
  }
}

TEST_CASE("bf16 emulation points round a double through float, as a float run's, in every kernel", "[norm][bf16]") {
  // maybe_round_bf16 (norms, clips, convs) and round_emulated (GLU, experts, router) on one grid.
  for (const double v : {1.0 + 1e-3, -3.14159, 1e-30, 65504.25}) {
    const double expected = static_cast<double>(round_to_bf16(static_cast<float>(v)));
    CHECK(cpu::maybe_round_bf16<double>(v, true) == expected);
    CHECK(cpu::round_emulated<double>(Precision::bf16, v) == expected);
    CHECK(cpu::maybe_round_bf16<double>(v, false) == v);
  }
}

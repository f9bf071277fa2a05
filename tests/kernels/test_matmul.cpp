#include <catch2/catch.hpp>

#include "kernels/cpu/gemm.hpp"
#include "kernels/ops/matmul.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using namespace atl::testing;

TEST_CASE("linear forward equals a naive triple loop", "[matmul]") {
  const std::int64_t rows = 5, in = 7, out = 3;
  auto x = random_vector(rows * in, 1), w = random_vector(out * in, 2);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end());
  Tensor y = linear_forward(Tensor::from_floats({rows, in}, xf), Tensor::from_floats({out, in}, wf));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (std::int64_t i = 0; i < in; ++i) ref += x[r * in + i] * w[o * in + i];
      CHECK(y.data<float>()[r * out + o] == Approx(ref).epsilon(1e-5));
    }
  }
}

TEST_CASE("linear backward matches finite differences in double", "[matmul][grad]") {
  const std::int64_t rows = 4, in = 5, out = 3;
  auto x = random_vector(rows * in, 3), w = random_vector(out * in, 4), r = random_vector(rows * out, 5);
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& ws) {
    std::vector<double> y(rows * out);
    cpu::linear_forward<double>(xs.data(), ws.data(), y.data(), rows, in, out);
    return weighted_sum(y, r);
  };
  std::vector<double> dx(rows * in), dw(out * in, 0.0);
  cpu::linear_backward<double>(x.data(), w.data(), r.data(), dx.data(), dw.data(), rows, in, out);
  CHECK(scaled_max_error(dx, numeric_gradient([&](const auto& v) { return loss(v, w); }, x)) < 1e-7);
  CHECK(scaled_max_error(dw, numeric_gradient([&](const auto& v) { return loss(x, v); }, w)) < 1e-7);
}

TEST_CASE("linear with bf16 operands agrees with fp32 to bf16 precision", "[matmul][bf16]") {
  const std::int64_t rows = 8, in = 64, out = 16;
  auto x = random_vector(rows * in, 6), w = random_vector(out * in, 7, 0.1);
  Tensor xt = Tensor::from_floats({rows, in}, std::vector<float>(x.begin(), x.end()));
  Tensor wt = Tensor::from_floats({out, in}, std::vector<float>(w.begin(), w.end()));
  Tensor y32 = linear_forward(xt, wt);
  Tensor y16 = linear_forward(xt.to(DType::bf16), wt.to(DType::bf16));
  double max_err = 0, max_ref = 0;
  for (std::int64_t i = 0; i < y32.numel(); ++i) {
    max_err = atl::testing::worst_of(max_err, static_cast<double>(std::abs(y32.data<float>()[i] - y16.data<float>()[i])));
    max_ref = atl::testing::worst_of(max_ref, static_cast<double>(std::abs(y32.data<float>()[i])));
  }
  CHECK(max_err / max_ref < 2e-2);
  CHECK(max_err > 0);  // the bf16 path really rounded its operands
}

TEST_CASE("linear rejects mismatched shapes with a message", "[matmul]") {
  CHECK_THROWS_WITH(linear_forward(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})), Catch::Contains("linear_forward"));
}

TEST_CASE("matmul backward matches finite differences through the Tensor API", "[matmul][grad]") {
  // fp32 through the Tensor API: a directional check with a stated tolerance.
  const std::int64_t m = 3, k = 4, n = 5;
  auto a = random_vector(m * k, 41), b = random_vector(k * n, 42), r = random_vector(m * n, 43);
  auto loss = [&](const std::vector<double>& av, const std::vector<double>& bv) {
    Tensor c = matmul(Tensor::from_floats({m, k}, std::vector<float>(av.begin(), av.end())),
                      Tensor::from_floats({k, n}, std::vector<float>(bv.begin(), bv.end())));
    double s = 0;
    for (std::int64_t i = 0; i < m * n; ++i) s += c.data<float>()[i] * r[static_cast<std::size_t>(i)];
    return s;
  };
  Tensor db = Tensor::zeros({k, n});
  Tensor da = matmul_backward(Tensor::from_floats({m, k}, std::vector<float>(a.begin(), a.end())),
                              Tensor::from_floats({k, n}, std::vector<float>(b.begin(), b.end())),
                              Tensor::from_floats({m, n}, std::vector<float>(r.begin(), r.end())), &db);
  auto num_a = numeric_gradient([&](const auto& v) { return loss(v, b); }, a, 1e-2);
  auto num_b = numeric_gradient([&](const auto& v) { return loss(a, v); }, b, 1e-2);
  CHECK(scaled_max_error(std::vector<double>(da.span<float>().begin(), da.span<float>().end()), num_a) < 1e-4);
  CHECK(scaled_max_error(std::vector<double>(db.span<float>().begin(), db.span<float>().end()), num_b) < 1e-4);
}

// Precision bf16's backward of a bulk projection reads the incoming gradient as bf16 (what autograd
// holds for a bf16 output): both products match a double reference on the rounded gradient to
// fp32 accumulation error, and miss the one on the unrounded gradient by far more than that.
TEST_CASE("linear backward with bf16 operands reads the gradient as bf16", "[matmul][bf16]") {
  const std::int64_t rows = 6, in = 10, out = 20;
  auto bf16_values = [](std::size_t n, std::uint64_t seed) {
    std::vector<float> v;
    for (double d : random_vector(n, seed)) v.push_back(round_to_bf16(static_cast<float>(d)));
    return v;
  };
  const std::vector<float> x = bf16_values(rows * in, 11), w = bf16_values(out * in, 12);
  std::vector<float> dy = bf16_values(rows * out, 13), dy_rounded = dy;
  for (float& g : dy) g *= 1.0f + 0x1p-11f;  // between two bf16 values: rounding moves it back
  for (std::size_t i = 0; i < dy.size(); ++i) REQUIRE(round_to_bf16(dy[i]) == dy_rounded[i]);
  Tensor dw = Tensor::zeros({out, in});
  const Tensor dx = linear_backward(Tensor::from_floats({rows, in}, x), Tensor::from_floats({out, in}, w),
                                    Tensor::from_floats({rows, out}, dy), &dw, Precision::bf16);
  // Largest |got - sum_k term(i, j, k)| / (depth * 2^-24 * sum |term|): at most 1 for one fp32 chain.
  auto chain_error = [](const float* got, std::int64_t m, std::int64_t n, std::int64_t depth, auto term) {
    double ratio = 0;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (std::int64_t k = 0; k < depth; ++k) {
          ref += term(i, j, k);
          mag += std::abs(term(i, j, k));
        }
        const double bound = static_cast<double>(depth) * 0x1p-24 * mag;
        ratio = atl::testing::worst_of(ratio, std::abs(got[i * n + j] - ref) / bound);
      }
    }
    return ratio;
  };
  auto worst = [&](const std::vector<float>& g) {  // over dx = g w and dw = g^T x
    return std::max(chain_error(dx.data<float>(), rows, in, out,
                                [&](auto r, auto i, auto o) { return double(g[r * out + o]) * w[o * in + i]; }),
                    chain_error(dw.data<float>(), out, in, rows,
                                [&](auto o, auto i, auto r) { return double(g[r * out + o]) * x[r * in + i]; }));
  };
  CHECK(worst(dy_rounded) <= 1.0);
  CHECK(worst(dy) > 4.0);
}

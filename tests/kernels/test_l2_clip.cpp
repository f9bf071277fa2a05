#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/l2_clip.hpp"
#include "kernels/ops/l2_clip.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using namespace atl::testing;

namespace {
std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

std::vector<double> clip(const std::vector<double>& x, const double* scale, double radius, std::int64_t rows,
                         std::int64_t dim) {
  std::vector<double> y(x.size()), norms(static_cast<std::size_t>(rows));
  cpu::l2_clip_forward<double>(x.data(), scale, radius, y.data(), norms.data(), rows, dim, false);
  return y;
}
}  // namespace

TEST_CASE("L2 clip backward matches finite differences for x and the scale", "[l2_clip][grad]") {
  const std::int64_t rows = 6, dim = 5;
  // Rows of very different norms: radius 2 clips some of them and leaves others alone.
  auto x = random_vector(rows * dim, 1), s = random_vector(dim, 2, 0.3), r = random_vector(rows * dim, 3);
  for (std::int64_t i = 0; i < rows * dim; ++i) x[static_cast<std::size_t>(i)] *= 0.3 + (i / dim);
  for (auto& v : s) v += 1.0;
  const double radius = 2.0;
  std::vector<double> y(x.size()), norms(rows);
  cpu::l2_clip_forward<double>(x.data(), s.data(), radius, y.data(), norms.data(), rows, dim, false);
  int clipped = 0;
  for (double n : norms) clipped += n > radius;
  REQUIRE(clipped > 0);
  REQUIRE(clipped < rows);
  for (bool with_scale : {true, false}) {
    const double* sp = with_scale ? s.data() : nullptr;
    std::vector<double> n2(rows), y2(x.size()), dx(x.size()), ds(dim, 0.0);
    cpu::l2_clip_forward<double>(x.data(), sp, radius, y2.data(), n2.data(), rows, dim, false);
    cpu::l2_clip_backward<double>(r.data(), x.data(), sp, radius, n2.data(), dx.data(),
                                  with_scale ? ds.data() : nullptr, rows, dim);
    auto loss_x = [&](const std::vector<double>& v) { return weighted_sum(clip(v, sp, radius, rows, dim), r); };
    CHECK(scaled_max_error(dx, numeric_gradient(loss_x, x)) < 1e-7);
    if (with_scale) {
      auto loss_s = [&](const std::vector<double>& v) { return weighted_sum(clip(x, v.data(), radius, rows, dim), r); };
      CHECK(scaled_max_error(ds, numeric_gradient(loss_s, s)) < 1e-7);
    }
  }
}

TEST_CASE("L2 clip caps the norm at the radius and leaves short vectors alone", "[l2_clip]") {
  Tensor x = Tensor::from_floats({2, 4}, std::vector<float>{3, 4, 0, 0, 0.1f, 0.2f, 0.2f, 0.1f});
  L2ClipForward f = l2_clip_forward(x, Tensor(), 2.0f, Precision::fp32);
  CHECK(f.norms.data<float>()[0] == 5.0f);
  CHECK(f.y.data<float>()[0] == Approx(1.2f));
  CHECK(f.y.data<float>()[1] == Approx(1.6f));
  for (int i = 4; i < 8; ++i) CHECK(f.y.data<float>()[i] == x.data<float>()[i]);
  // The scale applies before the clip: scale 0.1 brings row 0 under the radius.
  Tensor scale = Tensor::full({4}, 0.1f);
  L2ClipForward g = l2_clip_forward(x, scale, 2.0f, Precision::fp32);
  CHECK(g.y.data<float>()[0] == Approx(0.3f));
  // An all-zero row stays zero (no division by zero).
  L2ClipForward z = l2_clip_forward(Tensor::zeros({1, 4}), Tensor(), 1.0f, Precision::fp32);
  for (float v : z.y.span<float>()) CHECK(v == 0.0f);
}

TEST_CASE("L2 clip in bf16 agrees with fp32 and rounds its output", "[l2_clip][bf16]") {
  auto xv = random_vector(8 * 16, 4, 2.0), sv = random_vector(16, 5, 0.2);
  for (auto& v : sv) v += 1.0;
  Tensor x = Tensor::from_floats({8, 16}, to_floats(xv)), s = Tensor::from_floats({16}, to_floats(sv));
  Tensor xb = x.clone();
  round_to_bf16_inplace(xb);
  L2ClipForward f32 = l2_clip_forward(x, s, 4.0f, Precision::fp32);
  L2ClipForward f16 = l2_clip_forward(xb, s, 4.0f, Precision::bf16);  // the scale is an fp32 island
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    CHECK(f16.y.data<float>()[i] == round_to_bf16(f16.y.data<float>()[i]));
    CHECK(f16.y.data<float>()[i] == Approx(f32.y.data<float>()[i]).epsilon(2e-2).margin(2e-2));
  }
}

TEST_CASE("L2 clip rejects a wrong scale", "[l2_clip]") {
  CHECK_THROWS_WITH(l2_clip_forward(Tensor::zeros({2, 4}), Tensor::zeros({3}), 1.0f, Precision::fp32),
                    Catch::Contains("l2_clip_forward") && Catch::Contains("scale must be [4]"));
  CHECK_THROWS_WITH(l2_clip_forward(Tensor::zeros({2, 4}), Tensor(), 0.0f, Precision::fp32), Catch::Contains("radius"));
}

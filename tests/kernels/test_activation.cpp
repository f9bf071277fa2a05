#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/ops/activation.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/isa_levels.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

Tensor tensor_of(Shape shape, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_floats(std::move(shape), f);
}

// Small betas so the tanh caps actually bend inside the sampled range.
GluConfig config(GluActivation act, GluLayout layout) { return GluConfig{act, layout, 1.5f, 2.0f}; }

}  // namespace

TEST_CASE("glu packed backward matches finite differences", "[activation]") {
  const std::int64_t rows = 3, inter = 5;
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    for (auto layout : {GluLayout::concatenated, GluLayout::interleaved}) {
      const GluConfig cfg = config(act, layout);
      const auto gate_up = random_vector(rows * 2 * inter, 11, 2.0, "gate_up");
      const auto r = random_vector(rows * inter, 12, 1.0, "r");
      auto loss = [&](const std::vector<double>& gu) {
        std::vector<double> out(rows * inter);
        cpu::glu_forward(gu.data(), rows, inter, cfg, Precision::fp32, out.data());
        return weighted_sum(out, r);
      };
      std::vector<double> analytic(gate_up.size());
      cpu::glu_backward(r.data(), gate_up.data(), rows, inter, cfg, analytic.data());
      CHECK(scaled_max_error(analytic, numeric_gradient(loss, gate_up)) < 1e-6);
    }
  }
}

TEST_CASE("glu split backward matches finite differences", "[activation]") {
  const std::int64_t n = 12;
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    const GluConfig cfg = config(act, GluLayout::concatenated);
    const auto g = random_vector(n, 21, 2.0, "g");
    const auto u = random_vector(n, 22, 2.0, "u");
    const auto r = random_vector(n, 23, 1.0, "r");
    auto out_of = [&](const std::vector<double>& gg, const std::vector<double>& uu) {
      std::vector<double> out(n);
      cpu::glu_forward_split(gg.data(), uu.data(), n, cfg, Precision::fp32, out.data());
      return weighted_sum(out, r);
    };
    std::vector<double> dg(n), du(n);
    cpu::glu_backward_split(r.data(), g.data(), u.data(), n, cfg, dg.data(), du.data());
    CHECK(scaled_max_error(dg, numeric_gradient([&](const std::vector<double>& x) { return out_of(x, u); }, g)) < 1e-6);
    CHECK(scaled_max_error(du, numeric_gradient([&](const std::vector<double>& x) { return out_of(g, x); }, u)) < 1e-6);
  }
}

TEST_CASE("glu values follow the formulas and the layouts", "[activation]") {
  // swiglu(1, 2) = 1 * sigmoid(1) * 2
  const double s1 = 1.0 / (1.0 + std::exp(-1.0));
  CHECK(cpu::glu_value(GluConfig{}, 1.0, 2.0) == Approx(2.0 * s1).epsilon(1e-14));
  // situ(g=3, u=-50; βg=4, βu=25) = 4 tanh(3/4) sigmoid(3) * 25 tanh(-2): the sigmoid sees the raw gate.
  GluConfig situ{GluActivation::situ, GluLayout::concatenated, 4.0f, 25.0f};
  const double expect = 4 * std::tanh(0.75) / (1 + std::exp(-3.0)) * 25 * std::tanh(-2.0);
  CHECK(cpu::glu_value(situ, 3.0, -50.0) == Approx(expect).epsilon(1e-12));
  // Caps: |situ| < βg·βu whatever the inputs.
  CHECK(std::abs(cpu::glu_value(situ, 1e4, 1e4)) <= 100.0);

  // The same (g, u) pairs packed both ways give the same output.
  const std::vector<float> concat = {1.f, -2.f, 0.5f, 3.f, -1.f, 2.f};      // g = 1,-2,.5  u = 3,-1,2
  const std::vector<float> interleaved = {1.f, 3.f, -2.f, -1.f, 0.5f, 2.f};  // g0,u0,g1,u1,g2,u2
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    Tensor a = glu_forward(Tensor::from_floats({1, 6}, concat), GluConfig{act, GluLayout::concatenated, 4.f, 25.f},
                           Precision::fp32);
    Tensor b = glu_forward(Tensor::from_floats({1, 6}, interleaved),
                           GluConfig{act, GluLayout::interleaved, 4.f, 25.f}, Precision::fp32);
    Tensor c = glu_forward(Tensor::from_floats({3}, {concat.data(), 3}), Tensor::from_floats({3}, {concat.data() + 3, 3}),
                           GluConfig{act, GluLayout::concatenated, 4.f, 25.f}, Precision::fp32);
    REQUIRE(a.shape() == Shape{1, 3});
    for (int i = 0; i < 3; ++i) {
      CHECK(a.data<float>()[i] == b.data<float>()[i]);
      CHECK(a.data<float>()[i] == c.data<float>()[i]);
    }
  }
}

TEST_CASE("glu Tensor backward agrees with the double kernel and the split formulas", "[activation]") {
  const auto gu = random_vector(2 * 8, 31, 2.0, "gu");
  const auto r = random_vector(2 * 4, 32, 1.0, "r");
  const GluConfig cfg{GluActivation::situ, GluLayout::interleaved, 4.f, 25.f};
  Tensor d = glu_backward(tensor_of({2, 4}, r), tensor_of({2, 8}, gu), cfg);
  // The reference: the double kernel (checked by finite differences above) on the same float inputs.
  std::vector<double> gd(gu.size()), rd(r.size()), expect(16);
  for (std::size_t i = 0; i < gu.size(); ++i) gd[i] = static_cast<float>(gu[i]);
  for (std::size_t i = 0; i < r.size(); ++i) rd[i] = static_cast<float>(r[i]);
  cpu::glu_backward(rd.data(), gd.data(), 2, 4, cfg, expect.data());
  for (int i = 0; i < 16; ++i) CHECK(d.data<float>()[i] == Approx(expect[i]).epsilon(1e-5).margin(1e-6));

  // swiglu split form: d_up = silu(g), d_gate = u * silu'(g).
  Tensor g = Tensor::from_floats({2}, std::vector<float>{0.5f, -1.0f});
  Tensor u = Tensor::from_floats({2}, std::vector<float>{2.0f, 3.0f});
  GluSplitGrads sg = swiglu_backward(Tensor::full({2}, 1.0f), g, u);
  for (int i = 0; i < 2; ++i) {
    const double gi = g.data<float>()[i], ui = u.data<float>()[i], s = 1 / (1 + std::exp(-gi));
    CHECK(sg.d_up.data<float>()[i] == Approx(gi * s).epsilon(1e-6));
    CHECK(sg.d_gate.data<float>()[i] == Approx(ui * (s + gi * s * (1 - s))).epsilon(1e-6));
  }
}

TEST_CASE("glu bf16 rounds once and agrees with fp32", "[activation]") {
  const std::int64_t rows = 4, inter = 16;
  const auto v = random_vector(rows * 2 * inter, 41, 2.0, "bf16");
  Tensor exact = tensor_of({rows, 2 * inter}, v);
  Tensor rounded = exact.clone();
  round_to_bf16_inplace(rounded);
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    const GluConfig cfg{act, GluLayout::concatenated, 4.f, 25.f};
    Tensor ref = glu_forward(exact, cfg, Precision::fp32);
    Tensor low = glu_forward(rounded, cfg, Precision::bf16);
    // Rounded once: bf16(fp32 result on the rounded inputs).
    Tensor unrounded = glu_forward(rounded, cfg, Precision::fp32);
    double max_ref = 0;
    for (float x : ref.span<float>()) max_ref = std::max(max_ref, static_cast<double>(std::abs(x)));
    for (std::int64_t i = 0; i < rows * inter; ++i) {
      CHECK(low.data<float>()[i] == round_to_bf16(unrounded.data<float>()[i]));
      CHECK(std::abs(low.data<float>()[i] - ref.data<float>()[i]) <= 2e-2 * max_ref);
    }
  }
  // Split form rounds the same way.
  Tensor g = rounded.slice_rows(0, 2).clone(), u = rounded.slice_rows(2, 4).clone();
  Tensor low = swiglu_forward(g, u, Precision::bf16), high = swiglu_forward(g, u, Precision::fp32);
  for (std::int64_t i = 0; i < low.numel(); ++i) CHECK(low.data<float>()[i] == round_to_bf16(high.data<float>()[i]));
}

TEST_CASE("glu rejects bad shapes", "[activation]") {
  CHECK_THROWS_AS(glu_forward(Tensor::zeros({2, 5}), GluConfig{}, Precision::fp32), std::invalid_argument);
  CHECK_THROWS_AS(glu_backward(Tensor::zeros({2, 3}), Tensor::zeros({2, 4}), GluConfig{}), std::invalid_argument);
  CHECK_THROWS_AS(swiglu_forward(Tensor::zeros({2, 3}), Tensor::zeros({2, 4}), Precision::fp32),
                  std::invalid_argument);
  CHECK_THROWS_AS(glu_forward(Tensor::zeros({2, 4}, DType::i32), GluConfig{}, Precision::fp32), std::invalid_argument);
}

TEST_CASE("glu float rows give the scalar formulas' bits at every instruction-set level", "[activation][isa]") {
  // The vectorized row loops (glu_rows.cpp: terms, values, partials and the bf16 rounding in one
  // loop) against GluRowTerms and glu_value_given / glu_partials one element at a time, rounded
  // afterwards; 37 per row leaves a remainder after every vector width. Both sides share the
  // formula templates, so this checks the loops, strides and rounding; the finite-difference
  // tests check the formulas.
  const std::int64_t rows = 3, inter = 37;
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    for (auto layout : {GluLayout::concatenated, GluLayout::interleaved}) {
      INFO("situ " << (act == GluActivation::situ) << " interleaved " << (layout == GluLayout::interleaved));
      const GluConfig cfg = config(act, layout);
      const auto gu_d = random_vector(rows * 2 * inter, 51, 3.0, "rows");
      const auto d_d = random_vector(rows * inter, 52, 1.0, "d");
      const std::vector<float> gu(gu_d.begin(), gu_d.end()), d(d_d.begin(), d_d.end());
      const cpu::GluView v = cpu::packed_view(layout, inter);
      std::vector<float> want_out(rows * inter), want_d(gu.size());
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < inter; ++i) {
          const std::int64_t gi = r * v.row_stride + v.g_offset + i * v.elem_stride;
          const std::int64_t ui = r * v.row_stride + v.u_offset + i * v.elem_stride;
          cpu::GluRowTerms<float> t(1);
          t.compute(cfg, &gu[gi], &gu[ui], 1, 1);
          want_out[r * inter + i] = cpu::glu_value_given(cfg, gu[gi], gu[ui], t.sig[0], t.tg[0], t.tu[0]);
          float d_dg, d_du;
          cpu::glu_partials(cfg, gu[gi], gu[ui], t.sig[0], t.tg[0], t.tu[0], d_dg, d_du);
          want_d[gi] = d[r * inter + i] * d_dg;
          want_d[ui] = d[r * inter + i] * d_du;
        }
      std::vector<float> want_rounded(want_out);
      for (float& x : want_rounded) x = round_to_bf16(x);
      REQUIRE(want_rounded != want_out);  // the bf16 check below is not the fp32 one again
      testing::for_each_isa_level([&] {
        std::vector<float> out(want_out.size()), rounded(want_out.size()), dgu(want_d.size());
        cpu::glu_forward(gu.data(), rows, inter, cfg, Precision::fp32, out.data());
        cpu::glu_forward(gu.data(), rows, inter, cfg, Precision::bf16, rounded.data());
        cpu::glu_backward(d.data(), gu.data(), rows, inter, cfg, dgu.data());
        CHECK(std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(rounded.data(), want_rounded.data(), rounded.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(dgu.data(), want_d.data(), dgu.size() * sizeof(float)) == 0);
        if (layout == GluLayout::concatenated) {  // the two-tensor form of the same rows
          for (std::int64_t r = 0; r < rows; ++r) {
            const float* gate = gu.data() + r * 2 * inter;
            std::vector<float> split(inter), d_gate(inter), d_up(inter);
            cpu::glu_forward_split(gate, gate + inter, inter, cfg, Precision::bf16, split.data());
            cpu::glu_backward_split(d.data() + r * inter, gate, gate + inter, inter, cfg, d_gate.data(), d_up.data());
            CHECK(std::memcmp(split.data(), want_rounded.data() + r * inter, inter * sizeof(float)) == 0);
            CHECK(std::memcmp(d_gate.data(), want_d.data() + r * 2 * inter, inter * sizeof(float)) == 0);
            CHECK(std::memcmp(d_up.data(), want_d.data() + r * 2 * inter + inter, inter * sizeof(float)) == 0);
          }
        }
      });
    }
  }
}

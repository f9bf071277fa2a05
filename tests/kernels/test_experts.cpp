#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/experts.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/rng.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/same_bits.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

struct Problem {
  cpu::ExpertsDims d;
  std::vector<double> x, gate_up, down, weights;
  std::vector<std::int32_t> indices;
  std::vector<char> mask;  // char, not bool, so .data() is a pointer
};

// K distinct experts per token (a random permutation prefix); token 2 masked out.
Problem make_problem(std::int64_t tokens, std::int64_t k, std::int64_t experts, std::int64_t hidden,
                     std::int64_t inter, std::uint64_t seed) {
  Problem p;
  p.d = {tokens, k, experts, hidden, inter};
  p.x = random_vector(tokens * hidden, seed, 1.0, "x");
  p.gate_up = random_vector(experts * hidden * 2 * inter, seed, 0.5, "gate_up");
  p.down = random_vector(experts * inter * hidden, seed, 0.5, "down");
  p.weights = random_vector(tokens * k, seed, 0.5, "weights");
  CounterRng rng(seed, "route");
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> perm(experts);
    std::iota(perm.begin(), perm.end(), 0);
    for (std::int64_t i = experts - 1; i > 0; --i) {
      std::swap(perm[i], perm[rng.below(t * experts + i, i + 1)]);
    }
    for (std::int64_t j = 0; j < k; ++j) p.indices.push_back(perm[j]);
  }
  for (std::int64_t t = 0; t < tokens; ++t) p.mask.push_back(t == 2 ? 0 : 1);
  return p;
}

const bool* mask_ptr(const Problem& p) { return reinterpret_cast<const bool*>(p.mask.data()); }

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Independent reference: each valid token visits its K experts one by one (no dispatch, no gemm),
// summing in ascending expert id, with the same bf16 rounding points as the kernel.
template <class T>
std::vector<T> reference_forward(const std::vector<T>& x, const std::vector<T>& gate_up, const std::vector<T>& down,
                                 const std::vector<std::int32_t>& indices, const std::vector<T>& weights,
                                 const std::vector<char>& mask, const cpu::ExpertsDims& d, const ExpertsConfig& cfg) {
  const std::int64_t H = d.hidden, I = d.inter, K = d.top_k;
  const Precision p = cfg.precision;
  std::vector<T> out(d.tokens * H, T(0));
  for (std::int64_t t = 0; t < d.tokens; ++t) {
    if (!mask[t]) continue;
    std::vector<std::int64_t> slots(K);
    std::iota(slots.begin(), slots.end(), 0);
    std::sort(slots.begin(), slots.end(), [&](auto a, auto b) { return indices[t * K + a] < indices[t * K + b]; });
    std::vector<T> acc(H, T(0));
    for (std::int64_t j : slots) {
      const std::int64_t e = indices[t * K + j];
      const T w = weights[t * K + j];
      std::vector<T> h(2 * I, T(0)), a(I);
      for (std::int64_t o = 0; o < 2 * I; ++o) {
        for (std::int64_t c = 0; c < H; ++c) h[o] += x[t * H + c] * gate_up[(e * H + c) * 2 * I + o];
        h[o] = cpu::round_emulated(p, h[o]);
      }
      for (std::int64_t i = 0; i < I; ++i) {
        const bool inter_layout = cfg.layout == GluLayout::interleaved;
        const T g = inter_layout ? h[2 * i] : h[i], u = inter_layout ? h[2 * i + 1] : h[I + i];
        a[i] = cpu::round_emulated(p, cpu::glu_value(cfg.glu(), g, u));
        if (!cfg.weight_after_down) a[i] = cpu::round_emulated(p, a[i] * w);
      }
      for (std::int64_t c = 0; c < H; ++c) {
        T y = 0;
        for (std::int64_t i = 0; i < I; ++i) y += a[i] * down[(e * I + i) * H + c];
        y = cpu::round_emulated(p, y);  // a bulk linear output (MODELS.md §10.1.12)
        acc[c] += cfg.weight_after_down ? cpu::round_emulated(p, w * y) : y;
      }
    }
    for (std::int64_t c = 0; c < H; ++c) out[t * H + c] = cpu::round_emulated(p, acc[c]);
  }
  return out;
}

// Runs the dispatch kernel through its cpu template.
template <class T>
std::vector<T> kernel_forward(const std::vector<T>& x, const std::vector<T>& gate_up, const std::vector<T>& down,
                              const std::vector<std::int32_t>& indices, const std::vector<T>& weights, const bool* mask,
                              const cpu::ExpertsDims& d, const ExpertsConfig& cfg) {
  const cpu::DispatchPlan plan = cpu::plan_dispatch(indices.data(), mask, d);
  const std::int64_t rows = static_cast<std::int64_t>(plan.row_pair.size());
  std::vector<T> h(rows * 2 * d.inter), a(rows * d.inter), y(rows * d.hidden), out(d.tokens * d.hidden);
  cpu::experts_forward(x.data(), gate_up.data(), down.data(), weights.data(), cpu::view_of(plan, indices.data()), d,
                       cfg, h.data(), a.data(), y.data(), out.data());
  return out;
}

Tensor tensor_of(Shape shape, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_floats(std::move(shape), f);
}

Tensor indices_tensor(const Problem& p) {
  Tensor t = Tensor::empty({p.d.tokens, p.d.top_k}, DType::i32);
  std::copy(p.indices.begin(), p.indices.end(), t.data<std::int32_t>());
  return t;
}

Tensor mask_tensor(const Problem& p) {
  Tensor t = Tensor::empty({p.d.tokens}, DType::boolean);
  for (std::int64_t i = 0; i < p.d.tokens; ++i) t.data<bool>()[i] = p.mask[i] != 0;
  return t;
}

}  // namespace

TEST_CASE("dispatch plan groups pairs by expert, stably, and skips masked tokens", "[experts]") {
  const std::vector<std::int32_t> idx = {2, 0, 0, 1, 2, 1, 0, 2};  // 4 tokens, K = 2
  const bool mask[4] = {true, true, false, true};
  const cpu::ExpertsDims d{4, 2, 3, 1, 1};
  cpu::DispatchPlan plan = cpu::plan_dispatch(idx.data(), mask, d);
  CHECK(plan.expert_offsets == std::vector<std::int64_t>{0, 3, 4, 6});
  CHECK(plan.row_pair == std::vector<std::int64_t>{1, 2, 6, 3, 0, 7});
  CHECK(plan.pair_row == std::vector<std::int64_t>{4, 0, 1, 3, -1, -1, 2, 5});
  const std::vector<std::int32_t> bad = {0, 3};
  CHECK_THROWS_AS(cpu::plan_dispatch(bad.data(), nullptr, cpu::ExpertsDims{1, 2, 3, 1, 1}), std::invalid_argument);
}

TEST_CASE("experts dispatch forward equals the per-token reference", "[experts]") {
  const Problem p = make_problem(7, 3, 5, 6, 4, 81);
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    for (auto layout : {GluLayout::concatenated, GluLayout::interleaved}) {
      for (bool after : {false, true}) {
        ExpertsConfig cfg;
        cfg.activation = act;
        cfg.layout = layout;
        cfg.weight_after_down = after;
        cfg.beta_gate = 1.5f;
        cfg.beta_up = 2.0f;
        // Double: only the summation order differs.
        auto ref = reference_forward(p.x, p.gate_up, p.down, p.indices, p.weights, p.mask, p.d, cfg);
        auto got = kernel_forward(p.x, p.gate_up, p.down, p.indices, p.weights, mask_ptr(p), p.d, cfg);
        CHECK(scaled_max_error(got, ref) < 1e-12);
        // Float through the Tensor API.
        ExpertsForward f = experts_forward(tensor_of({7, 6}, p.x), tensor_of({5, 6, 8}, p.gate_up),
                                           tensor_of({5, 4, 6}, p.down), indices_tensor(p),
                                           tensor_of({7, 3}, p.weights), mask_tensor(p), cfg);
        std::vector<double> got_f(f.out.span<float>().begin(), f.out.span<float>().end());
        CHECK(scaled_max_error(got_f, ref) < 1e-5);
      }
    }
  }
}

TEST_CASE("masked tokens are routed but not dispatched: exactly zero output and no gradient", "[experts]") {
  Problem p = make_problem(5, 2, 4, 3, 2, 91);
  ExpertsConfig cfg;
  ExpertsForward f = experts_forward(tensor_of({5, 3}, p.x), tensor_of({4, 3, 4}, p.gate_up), tensor_of({4, 2, 3}, p.down),
                                     indices_tensor(p), tensor_of({5, 2}, p.weights), mask_tensor(p), cfg);
  CHECK(f.saved.dispatch.row_pair.numel() == 4 * 2);  // 4 valid tokens x K
  for (std::int64_t c = 0; c < 3; ++c) CHECK(f.out.data<float>()[2 * 3 + c] == 0.0f);
  Tensor d_gu = Tensor::zeros({4, 3, 4}), d_down = Tensor::zeros({4, 2, 3});
  ExpertsGrads g = experts_backward(Tensor::full({5, 3}, 1.0f), f.saved, tensor_of({4, 3, 4}, p.gate_up),
                                    tensor_of({4, 2, 3}, p.down), cfg, d_gu, d_down);
  for (std::int64_t c = 0; c < 3; ++c) CHECK(g.dx.data<float>()[2 * 3 + c] == 0.0f);
  for (std::int64_t j = 0; j < 2; ++j) CHECK(g.d_weights.data<float>()[2 * 2 + j] == 0.0f);
  // Without a mask the token contributes.
  ExpertsForward all = experts_forward(tensor_of({5, 3}, p.x), tensor_of({4, 3, 4}, p.gate_up),
                                       tensor_of({4, 2, 3}, p.down), indices_tensor(p), tensor_of({5, 2}, p.weights),
                                       Tensor(), cfg);
  double mag = 0;
  for (std::int64_t c = 0; c < 3; ++c) mag += std::abs(all.out.data<float>()[2 * 3 + c]);
  CHECK(mag > 0);
  for (std::int64_t i = 0; i < 5 * 3; ++i) {
    if (i / 3 != 2) CHECK(all.out.data<float>()[i] == f.out.data<float>()[i]);
  }
}

TEST_CASE("experts backward matches finite differences for every input", "[experts]") {
  const Problem p = make_problem(5, 2, 4, 3, 2, 101);
  const std::int64_t T = 5, K = 2, H = 3, I = 2;
  const auto r = random_vector(T * H, 102, 1.0, "r");
  const cpu::DispatchPlan plan = cpu::plan_dispatch(p.indices.data(), mask_ptr(p), p.d);
  const std::int64_t rows = static_cast<std::int64_t>(plan.row_pair.size());
  for (auto act : {GluActivation::swiglu, GluActivation::situ}) {
    for (auto layout : {GluLayout::concatenated, GluLayout::interleaved}) {
      for (bool after : {false, true}) {
        ExpertsConfig cfg;
        cfg.activation = act;
        cfg.layout = layout;
        cfg.weight_after_down = after;
        cfg.beta_gate = 1.5f;
        cfg.beta_up = 2.0f;
        auto loss = [&](const std::vector<double>& x, const std::vector<double>& gu, const std::vector<double>& dn,
                        const std::vector<double>& w) {
          return weighted_sum(kernel_forward(x, gu, dn, p.indices, w, mask_ptr(p), p.d, cfg), r);
        };
        std::vector<double> h(rows * 2 * I), a(rows * I), y(rows * H), out(T * H);
        const auto view = cpu::view_of(plan, p.indices.data());
        cpu::experts_forward(p.x.data(), p.gate_up.data(), p.down.data(), p.weights.data(), view, p.d, cfg, h.data(),
                             a.data(), y.data(), out.data());
        std::vector<double> dx(T * H), dw(T * K), dgu(p.gate_up.size(), 0.0), ddown(p.down.size(), 0.0);
        cpu::experts_backward(r.data(), p.x.data(), p.gate_up.data(), p.down.data(), p.weights.data(), view, p.d, cfg,
                              h.data(), a.data(), y.data(), dx.data(), dw.data(), dgu.data(), ddown.data());
        INFO("act " << static_cast<int>(act) << " layout " << static_cast<int>(layout) << " after " << after);
        CHECK(scaled_max_error(dx, numeric_gradient([&](const auto& v) { return loss(v, p.gate_up, p.down, p.weights); },
                                                    p.x)) < 1e-6);
        CHECK(scaled_max_error(dgu, numeric_gradient([&](const auto& v) { return loss(p.x, v, p.down, p.weights); },
                                                     p.gate_up)) < 1e-6);
        CHECK(scaled_max_error(ddown, numeric_gradient([&](const auto& v) { return loss(p.x, p.gate_up, v, p.weights); },
                                                       p.down)) < 1e-6);
        CHECK(scaled_max_error(dw, numeric_gradient([&](const auto& v) { return loss(p.x, p.gate_up, p.down, v); },
                                                    p.weights)) < 1e-6);
      }
    }
  }
}

TEST_CASE("experts Tensor backward equals the cpu kernel and accumulates parameter grads", "[experts]") {
  const Problem p = make_problem(6, 2, 3, 4, 3, 111);
  ExpertsConfig cfg;
  cfg.layout = GluLayout::interleaved;
  Tensor gu = tensor_of({3, 4, 6}, p.gate_up), dn = tensor_of({3, 3, 4}, p.down);
  ExpertsForward f = experts_forward(tensor_of({6, 4}, p.x), gu, dn, indices_tensor(p), tensor_of({6, 2}, p.weights),
                                     mask_tensor(p), cfg);
  Tensor d_out = tensor_of({6, 4}, random_vector(24, 112, 1.0, "d_out"));
  Tensor d_gu = Tensor::zeros({3, 4, 6}), d_dn = Tensor::zeros({3, 3, 4});
  ExpertsGrads g1 = experts_backward(d_out, f.saved, gu, dn, cfg, d_gu, d_dn);
  Tensor once_gu = d_gu.clone(), once_dn = d_dn.clone();
  ExpertsGrads g2 = experts_backward(d_out, f.saved, gu, dn, cfg, d_gu, d_dn);
  for (std::int64_t i = 0; i < d_gu.numel(); ++i) {
    CHECK(d_gu.data<float>()[i] == Approx(2 * once_gu.data<float>()[i]).margin(1e-6));
  }
  for (std::int64_t i = 0; i < d_dn.numel(); ++i) {
    CHECK(d_dn.data<float>()[i] == Approx(2 * once_dn.data<float>()[i]).margin(1e-6));
  }
  for (std::int64_t i = 0; i < g1.dx.numel(); ++i) CHECK(g1.dx.data<float>()[i] == g2.dx.data<float>()[i]);

  // The same numbers in double through the cpu template.
  const cpu::DispatchPlan plan = cpu::plan_dispatch(p.indices.data(), mask_ptr(p), p.d);
  const std::int64_t rows = static_cast<std::int64_t>(plan.row_pair.size());
  std::vector<double> h(rows * 6), a(rows * 3), y(rows * 4), out(24), dx(24), dw(12), dgu(72, 0.0), ddn(36, 0.0);
  const auto view = cpu::view_of(plan, p.indices.data());
  cpu::experts_forward(p.x.data(), p.gate_up.data(), p.down.data(), p.weights.data(), view, p.d, cfg, h.data(),
                       a.data(), y.data(), out.data());
  std::vector<double> dod(d_out.span<float>().begin(), d_out.span<float>().end());
  cpu::experts_backward(dod.data(), p.x.data(), p.gate_up.data(), p.down.data(), p.weights.data(), view, p.d, cfg,
                        h.data(), a.data(), y.data(), dx.data(), dw.data(), dgu.data(), ddn.data());
  CHECK(scaled_max_error(std::vector<double>(g1.dx.span<float>().begin(), g1.dx.span<float>().end()), dx) < 1e-5);
  CHECK(scaled_max_error(std::vector<double>(g1.d_weights.span<float>().begin(), g1.d_weights.span<float>().end()),
                         dw) < 1e-5);
  CHECK(scaled_max_error(std::vector<double>(once_gu.span<float>().begin(), once_gu.span<float>().end()), dgu) < 1e-5);
  CHECK(scaled_max_error(std::vector<double>(once_dn.span<float>().begin(), once_dn.span<float>().end()), ddn) < 1e-5);
}

TEST_CASE("experts bf16 matches the bf16 reference and agrees with fp32", "[experts]") {
  const std::int64_t T = 16, K = 2, E = 4, H = 32, I = 16;
  const Problem p = make_problem(T, K, E, H, I, 121);
  auto rounded = [](const std::vector<double>& v) {
    std::vector<float> f(v.begin(), v.end());
    for (float& x : f) x = round_to_bf16(x);
    return f;
  };
  for (bool after : {false, true}) {
    ExpertsConfig hi;
    hi.weight_after_down = after;
    ExpertsConfig lo = hi;
    lo.precision = Precision::bf16;
    const auto xf = rounded(p.x), guf = rounded(p.gate_up), dnf = rounded(p.down), wf = rounded(p.weights);
    ExpertsForward f_lo = experts_forward(Tensor::from_floats({T, H}, xf), Tensor::from_floats({E, H, 2 * I}, guf),
                                          Tensor::from_floats({E, I, H}, dnf), indices_tensor(p),
                                          Tensor::from_floats({T, K}, wf), mask_tensor(p), lo);
    ExpertsForward f_hi = experts_forward(tensor_of({T, H}, p.x), tensor_of({E, H, 2 * I}, p.gate_up),
                                          tensor_of({E, I, H}, p.down), indices_tensor(p), tensor_of({T, K}, p.weights),
                                          mask_tensor(p), hi);
    const auto ref_lo = reference_forward(xf, guf, dnf, p.indices, wf, p.mask, p.d, lo);
    double scale = 0;
    for (float v : f_hi.out.span<float>()) scale = std::max(scale, static_cast<double>(std::abs(v)));
    for (std::int64_t i = 0; i < T * H; ++i) {
      const float v = f_lo.out.data<float>()[i];
      CHECK(v == round_to_bf16(v));  // the combined output is a bf16 value
      // Same rounding points; only gemm summation order can move a value across a bf16 boundary.
      CHECK(std::abs(v - ref_lo[i]) <= 1e-2 * scale);
      CHECK(std::abs(v - f_hi.out.data<float>()[i]) <= 2e-2 * scale);
    }
    // The saved activation input and activation are bf16 values too.
    for (float v : f_lo.saved.experts.gate_up_out.span<float>()) CHECK(v == round_to_bf16(v));
    for (float v : f_lo.saved.experts.act_out.span<float>()) CHECK(v == round_to_bf16(v));
    // ... and so is the down projection's output, before the fp32 sum over the K slots.
    for (float v : f_lo.saved.experts.down_out.span<float>()) CHECK(v == round_to_bf16(v));
  }
}

TEST_CASE("experts bf16: the routing weight's place (before or after down) rounds where the spec says, bitwise",
          "[experts][bf16]") {
  // H = I = 1: every GEMM element is one product, the same bits in any kernel, so the kernel must
  // equal the per-token reference bit for bit; only the rounding points (w·a rounded before down,
  // or w·y after it, MODELS.md §10.1.8, §10.1.12) decide the result.
  const std::int64_t T = 64, K = 2, E = 4;
  const Problem p = make_problem(T, K, E, 1, 1, 131);
  auto rounded = [](const std::vector<double>& v) {
    std::vector<float> f(v.begin(), v.end());
    for (float& x : f) x = round_to_bf16(x);
    return f;
  };
  const auto xf = rounded(p.x), guf = rounded(p.gate_up), dnf = rounded(p.down), wf = rounded(p.weights);
  std::vector<std::vector<float>> ref(2);
  for (bool after : {false, true}) {
    INFO("weight after down: " << after);
    ExpertsConfig cfg;
    cfg.weight_after_down = after;
    cfg.precision = Precision::bf16;
    const auto out = kernel_forward(xf, guf, dnf, p.indices, wf, mask_ptr(p), p.d, cfg);
    ref[after] = reference_forward(xf, guf, dnf, p.indices, wf, p.mask, p.d, cfg);
    CHECK(testing::same_bits(out, ref[after]));
  }
  // The inputs tell the two places apart (else the check above could not see a swapped place).
  int differ = 0;
  for (std::int64_t t = 0; t < T; ++t) differ += ref[0][t] != ref[1][t];
  CHECK(differ >= 8);
}

TEST_CASE("experts split by owner (two halves of local experts with offsets) equal the one-process experts bitwise",
          "[experts][ep]") {
  // What expert parallelism does: dispatch on the tokens' rank, each owner runs its local experts
  // on its rows, combine on the tokens' rank. Nothing may change a bit.
  const std::int64_t T = 24, K = 2, E = 4, H = 16, I = 8, half = E / 2;
  const Problem p = make_problem(T, K, E, H, I, 321);
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    for (bool after : {false, true}) {
      INFO(precision_name(prec) << (after ? " weight after down" : " weight before down"));
      ExpertsConfig cfg;
      cfg.precision = prec;
      cfg.weight_after_down = after;
      Tensor x = tensor_of({T, H}, p.x), w = tensor_of({T, K}, p.weights);
      Tensor gu = tensor_of({E, H, 2 * I}, p.gate_up), dn = tensor_of({E, I, H}, p.down);
      if (prec == Precision::bf16) {
        for (Tensor* t : {&x, &gu, &dn}) round_to_bf16_inplace(*t);
      }
      const ExpertsForward whole = experts_forward(x, gu, dn, indices_tensor(p), w, mask_tensor(p), cfg);
      Tensor d_out = tensor_of({T, H}, random_vector(T * H, 322, 1.0, "d_out"));
      Tensor d_gu = Tensor::zeros({E, H, 2 * I}), d_dn = Tensor::zeros({E, I, H});
      const ExpertsGrads whole_grads = experts_backward(d_out, whole.saved, gu, dn, cfg, d_gu, d_dn);

      const ExpertDispatch dispatch = plan_expert_dispatch(indices_tensor(p), w, mask_tensor(p), E);
      const DispatchedRows rows = dispatch_forward(x, dispatch);
      const std::int64_t* off = dispatch.expert_offsets.data<std::int64_t>();
      Tensor down_out = Tensor::empty({dispatch.rows(), H});
      std::vector<GroupedExpertsSaved> owners;
      for (std::int64_t first : {std::int64_t{0}, half}) {
        const std::int64_t r0 = off[first], r1 = off[first + half];
        owners.push_back(grouped_experts_forward(rows.x_rows.slice_rows(r0, r1), rows.w_rows.slice_rows(r0, r1),
                                                 dispatch, first, gu.slice_rows(first, first + half),
                                                 dn.slice_rows(first, first + half), cfg));
        down_out.slice_rows(r0, r1).copy_from(owners.back().down_out);
      }
      const Tensor out = combine_forward(down_out, dispatch, H, cfg);
      CHECK(testing::same_bits(out, whole.out));

      CombineGrads c = combine_backward(d_out, down_out, dispatch, cfg);
      Tensor d_x_rows = Tensor::empty({dispatch.rows(), H}), d_w_rows = Tensor::empty({dispatch.rows()});
      Tensor split_gu = Tensor::zeros({E, H, 2 * I}), split_dn = Tensor::zeros({E, I, H});
      for (std::size_t o = 0; o < owners.size(); ++o) {
        const std::int64_t first = static_cast<std::int64_t>(o) * half, r0 = off[first], r1 = off[first + half];
        const GroupedExpertsGrads g = grouped_experts_backward(
            c.d_rows.slice_rows(r0, r1), owners[o], gu.slice_rows(first, first + half),
            dn.slice_rows(first, first + half), cfg, split_gu.slice_rows(first, first + half),
            split_dn.slice_rows(first, first + half));
        d_x_rows.slice_rows(r0, r1).copy_from(g.d_x_rows);
        d_w_rows.slice_rows(r0, r1).copy_from(g.d_w_rows);
      }
      Tensor dx = Tensor::empty({T, H});
      dispatch_backward(d_x_rows, d_w_rows, dispatch, cfg, dx, c.d_weights);
      CHECK(testing::same_bits(dx, whole_grads.dx));
      CHECK(testing::same_bits(c.d_weights, whole_grads.d_weights));
      CHECK(testing::same_bits(split_gu, d_gu));
      CHECK(testing::same_bits(split_dn, d_dn));
    }
  }
}

TEST_CASE("experts rejects bad shapes", "[experts]") {
  const Problem p = make_problem(3, 2, 3, 4, 2, 131);
  ExpertsConfig cfg;
  Tensor x = tensor_of({3, 4}, p.x), gu = tensor_of({3, 4, 4}, p.gate_up), dn = tensor_of({3, 2, 4}, p.down);
  Tensor w = tensor_of({3, 2}, p.weights);
  CHECK_THROWS_AS(experts_forward(x, gu, Tensor::zeros({3, 4, 2}), indices_tensor(p), w, Tensor(), cfg),
                  std::invalid_argument);
  CHECK_THROWS_AS(experts_forward(x, Tensor::zeros({3, 4, 5}), dn, indices_tensor(p), w, Tensor(), cfg),
                  std::invalid_argument);
  CHECK_THROWS_AS(experts_forward(x, gu, dn, indices_tensor(p), Tensor::zeros({3, 3}), Tensor(), cfg),
                  std::invalid_argument);
  CHECK_THROWS_AS(experts_forward(x, gu, dn, indices_tensor(p), w, Tensor::zeros({2}, DType::boolean), cfg),
                  std::invalid_argument);
  Tensor bad_idx = indices_tensor(p);
  bad_idx.data<std::int32_t>()[0] = 3;
  CHECK_THROWS_AS(experts_forward(x, gu, dn, bad_idx, w, Tensor(), cfg), std::invalid_argument);
}

TEST_CASE("grouped experts refuse weights that do not pair up, and local experts outside the routing", "[experts]") {
  const std::int64_t T = 6, K = 2, E = 4, H = 4, I = 2;
  const Problem p = make_problem(T, K, E, H, I, 133);
  ExpertsConfig cfg;
  Tensor x = tensor_of({T, H}, p.x), w = tensor_of({T, K}, p.weights);
  Tensor gu = tensor_of({E, H, 2 * I}, p.gate_up), dn = tensor_of({E, I, H}, p.down);
  const ExpertDispatch dispatch = plan_expert_dispatch(indices_tensor(p), w, mask_tensor(p), E);
  const DispatchedRows rows = dispatch_forward(x, dispatch);
  const GroupedExpertsSaved saved = grouped_experts_forward(rows.x_rows, rows.w_rows, dispatch, 0, gu, dn, cfg);
  Tensor d_rows = Tensor::zeros({dispatch.rows(), H});
  Tensor d_gu = Tensor::zeros({E, H, 2 * I}), d_dn = Tensor::zeros({E, I, H});
  CHECK_NOTHROW(grouped_experts_backward(d_rows, saved, gu, dn, cfg, d_gu, d_dn));

  // gate_up's last dim must be 2I for down's I: one of 2I + 1 (its gradient alike, so the gradient's
  // own check passes) would be read with a row stride of 2I.
  const Tensor odd = Tensor::zeros({E, H, 2 * I + 1}), d_odd = Tensor::zeros({E, H, 2 * I + 1});
  CHECK_THROWS_AS(grouped_experts_forward(rows.x_rows, rows.w_rows, dispatch, 0, odd, dn, cfg), std::invalid_argument);
  CHECK_THROWS_AS(grouped_experts_backward(d_rows, saved, odd, dn, cfg, d_odd, d_dn), std::invalid_argument);
  // Two local experts starting at expert 3 of 4 run past the routing's experts.
  const std::int64_t* off = dispatch.expert_offsets.data<std::int64_t>();
  CHECK_THROWS_AS(grouped_experts_forward(rows.x_rows.slice_rows(off[3], off[4]), rows.w_rows.slice_rows(off[3], off[4]),
                                          dispatch, 3, gu.slice_rows(2, 4), dn.slice_rows(2, 4), cfg),
                  std::invalid_argument);
}

TEST_CASE("row_dots: each row one multiply-then-add chain in column order, eight rows at a time or alone",
          "[experts]") {
  for (const std::int64_t rows : {1, 7, 8, 9, 17}) {
    INFO(rows << " rows");
    const std::int64_t cols = 37;
    std::vector<float> x(static_cast<std::size_t>(rows * cols)), y(x.size());
    CounterRng rng(77, "row_dots");
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(rng.uniform(2 * i) * 2 - 1) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
      y[i] = static_cast<float>(rng.uniform(2 * i + 1) * 2 - 1);
    }
    std::vector<float> dots(static_cast<std::size_t>(rows));
    cpu::row_dots(x.data(), y.data(), rows, cols, dots.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      float chain = 0;
      for (std::int64_t i = 0; i < cols; ++i) {
        const float product = x[r * cols + i] * y[r * cols + i];
        chain = chain + product;
      }
      CHECK(std::bit_cast<std::uint32_t>(dots[static_cast<std::size_t>(r)]) == std::bit_cast<std::uint32_t>(chain));
    }
  }
}

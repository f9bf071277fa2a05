// Inkling2's attention extensions: relative-logit profiles and query-conditioned sinks on top of
// the GQA kernel. Finite differences in double for every input, a naive reference with the sink as
// an explicit zero-value column (MODELS.md §6.15), sink -> -inf and zero profiles reproducing the
// plain kernel, bf16 agreement.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>

#include <cmath>
#include <limits>

#include "kernels/cpu/relative_attention.hpp"
#include "kernels/ops/relative_attention.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

constexpr std::int64_t B = 2, S = 7, Hq = 4, Hkv = 2, D = 3, R = 3;
// Row 0: documents at 0 and 4, padding key at 2. Row 1 starts inside a document (pos 3).
const std::vector<std::int64_t> kPos = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
const bool kValid[B * S] = {true, true, false, true, true, true, true, true, true, true, true, true, true, true};

std::vector<float> to_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct Inputs {
  std::vector<double> q = random_vector(B * S * Hq * D, 1), k = random_vector(B * S * Hkv * D, 2),
                      v = random_vector(B * S * Hkv * D, 3), p = random_vector(B * Hq * S * R, 4),
                      sink = random_vector(B * Hq * S, 5);
};

struct Run {
  std::vector<double> out, lse;
};

Run run(const Inputs& in, std::int64_t window) {
  Run r{std::vector<double>(in.q.size()), std::vector<double>(B * Hq * S)};
  cpu::RelativeProfileBias<double> bias{in.p.data(), nullptr, Hq, S, R};
  cpu::attention_forward<double>(in.q.data(), in.k.data(), in.v.data(), kPos.data(), kValid,
                                 cpu::query_sink_logits<double>(in.sink.data(), nullptr, Hq, S), r.out.data(),
                                 r.lse.data(), {B, S, Hq, Hkv, D}, window, 1.0 / std::sqrt(double(D)), bias);
  return r;
}

Tensor tensor_of(Shape shape, const std::vector<double>& v) {
  return Tensor::from_floats(std::move(shape), to_floats(v));
}
Tensor positions() {
  Tensor t = Tensor::empty({B, S}, DType::i64);
  std::copy(kPos.begin(), kPos.end(), t.data<std::int64_t>());
  return t;
}
Tensor valid() {
  Tensor t = Tensor::empty({B, S}, DType::boolean);
  std::copy(kValid, kValid + B * S, t.data<bool>());
  return t;
}

}  // namespace

TEST_CASE("Relative attention backward matches finite differences for q, k, v, profiles and sinks",
          "[relative_attention][grad]") {
  for (std::int64_t window : {0, 3}) {
    INFO("window " << window);
    Inputs in;
    auto r = random_vector(in.q.size(), 6);
    Run f = run(in, window);
    std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dp(in.p.size(), 0.0),
        ds(in.sink.size(), 0.0);
    cpu::RelativeProfileBias<double> bias{in.p.data(), dp.data(), Hq, S, R};
    cpu::attention_backward<double>(r.data(), in.q.data(), in.k.data(), in.v.data(), f.lse.data(), kPos.data(), kValid,
                                    cpu::query_sink_logits<double>(in.sink.data(), ds.data(), Hq, S), dq.data(),
                                    dk.data(), dv.data(), {B, S, Hq, Hkv, D}, window, 1.0 / std::sqrt(double(D)), bias);
    auto loss = [&](std::vector<double> Inputs::*field) {
      return [&, field](const std::vector<double>& x) {
        Inputs changed = in;
        changed.*field = x;
        return weighted_sum(run(changed, window).out, r);
      };
    };
    CHECK(scaled_max_error(dq, numeric_gradient(loss(&Inputs::q), in.q)) < 1e-6);
    CHECK(scaled_max_error(dk, numeric_gradient(loss(&Inputs::k), in.k)) < 1e-6);
    CHECK(scaled_max_error(dv, numeric_gradient(loss(&Inputs::v), in.v)) < 1e-6);
    CHECK(scaled_max_error(dp, numeric_gradient(loss(&Inputs::p), in.p)) < 1e-6);
    CHECK(scaled_max_error(ds, numeric_gradient(loss(&Inputs::sink), in.sink)) < 1e-6);
  }
}

TEST_CASE("Relative bias and sink equal a naive softmax with an explicit zero-value sink column",
          "[relative_attention]") {
  Inputs in;
  Run f = run(in, 0);
  const double scale = 1.0 / std::sqrt(double(D));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t t = 0; t < S; ++t) {
        // Columns: every visible key, then the sink (logit σ, value 0).
        std::vector<double> logits;
        std::vector<const double*> values;
        for (std::int64_t j = std::max<std::int64_t>(0, t - kPos[b * S + t]); j <= t; ++j) {
          if (!kValid[b * S + j]) continue;
          double s = 0;
          for (std::int64_t d = 0; d < D; ++d)
            s += in.q[((b * S + t) * Hq + h) * D + d] * in.k[((b * S + j) * Hkv + hk) * D + d];
          s *= scale;
          if (t - j < R) s += in.p[((b * Hq + h) * S + t) * R + (t - j)];
          logits.push_back(s);
          values.push_back(&in.v[((b * S + j) * Hkv + hk) * D]);
        }
        logits.push_back(in.sink[(b * Hq + h) * S + t]);
        double m = -1e300, sum = 0;
        for (double l : logits) m = std::max(m, l);
        for (double l : logits) sum += std::exp(l - m);
        for (std::int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (std::size_t c = 0; c + 1 < logits.size(); ++c) o += std::exp(logits[c] - m) / sum * values[c][d];
          CHECK(f.out[((b * S + t) * Hq + h) * D + d] == Approx(o).margin(1e-12));
        }
        // LSE form: out = out_without_sink · sigmoid(lse - σ).
        CHECK(f.lse[(b * Hq + h) * S + t] == Approx(m + std::log(sum)).margin(1e-12));
      }
    }
  }
}

TEST_CASE("A -inf sink and zero profiles reproduce the plain attention kernel bitwise", "[relative_attention]") {
  Inputs in;
  Tensor q = tensor_of({B, S, Hq, D}, in.q), k = tensor_of({B, S, Hkv, D}, in.k), v = tensor_of({B, S, Hkv, D}, in.v);
  AttentionOptions opts;
  opts.window = 3;
  opts.scale = 0.5f;
  AttentionForward plain = attention_forward(q, k, v, positions(), valid(), Tensor(), opts);
  Tensor sinks = Tensor::full({B, Hq, S}, -std::numeric_limits<float>::infinity());
  AttentionForward ext =
      relative_attention_forward(q, k, v, positions(), valid(), Tensor::zeros({B, Hq, S, R}), sinks, opts);
  const auto bits = [](const Tensor& t, std::int64_t i) { return std::bit_cast<std::uint32_t>(t.data<float>()[i]); };
  for (std::int64_t i = 0; i < q.numel(); ++i) CHECK(bits(ext.out, i) == bits(plain.out, i));
  AttentionForward none = relative_attention_forward(q, k, v, positions(), valid(), Tensor(), Tensor(), opts);
  for (std::int64_t i = 0; i < q.numel(); ++i) CHECK(bits(none.out, i) == bits(plain.out, i));
  // And a finite sink only shrinks every output: out = out_plain · sigmoid(lse_plain - σ).
  Tensor zero_sinks = Tensor::zeros({B, Hq, S});
  AttentionForward with_sink = relative_attention_forward(q, k, v, positions(), valid(), Tensor(), zero_sinks, opts);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < S; ++t) {
      for (std::int64_t h = 0; h < Hq; ++h) {
        const float lse = plain.lse.data<float>()[(b * Hq + h) * S + t];
        const float gate = 1.0f / (1.0f + std::exp(-lse));
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t i = ((b * S + t) * Hq + h) * D + d;
          CHECK(with_sink.out.data<float>()[i] == Approx(plain.out.data<float>()[i] * gate).margin(1e-6));
        }
      }
    }
  }
}

TEST_CASE("Relative profiles are read only at distances 0..R-1 and refuse a query_index", "[relative_attention]") {
  // A key after its query (distance < 0: a context-parallel query sits elsewhere than its row
  // index) has no profile entry: bias 0, no gradient written (it was an out-of-bounds index).
  std::vector<double> profiles(Hq * S * R, 1.0), grads(Hq * S * R, 0.0);
  const cpu::RelativeProfileBias<double> bias{profiles.data(), grads.data(), Hq, S, R};
  CHECK(bias.value(0, 1, 2, 2) == 1.0);
  CHECK(bias.value(0, 1, 2, 3) == 0.0);
  CHECK(bias.value(0, 1, 5, 5 - R) == 0.0);
  bias.add_grad(0, 1, 2, 3, 7.0);
  bias.add_grad(0, 1, 5, 5 - R, 7.0);
  for (double g : grads) CHECK(g == 0.0);
  Inputs in;
  Tensor q = tensor_of({B, S, Hq, D}, in.q), k = tensor_of({B, S, Hkv, D}, in.k), v = tensor_of({B, S, Hkv, D}, in.v);
  AttentionOptions opts;
  opts.query_index = positions();
  CHECK_THROWS_WITH(relative_attention_forward(q, k, v, positions(), valid(), tensor_of({B, Hq, S, R}, in.p), Tensor(),
                                               opts),
                    Catch::Contains("query_index is not supported"));
}

TEST_CASE("Relative attention gradients through the Tensor API match the double kernel", "[relative_attention]") {
  Inputs in;
  auto r = random_vector(in.q.size(), 7);
  Tensor q = tensor_of({B, S, Hq, D}, in.q), k = tensor_of({B, S, Hkv, D}, in.k), v = tensor_of({B, S, Hkv, D}, in.v);
  Tensor p = tensor_of({B, Hq, S, R}, in.p), s = tensor_of({B, Hq, S}, in.sink);
  AttentionOptions opts;
  opts.scale = static_cast<float>(1.0 / std::sqrt(double(D)));
  AttentionForward f = relative_attention_forward(q, k, v, positions(), valid(), p, s, opts);
  RelativeAttentionGrads g =
      relative_attention_backward(tensor_of({B, S, Hq, D}, r), q, k, v, f, positions(), valid(), p, s, opts);
  Run fd = run(in, 0);
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dp(in.p.size(), 0.0), ds(in.sink.size(), 0.0);
  cpu::attention_backward<double>(r.data(), in.q.data(), in.k.data(), in.v.data(), fd.lse.data(), kPos.data(), kValid,
                                  cpu::query_sink_logits<double>(in.sink.data(), ds.data(), Hq, S), dq.data(),
                                  dk.data(), dv.data(), {B, S, Hq, Hkv, D}, 0, 1.0 / std::sqrt(double(D)),
                                  cpu::RelativeProfileBias<double>{in.p.data(), dp.data(), Hq, S, R});
  for (std::size_t i = 0; i < dp.size(); ++i) CHECK(g.d_profiles.data<float>()[i] == Approx(dp[i]).margin(1e-5));
  for (std::size_t i = 0; i < ds.size(); ++i) CHECK(g.d_sink_logits.data<float>()[i] == Approx(ds[i]).margin(1e-5));
  for (std::size_t i = 0; i < dq.size(); ++i) CHECK(g.dq.data<float>()[i] == Approx(dq[i]).margin(1e-5));
  for (std::size_t i = 0; i < dk.size(); ++i) CHECK(g.dk.data<float>()[i] == Approx(dk[i]).margin(1e-5));
  for (std::size_t i = 0; i < dv.size(); ++i) CHECK(g.dv.data<float>()[i] == Approx(dv[i]).margin(1e-5));
}

// The kernel has no bf16 path (attention runs in fp32 in both precisions; what precision bf16
// rounds around it is checked in tests/graph/test_bf16_points.cpp): this measures how much the
// rounding of its inputs moves its output, i.e. the conditioning the model's bf16 runs rely on.
TEST_CASE("Relative attention on bf16-rounded inputs agrees with fp32 within 2e-2", "[relative_attention]") {
  Inputs in;
  Tensor q = tensor_of({B, S, Hq, D}, in.q), k = tensor_of({B, S, Hkv, D}, in.k), v = tensor_of({B, S, Hkv, D}, in.v);
  Tensor p = tensor_of({B, Hq, S, R}, in.p), s = tensor_of({B, Hq, S}, in.sink);
  AttentionOptions opts;
  opts.scale = static_cast<float>(1.0 / std::sqrt(double(D)));
  AttentionForward f32 = relative_attention_forward(q, k, v, positions(), valid(), p, s, opts);
  Tensor qb = q.clone(), kb = k.clone(), vb = v.clone(), pb = p.clone(), sb = s.clone();
  for (const Tensor& t : {qb, kb, vb, pb, sb}) round_to_bf16_inplace(t);
  AttentionForward f16 = relative_attention_forward(qb, kb, vb, positions(), valid(), pb, sb, opts);
  std::int64_t moved = 0;
  for (std::int64_t i = 0; i < q.numel(); ++i) {
    CHECK(f16.out.data<float>()[i] == Approx(f32.out.data<float>()[i]).epsilon(2e-2).margin(2e-2));
    moved += f16.out.data<float>()[i] != f32.out.data<float>()[i];
  }
  CHECK(moved > q.numel() / 2);  // the rounding changed the output: the comparison measured something
}

TEST_CASE("Relative attention rejects wrong profile and sink shapes", "[relative_attention]") {
  Tensor q = Tensor::zeros({B, S, Hq, D}), k = Tensor::zeros({B, S, Hkv, D});
  CHECK_THROWS_WITH(
      relative_attention_forward(q, k, k, positions(), valid(), Tensor::zeros({B, S, Hq, R}), Tensor(), {}),
      Catch::Contains("relative_attention_forward") && Catch::Contains("profiles"));
  CHECK_THROWS_WITH(relative_attention_forward(q, k, k, positions(), valid(), Tensor(), Tensor::zeros({Hq}), {}),
                    Catch::Contains("sink_logits must be a cpu f32[2, 4, 7] tensor, got f32[4]"));
}

// GQA attention over packed rows: a brute-force reference (explicit mask matrix, sink as an extra
// zero-value column), finite-difference gradients in double for q, k, v and sinks, the sink LSE
// form, document isolation, sliding windows, rows starting inside a document, queries with no
// visible key, the GQA head mapping, position validation, bf16-vs-fp32 agreement, and the float
// row loops (attention_rows.hpp) against the generic ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/ops/attention.hpp"
#include "tests/support/gradcheck.hpp"
#include "tests/support/isa_levels.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using atl::testing::numeric_gradient;
using atl::testing::random_vector;
using atl::testing::scaled_max_error;
using atl::testing::weighted_sum;

namespace {

// Two packed rows of S = 9. Row 0: docs [0..3], [4..6], [7..8]; tokens 7 and 8 are padding, so
// query 7 (a document start whose only key is itself) sees no key. Row 1 starts inside a document
// (pos[0] = 3), has a second document from token 3 and an invalid key at token 1.
struct AttnCase {
  std::int64_t B = 2, S = 9, Hq = 4, Hkv = 2, D = 4;
  std::vector<std::int64_t> pos{0, 1, 2, 3, 0, 1, 2, 0, 1, /*row 1*/ 3, 4, 5, 0, 1, 2, 3, 4, 5};
  std::vector<int> valid{1, 1, 1, 1, 1, 1, 1, 0, 0, /*row 1*/ 1, 0, 1, 1, 1, 1, 1, 1, 1};
  std::int64_t window = 0;
  double scale = 0.5;  // D^-0.5
  bool use_sinks = false;
  std::vector<double> q, k, v, sinks;

  std::size_t q_size() const { return static_cast<std::size_t>(B * S * Hq * D); }
  std::size_t kv_size() const { return static_cast<std::size_t>(B * S * Hkv * D); }
  std::size_t lse_size() const { return static_cast<std::size_t>(B * Hq * S); }
};

AttnCase make_case(std::int64_t window, bool use_sinks, std::uint64_t seed) {
  AttnCase c;
  c.window = window;
  c.use_sinks = use_sinks;
  c.q = random_vector(c.q_size(), seed, 1.0, "q");
  c.k = random_vector(c.kv_size(), seed, 1.0, "k");
  c.v = random_vector(c.kv_size(), seed, 1.0, "v");
  c.sinks = random_vector(static_cast<std::size_t>(c.Hq), seed, 1.0, "sinks");
  return c;
}

Tensor f32_tensor(Shape shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  for (std::size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = static_cast<float>(values[i]);
  return t;
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = t.data<float>()[i];
  return out;
}

Tensor positions_tensor(const AttnCase& c) {
  Tensor t = Tensor::empty({c.B, c.S}, DType::i64);
  for (std::size_t i = 0; i < c.pos.size(); ++i) t.data<std::int64_t>()[i] = c.pos[i];
  return t;
}

Tensor valid_tensor(const AttnCase& c) {
  Tensor t = Tensor::empty({c.B, c.S}, DType::boolean);
  for (std::size_t i = 0; i < c.valid.size(); ++i) t.data<bool>()[i] = c.valid[i] != 0;
  return t;
}

struct TensorCase {
  Tensor q, k, v, positions, valid, sinks;
  AttentionOptions options;
};

TensorCase tensors(const AttnCase& c) {
  TensorCase t;
  t.q = f32_tensor({c.B, c.S, c.Hq, c.D}, c.q);
  t.k = f32_tensor({c.B, c.S, c.Hkv, c.D}, c.k);
  t.v = f32_tensor({c.B, c.S, c.Hkv, c.D}, c.v);
  t.positions = positions_tensor(c);
  t.valid = valid_tensor(c);
  if (c.use_sinks) t.sinks = f32_tensor({c.Hq}, c.sinks);
  t.options.window = c.window;
  t.options.scale = static_cast<float>(c.scale);
  return t;
}

cpu::AttentionShape shape_of(const AttnCase& c) { return {c.B, c.S, c.Hq, c.Hkv, c.D}; }

// The kernel in double on the case's inputs (replaced by the given vectors).
struct DoubleRun {
  std::vector<double> out, lse;
};
DoubleRun run_double(const AttnCase& c, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& sinks) {
  const Tensor positions = positions_tensor(c), valid = valid_tensor(c);
  cpu::SinkLogits<double> sink_logits;
  if (c.use_sinks) sink_logits.values = sinks.data();
  DoubleRun r{std::vector<double>(c.q_size()), std::vector<double>(c.lse_size())};
  cpu::attention_forward<double>(q.data(), k.data(), v.data(), positions.data<std::int64_t>(), valid.data<bool>(),
                                 sink_logits, r.out.data(), r.lse.data(), shape_of(c), c.window, c.scale);
  return r;
}

// Independent reference: explicit [S, S] mask from the spec's formula, the sink as one more
// score column whose value vector is zero, a plain max-subtracted softmax over the row.
DoubleRun reference_attention(const AttnCase& c) {
  DoubleRun r{std::vector<double>(c.q_size(), 0.0), std::vector<double>(c.lse_size(), 0.0)};
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<std::vector<bool>> mask(static_cast<std::size_t>(c.S), std::vector<bool>(static_cast<std::size_t>(c.S)));
    for (std::int64_t t = 0; t < c.S; ++t) {
      for (std::int64_t j = 0; j < c.S; ++j) {
        const std::int64_t pt = c.pos[static_cast<std::size_t>(b * c.S + t)];
        mask[t][j] = c.valid[static_cast<std::size_t>(b * c.S + j)] != 0 && t - pt <= j && j <= t &&
                     (c.window == 0 || t - j < c.window);
      }
    }
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const std::int64_t hk = h / (c.Hq / c.Hkv);
      for (std::int64_t t = 0; t < c.S; ++t) {
        std::vector<double> logits(static_cast<std::size_t>(c.S + 1), neg_inf);
        bool any = false;
        for (std::int64_t j = 0; j < c.S; ++j) {
          if (!mask[t][j]) continue;
          any = true;
          double dot = 0;
          for (std::int64_t d = 0; d < c.D; ++d) {
            dot += c.q[static_cast<std::size_t>(((b * c.S + t) * c.Hq + h) * c.D + d)] *
                   c.k[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + hk) * c.D + d)];
          }
          logits[static_cast<std::size_t>(j)] = c.scale * dot;
        }
        if (c.use_sinks) logits[static_cast<std::size_t>(c.S)] = c.sinks[static_cast<std::size_t>(h)];
        double& lse = r.lse[static_cast<std::size_t>((b * c.Hq + h) * c.S + t)];
        if (!any) {
          lse = c.use_sinks ? c.sinks[static_cast<std::size_t>(h)] : neg_inf;
          continue;  // output stays 0
        }
        double m = neg_inf;
        for (double s : logits) m = std::max(m, s);
        double z = 0;
        for (double s : logits) z += std::exp(s - m);
        lse = m + std::log(z);
        for (std::int64_t j = 0; j <= c.S; ++j) {
          const double p = std::exp(logits[static_cast<std::size_t>(j)] - m) / z;
          for (std::int64_t d = 0; d < c.D; ++d) {
            const double value =
                j == c.S ? 0.0 : c.v[static_cast<std::size_t>(((b * c.S + j) * c.Hkv + hk) * c.D + d)];
            r.out[static_cast<std::size_t>(((b * c.S + t) * c.Hq + h) * c.D + d)] += p * value;
          }
        }
      }
    }
  }
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;  // -inf lse of a query with neither key nor sink
    m = atl::testing::worst_of(m, std::abs(a[i] - b[i]));
  }
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = atl::testing::worst_of(m, std::abs(x));
  return m;
}

// Index of q/out element (b, t, h, d) and of k/v element (b, j, hk, d).
std::size_t q_index(const AttnCase& c, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
  return static_cast<std::size_t>(((b * c.S + t) * c.Hq + h) * c.D + d);
}
std::size_t kv_index(const AttnCase& c, std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) {
  return static_cast<std::size_t>(((b * c.S + j) * c.Hkv + hk) * c.D + d);
}

}  // namespace

TEST_CASE("attention: forward matches a brute-force masked-softmax reference", "[attention]") {
  for (const std::int64_t window : {0, 3}) {
    for (const bool use_sinks : {false, true}) {
      INFO("window " << window << ", sinks " << use_sinks);
      const AttnCase c = make_case(window, use_sinks, 21);
      const TensorCase t = tensors(c);
      const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
      const DoubleRun ref = reference_attention(c);
      CHECK(max_abs_diff(to_doubles(f.out), ref.out) < 1e-5);
      CHECK(max_abs_diff(to_doubles(f.lse), ref.lse) < 1e-5);
      const DoubleRun exact = run_double(c, c.q, c.k, c.v, c.sinks);
      CHECK(max_abs_diff(exact.out, ref.out) < 1e-12);
      CHECK(max_abs_diff(exact.lse, ref.lse) < 1e-12);
    }
  }
}

TEST_CASE("attention: gradients of q, k, v and sinks match finite differences in double", "[attention]") {
  for (const std::int64_t window : {0, 3}) {
    for (const bool use_sinks : {false, true}) {
      INFO("window " << window << ", sinks " << use_sinks);
      const AttnCase c = make_case(window, use_sinks, 22);
      const auto r = random_vector(c.q_size(), 23, 1.0, "dout");
      const DoubleRun f = run_double(c, c.q, c.k, c.v, c.sinks);
      const Tensor positions = positions_tensor(c), valid = valid_tensor(c);
      std::vector<double> dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
      std::vector<double> dsinks(static_cast<std::size_t>(c.Hq), 0.0);
      cpu::SinkLogits<double> sink_logits;
      if (use_sinks) {
        sink_logits.values = c.sinks.data();
        sink_logits.grads = dsinks.data();
      }
      cpu::attention_backward<double>(r.data(), c.q.data(), c.k.data(), c.v.data(), f.lse.data(),
                                      positions.data<std::int64_t>(), valid.data<bool>(), sink_logits, dq.data(),
                                      dk.data(), dv.data(), shape_of(c), c.window, c.scale);
      auto loss_q = [&](const std::vector<double>& x) { return weighted_sum(run_double(c, x, c.k, c.v, c.sinks).out, r); };
      auto loss_k = [&](const std::vector<double>& x) { return weighted_sum(run_double(c, c.q, x, c.v, c.sinks).out, r); };
      auto loss_v = [&](const std::vector<double>& x) { return weighted_sum(run_double(c, c.q, c.k, x, c.sinks).out, r); };
      auto loss_s = [&](const std::vector<double>& x) { return weighted_sum(run_double(c, c.q, c.k, c.v, x).out, r); };
      CHECK(scaled_max_error(dq, numeric_gradient(loss_q, c.q)) < 1e-6);
      CHECK(scaled_max_error(dk, numeric_gradient(loss_k, c.k)) < 1e-6);
      CHECK(scaled_max_error(dv, numeric_gradient(loss_v, c.v)) < 1e-6);
      if (use_sinks) {
        CHECK(scaled_max_error(dsinks, numeric_gradient(loss_s, c.sinks)) < 1e-6);
        CHECK(max_abs(dsinks) > 1e-3);  // the check is not vacuous
      }
      // Query (row 0, t = 7) sees no key: its q gradient is exactly zero.
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        for (std::int64_t d = 0; d < c.D; ++d) CHECK(dq[q_index(c, 0, 7, h, d)] == 0.0);
      }
    }
  }
}

TEST_CASE("attention: the f32 Tensor backward agrees with the double kernel", "[attention]") {
  const AttnCase c = make_case(3, true, 24);
  const TensorCase t = tensors(c);
  const auto r = random_vector(c.q_size(), 25, 1.0, "dout");
  const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
  Tensor dsinks = Tensor::zeros({c.Hq});
  const AttentionGrads g = attention_backward(f32_tensor({c.B, c.S, c.Hq, c.D}, r), t.q, t.k, t.v, f, t.positions,
                                              t.valid, t.sinks, &dsinks, t.options);
  const DoubleRun fd = run_double(c, c.q, c.k, c.v, c.sinks);
  std::vector<double> dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size()), ds(static_cast<std::size_t>(c.Hq), 0.0);
  cpu::SinkLogits<double> sink_logits;
  sink_logits.values = c.sinks.data();
  sink_logits.grads = ds.data();
  cpu::attention_backward<double>(r.data(), c.q.data(), c.k.data(), c.v.data(), fd.lse.data(),
                                  t.positions.data<std::int64_t>(), t.valid.data<bool>(), sink_logits, dq.data(),
                                  dk.data(), dv.data(), shape_of(c), c.window, c.scale);
  CHECK(max_abs_diff(to_doubles(g.dq), dq) < 1e-5);
  CHECK(max_abs_diff(to_doubles(g.dk), dk) < 1e-5);
  CHECK(max_abs_diff(to_doubles(g.dv), dv) < 1e-5);
  CHECK(max_abs_diff(to_doubles(dsinks), ds) < 1e-5);
  // dsinks accumulates: a second backward doubles it.
  attention_backward(f32_tensor({c.B, c.S, c.Hq, c.D}, r), t.q, t.k, t.v, f, t.positions, t.valid, t.sinks, &dsinks,
                     t.options);
  for (std::int64_t h = 0; h < c.Hq; ++h) CHECK(dsinks.data<float>()[h] == Approx(2 * ds[h]).margin(1e-5));
}

TEST_CASE("attention: a sink of -1e30 equals plain softmax", "[attention]") {
  AttnCase c = make_case(0, false, 26);
  const TensorCase plain = tensors(c);
  c.use_sinks = true;
  c.sinks.assign(static_cast<std::size_t>(c.Hq), -1e30);
  const TensorCase sunk = tensors(c);
  const AttentionForward a = attention_forward(plain.q, plain.k, plain.v, plain.positions, plain.valid, plain.sinks,
                                               plain.options);
  const AttentionForward b = attention_forward(sunk.q, sunk.k, sunk.v, sunk.positions, sunk.valid, sunk.sinks,
                                               sunk.options);
  CHECK(max_abs_diff(to_doubles(a.out), to_doubles(b.out)) == 0.0);
  // lse agrees wherever a key is visible (a keyless query's lse is the sink itself: -1e30 vs -inf).
  for (std::int64_t i = 0; i < a.lse.numel(); ++i) {
    if (std::isfinite(a.lse.data<float>()[i])) CHECK(a.lse.data<float>()[i] == b.lse.data<float>()[i]);
  }
  const Tensor dout = f32_tensor({c.B, c.S, c.Hq, c.D}, random_vector(c.q_size(), 27));
  Tensor dsinks = Tensor::zeros({c.Hq});
  const AttentionGrads ga = attention_backward(dout, plain.q, plain.k, plain.v, a, plain.positions, plain.valid,
                                               plain.sinks, nullptr, plain.options);
  const AttentionGrads gb = attention_backward(dout, sunk.q, sunk.k, sunk.v, b, sunk.positions, sunk.valid,
                                               sunk.sinks, &dsinks, sunk.options);
  CHECK(max_abs_diff(to_doubles(ga.dq), to_doubles(gb.dq)) == 0.0);
  CHECK(max_abs_diff(to_doubles(ga.dk), to_doubles(gb.dk)) == 0.0);
  CHECK(max_abs_diff(to_doubles(ga.dv), to_doubles(gb.dv)) == 0.0);
  CHECK(max_abs(to_doubles(dsinks)) == 0.0);
}

TEST_CASE("attention: sink output equals the no-sink output times sigmoid(lse - sink) (LSE form)", "[attention]") {
  AttnCase c = make_case(0, true, 28);
  const TensorCase with_sink = tensors(c);
  c.use_sinks = false;
  const TensorCase without = tensors(c);
  const AttentionForward s = attention_forward(with_sink.q, with_sink.k, with_sink.v, with_sink.positions,
                                               with_sink.valid, with_sink.sinks, with_sink.options);
  const AttentionForward n = attention_forward(without.q, without.k, without.v, without.positions, without.valid,
                                               without.sinks, without.options);
  for (std::int64_t b = 0; b < c.B; ++b) {
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const double sink = with_sink.sinks.data<float>()[h];
      for (std::int64_t t = 0; t < c.S; ++t) {
        const double lse = n.lse.data<float>()[(b * c.Hq + h) * c.S + t];
        const double lse_sink = s.lse.data<float>()[(b * c.Hq + h) * c.S + t];
        if (std::isinf(lse)) {  // no visible key: both outputs are 0
          CHECK(lse_sink == static_cast<float>(sink));
          continue;
        }
        CHECK(lse_sink == Approx(std::max(lse, sink) + std::log1p(std::exp(-std::abs(lse - sink)))).margin(1e-5));
        const double gate = 1.0 / (1.0 + std::exp(sink - lse));
        for (std::int64_t d = 0; d < c.D; ++d) {
          const std::size_t i = q_index(c, b, t, h, d);
          CHECK(s.out.data<float>()[i] == Approx(n.out.data<float>()[i] * gate).margin(1e-6));
        }
      }
    }
  }
}

TEST_CASE("attention: documents packed in a row do not see each other", "[attention]") {
  // Row 0 has documents [0..3] (A) and [4..8] (B), all valid.
  AttnCase c = make_case(0, true, 29);
  c.B = 1;
  c.pos = {0, 1, 2, 3, 0, 1, 2, 3, 4};
  c.valid.assign(9, 1);
  c.q.resize(c.q_size());
  c.k.resize(c.kv_size());
  c.v.resize(c.kv_size());
  const TensorCase base = tensors(c);
  const AttentionForward f = attention_forward(base.q, base.k, base.v, base.positions, base.valid, base.sinks,
                                               base.options);
  AttnCase changed = c;
  const auto noise = random_vector(c.q_size(), 30);
  for (std::int64_t t = 0; t < 4; ++t) {
    for (std::int64_t i = 0; i < c.Hq * c.D; ++i) changed.q[static_cast<std::size_t>(t * c.Hq * c.D + i)] += noise[static_cast<std::size_t>(i)];
    for (std::int64_t i = 0; i < c.Hkv * c.D; ++i) {
      changed.k[static_cast<std::size_t>(t * c.Hkv * c.D + i)] += 3 * noise[static_cast<std::size_t>(i + 1)];
      changed.v[static_cast<std::size_t>(t * c.Hkv * c.D + i)] -= 2 * noise[static_cast<std::size_t>(i + 2)];
    }
  }
  const TensorCase other = tensors(changed);
  const AttentionForward g = attention_forward(other.q, other.k, other.v, other.positions, other.valid, other.sinks,
                                               other.options);
  const std::int64_t row = c.Hq * c.D;
  double a_change = 0;
  for (std::int64_t i = 0; i < 4 * row; ++i) a_change += std::abs(f.out.data<float>()[i] - g.out.data<float>()[i]);
  CHECK(a_change > 1e-3);  // doc A itself did change
  for (std::int64_t i = 4 * row; i < 9 * row; ++i) CHECK(f.out.data<float>()[i] == g.out.data<float>()[i]);
  // Gradients flowing from doc B's outputs never reach doc A's k and v.
  std::vector<double> dout_b = random_vector(c.q_size(), 31);
  for (std::int64_t i = 0; i < 4 * row; ++i) dout_b[static_cast<std::size_t>(i)] = 0;
  const AttentionGrads grads = attention_backward(f32_tensor({1, 9, c.Hq, c.D}, dout_b), base.q, base.k, base.v, f,
                                                  base.positions, base.valid, base.sinks, nullptr, base.options);
  for (std::int64_t i = 0; i < 4 * c.Hkv * c.D; ++i) {
    CHECK(grads.dk.data<float>()[i] == 0.0f);
    CHECK(grads.dv.data<float>()[i] == 0.0f);
  }
}

TEST_CASE("attention: a sliding window of w sees keys t-w+1 .. t, the current token included", "[attention]") {
  AttnCase c = make_case(1, false, 32);
  c.B = 1;
  c.pos = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  c.valid.assign(9, 1);
  c.q.resize(c.q_size());
  c.k.resize(c.kv_size());
  c.v.resize(c.kv_size());
  {
    // window 1: every query sees only itself, so the output is its own value vector.
    const TensorCase t = tensors(c);
    const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
    for (std::int64_t s = 0; s < c.S; ++s) {
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        for (std::int64_t d = 0; d < c.D; ++d) {
          CHECK(f.out.data<float>()[q_index(c, 0, s, h, d)] == t.v.data<float>()[kv_index(c, 0, s, h / 2, d)]);
        }
      }
    }
  }
  // window 3 at query 6: key 3 (distance 3) is outside, key 4 (distance 2) inside.
  c.window = 3;
  const TensorCase t = tensors(c);
  const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
  auto out_at_6_after_bumping_key = [&](std::int64_t j) {
    const Tensor k2 = t.k.clone();
    for (std::int64_t i = 0; i < c.Hkv * c.D; ++i) k2.data<float>()[j * c.Hkv * c.D + i] += 1.0f;
    const AttentionForward g = attention_forward(t.q, k2, t.v, t.positions, t.valid, t.sinks, t.options);
    double diff = 0;
    for (std::int64_t i = 0; i < c.Hq * c.D; ++i) {
      diff += std::abs(g.out.data<float>()[6 * c.Hq * c.D + i] - f.out.data<float>()[6 * c.Hq * c.D + i]);
    }
    return diff;
  };
  CHECK(out_at_6_after_bumping_key(3) == 0.0);
  CHECK(out_at_6_after_bumping_key(4) > 1e-4);
  CHECK(max_abs_diff(to_doubles(f.out), reference_attention(c).out) < 1e-5);
}

TEST_CASE("attention: a row starting inside a document sees keys from the row start", "[attention]") {
  // One document throughout; starting at position 5 or 0 gives the same visible sets inside the row.
  AttnCase c = make_case(0, true, 33);
  c.B = 1;
  c.valid.assign(9, 1);
  c.q.resize(c.q_size());
  c.k.resize(c.kv_size());
  c.v.resize(c.kv_size());
  c.pos = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  const TensorCase inside = tensors(c);
  c.pos = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  const TensorCase fresh = tensors(c);
  const AttentionForward a = attention_forward(inside.q, inside.k, inside.v, inside.positions, inside.valid,
                                               inside.sinks, inside.options);
  const AttentionForward b = attention_forward(fresh.q, fresh.k, fresh.v, fresh.positions, fresh.valid, fresh.sinks,
                                               fresh.options);
  CHECK(max_abs_diff(to_doubles(a.out), to_doubles(b.out)) == 0.0);
  // Query 0 at position 5 sees only key 0: its output is the sink-weighted value of key 0.
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    double s = 0;
    for (std::int64_t d = 0; d < c.D; ++d) s += c.scale * c.q[q_index(c, 0, 0, h, d)] * c.k[kv_index(c, 0, 0, h / 2, d)];
    const double p = 1.0 / (1.0 + std::exp(c.sinks[static_cast<std::size_t>(h)] - s));
    for (std::int64_t d = 0; d < c.D; ++d) {
      CHECK(a.out.data<float>()[q_index(c, 0, 0, h, d)] == Approx(p * c.v[kv_index(c, 0, 0, h / 2, d)]).margin(1e-6));
    }
  }
}

TEST_CASE("attention: a query with no visible key outputs 0 and passes no gradient", "[attention]") {
  AttnCase c = make_case(0, true, 34);
  c.B = 1;
  c.S = 3;
  c.pos = {0, 1, 0};
  c.valid = {0, 1, 1};  // query 0 sees only key 0, which is padding
  c.q.resize(c.q_size());
  c.k.resize(c.kv_size());
  c.v.resize(c.kv_size());
  const TensorCase t = tensors(c);
  const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
  const Tensor dout = f32_tensor({1, 3, c.Hq, c.D}, random_vector(c.q_size(), 35));
  Tensor dsinks = Tensor::zeros({c.Hq});
  const AttentionGrads g = attention_backward(dout, t.q, t.k, t.v, f, t.positions, t.valid, t.sinks, &dsinks,
                                              t.options);
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    CHECK(f.lse.data<float>()[h * c.S] == t.sinks.data<float>()[h]);
    for (std::int64_t d = 0; d < c.D; ++d) {
      CHECK(f.out.data<float>()[q_index(c, 0, 0, h, d)] == 0.0f);
      CHECK(g.dq.data<float>()[q_index(c, 0, 0, h, d)] == 0.0f);
    }
  }
  for (std::int64_t i = 0; i < c.Hkv * c.D; ++i) {  // key 0 is invalid: nobody reads it
    CHECK(g.dk.data<float>()[i] == 0.0f);
    CHECK(g.dv.data<float>()[i] == 0.0f);
  }
  // All tokens padding: everything is 0, without sinks too (lse -inf, no NaN anywhere).
  c.valid = {0, 0, 0};
  for (const bool use_sinks : {false, true}) {
    c.use_sinks = use_sinks;
    const TensorCase p = tensors(c);
    const AttentionForward pf = attention_forward(p.q, p.k, p.v, p.positions, p.valid, p.sinks, p.options);
    Tensor ds = Tensor::zeros({c.Hq});
    const AttentionGrads pg = attention_backward(dout, p.q, p.k, p.v, pf, p.positions, p.valid, p.sinks, &ds,
                                                 p.options);
    CHECK(max_abs(to_doubles(pf.out)) == 0.0);
    CHECK(max_abs(to_doubles(pg.dq)) == 0.0);
    CHECK(max_abs(to_doubles(pg.dk)) == 0.0);
    CHECK(max_abs(to_doubles(pg.dv)) == 0.0);
    CHECK(max_abs(to_doubles(ds)) == 0.0);
  }
}

TEST_CASE("attention: query head h reads KV head h / (Hq/Hkv)", "[attention]") {
  const AttnCase c = make_case(0, true, 36);  // Hq = 4, Hkv = 2
  AttnCase expanded = c;  // the same problem with every KV head repeated for its query heads
  expanded.Hkv = c.Hq;
  expanded.k.assign(expanded.kv_size(), 0.0);
  expanded.v.assign(expanded.kv_size(), 0.0);
  AttnCase wrong = expanded;  // interleaved mapping h % Hkv, which must differ
  for (std::int64_t b = 0; b < c.B; ++b) {
    for (std::int64_t j = 0; j < c.S; ++j) {
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        for (std::int64_t d = 0; d < c.D; ++d) {
          expanded.k[kv_index(expanded, b, j, h, d)] = c.k[kv_index(c, b, j, h / 2, d)];
          expanded.v[kv_index(expanded, b, j, h, d)] = c.v[kv_index(c, b, j, h / 2, d)];
          wrong.k[kv_index(wrong, b, j, h, d)] = c.k[kv_index(c, b, j, h % 2, d)];
          wrong.v[kv_index(wrong, b, j, h, d)] = c.v[kv_index(c, b, j, h % 2, d)];
        }
      }
    }
  }
  const auto gqa = run_double(c, c.q, c.k, c.v, c.sinks).out;
  CHECK(max_abs_diff(gqa, run_double(expanded, expanded.q, expanded.k, expanded.v, expanded.sinks).out) < 1e-14);
  CHECK(max_abs_diff(gqa, run_double(wrong, wrong.q, wrong.k, wrong.v, wrong.sinks).out) > 1e-2);
  // dk of a shared KV head is the sum over its query heads of the expanded problem's dk.
  const TensorCase tg = tensors(c), te = tensors(expanded);
  const Tensor dout = f32_tensor({c.B, c.S, c.Hq, c.D}, random_vector(c.q_size(), 37));
  const AttentionForward fg = attention_forward(tg.q, tg.k, tg.v, tg.positions, tg.valid, tg.sinks, tg.options);
  const AttentionForward fe = attention_forward(te.q, te.k, te.v, te.positions, te.valid, te.sinks, te.options);
  const AttentionGrads gg = attention_backward(dout, tg.q, tg.k, tg.v, fg, tg.positions, tg.valid, tg.sinks, nullptr,
                                               tg.options);
  const AttentionGrads ge = attention_backward(dout, te.q, te.k, te.v, fe, te.positions, te.valid, te.sinks, nullptr,
                                               te.options);
  for (std::int64_t b = 0; b < c.B; ++b) {
    for (std::int64_t j = 0; j < c.S; ++j) {
      for (std::int64_t hk = 0; hk < c.Hkv; ++hk) {
        for (std::int64_t d = 0; d < c.D; ++d) {
          const double sum = ge.dk.data<float>()[kv_index(expanded, b, j, 2 * hk, d)] +
                             ge.dk.data<float>()[kv_index(expanded, b, j, 2 * hk + 1, d)];
          CHECK(gg.dk.data<float>()[kv_index(c, b, j, hk, d)] == Approx(sum).margin(1e-5));
        }
      }
    }
  }
}

TEST_CASE("attention: validate_positions enforces +1 steps or resets to 0", "[attention]") {
  auto rows = [](std::int64_t b, std::int64_t s, std::vector<std::int64_t> values) {
    Tensor t = Tensor::empty({b, s}, DType::i64);
    for (std::size_t i = 0; i < values.size(); ++i) t.data<std::int64_t>()[i] = values[i];
    return t;
  };
  CHECK_NOTHROW(validate_positions(rows(2, 5, {0, 1, 2, 0, 1, /*row 1*/ 7, 8, 0, 0, 1})));
  CHECK_THROWS_WITH(validate_positions(rows(2, 3, {0, 1, 2, /*row 1*/ 0, 1, 3})),
                    Catch::Matchers::Contains("row 1, col 2") && Catch::Matchers::Contains("position 3 follows 1"));
  CHECK_THROWS_AS(validate_positions(rows(1, 4, {0, 1, 2, 1})), std::invalid_argument);
  CHECK_THROWS_AS(validate_positions(rows(1, 3, {0, -1, 0})), std::invalid_argument);
  // attention itself rejects negative positions.
  AttnCase c = make_case(0, false, 38);
  c.pos[3] = -1;
  const TensorCase t = tensors(c);
  CHECK_THROWS_WITH(attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options),
                    Catch::Matchers::Contains("negative position"));
}

TEST_CASE("attention: rejects inconsistent shapes", "[attention]") {
  const AttnCase c = make_case(0, false, 39);
  const TensorCase t = tensors(c);
  CHECK_THROWS_AS(attention_forward(t.q, Tensor::zeros({2, 9, 3, 4}), Tensor::zeros({2, 9, 3, 4}), t.positions,
                                    t.valid, t.sinks, t.options),
                  std::invalid_argument);  // Hq = 4 not a multiple of Hkv = 3
  CHECK_THROWS_AS(attention_forward(t.q, t.k, t.v, t.positions, t.valid, Tensor::zeros({3}), t.options),
                  std::invalid_argument);
  CHECK_THROWS_AS(attention_forward(t.q, t.k, t.v, t.positions, Tensor::zeros({2, 9}), t.sinks, t.options),
                  std::invalid_argument);  // valid must be bool
}

// The kernel has no bf16 path (attention runs in fp32 in both precisions; what precision bf16
// rounds around it is checked in tests/graph/test_bf16_points.cpp): this measures how much the
// rounding of its inputs moves its output and gradients, the conditioning bf16 runs rely on.
TEST_CASE("attention: bf16-rounded inputs move the output and gradients by under 2e-2 relative", "[attention]") {
  const AttnCase c = make_case(3, true, 40);
  const TensorCase t = tensors(c);
  auto rounded = [](const Tensor& x) { return x.to(DType::bf16).to(DType::f32); };
  const Tensor dout = f32_tensor({c.B, c.S, c.Hq, c.D}, random_vector(c.q_size(), 41));
  const AttentionForward f = attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options);
  const Tensor qb = rounded(t.q), kb = rounded(t.k), vb = rounded(t.v);
  const AttentionForward fb = attention_forward(qb, kb, vb, t.positions, t.valid, t.sinks, t.options);
  const AttentionGrads g = attention_backward(dout, t.q, t.k, t.v, f, t.positions, t.valid, t.sinks, nullptr,
                                              t.options);
  const AttentionGrads gb = attention_backward(rounded(dout), qb, kb, vb, fb, t.positions, t.valid, t.sinks, nullptr,
                                               t.options);
  auto relative = [](const Tensor& a, const Tensor& b) {
    return max_abs_diff(to_doubles(a), to_doubles(b)) / max_abs(to_doubles(a));
  };
  for (const auto& [a, b] : {std::pair{&f.out, &fb.out}, {&g.dq, &gb.dq}, {&g.dk, &gb.dk}, {&g.dv, &gb.dv}}) {
    CHECK(relative(*a, *b) < 2e-2);
    CHECK(relative(*a, *b) > 0);  // the inputs were rounded
  }
}

// Rows longer than one query tile (kAttentionQueryTile = 64): a 40-token document placed across a
// tile boundary at two different offsets, among other documents, gives the same bits for its
// outputs, lse and q/k/v gradients; the whole row still matches the brute-force reference.
TEST_CASE("attention: a document spanning query tiles gives the same bits wherever it sits", "[attention]") {
  constexpr std::int64_t kS = 160, kDoc = 40;
  static_assert(kS > 2 * cpu::kAttentionQueryTile);
  for (const std::int64_t window : {0, 5}) {
    INFO("window " << window);
    auto layout = [&](std::int64_t start, std::uint64_t seed) {
      AttnCase c = make_case(window, true, seed);
      c.B = 1;
      c.S = kS;
      c.pos.assign(kS, 0);
      c.valid.assign(kS, 1);
      for (std::int64_t t = 1; t < kS; ++t) c.pos[static_cast<std::size_t>(t)] = t % 23 == 0 ? 0 : c.pos[static_cast<std::size_t>(t - 1)] + 1;
      c.q = random_vector(c.q_size(), seed, 1.0, "q");
      c.k = random_vector(c.kv_size(), seed, 1.0, "k");
      c.v = random_vector(c.kv_size(), seed, 1.0, "v");
      const AttnCase doc = make_case(window, true, 77);  // the document's own values
      c.sinks = doc.sinks;
      const auto dq_values = random_vector(c.q_size(), 78, 1.0, "dout");
      std::vector<double> dout = random_vector(c.q_size(), seed, 1.0, "dout");
      for (std::int64_t t = 0; t < kDoc; ++t) {
        const std::size_t at = static_cast<std::size_t>(start + t);
        c.pos[at] = t;
        c.valid[at] = (t % 9) != 4;  // a few invalid keys inside the document too
        for (std::int64_t i = 0; i < c.Hq * c.D; ++i) {
          c.q[at * static_cast<std::size_t>(c.Hq * c.D) + static_cast<std::size_t>(i)] = dq_values[static_cast<std::size_t>(t * c.Hq * c.D + i)];
          dout[at * static_cast<std::size_t>(c.Hq * c.D) + static_cast<std::size_t>(i)] = dq_values[static_cast<std::size_t>((kDoc + t) * c.Hq * c.D + i)] ;
        }
        for (std::int64_t i = 0; i < c.Hkv * c.D; ++i) {
          const std::size_t src = static_cast<std::size_t>((t % c.S) * c.Hkv * c.D + i);
          c.k[at * static_cast<std::size_t>(c.Hkv * c.D) + static_cast<std::size_t>(i)] = doc.k[src % doc.k.size()] + 0.01 * static_cast<double>(t);
          c.v[at * static_cast<std::size_t>(c.Hkv * c.D) + static_cast<std::size_t>(i)] = doc.v[src % doc.v.size()] - 0.02 * static_cast<double>(t);
        }
      }
      const std::size_t after = static_cast<std::size_t>(start + kDoc);
      if (after < static_cast<std::size_t>(kS)) c.pos[after] = 0;  // the next document starts fresh
      for (std::size_t t = after + 1; t < static_cast<std::size_t>(kS); ++t) c.pos[t] = c.pos[t - 1] + 1;
      return std::pair{c, dout};
    };
    const auto [a, dout_a] = layout(50, 90);   // crosses the tile boundary at 64
    const auto [b, dout_b] = layout(100, 91);  // crosses 128, different neighbours
    const TensorCase ta = tensors(a), tb = tensors(b);
    const AttentionForward fa = attention_forward(ta.q, ta.k, ta.v, ta.positions, ta.valid, ta.sinks, ta.options);
    const AttentionForward fb = attention_forward(tb.q, tb.k, tb.v, tb.positions, tb.valid, tb.sinks, tb.options);
    CHECK(max_abs_diff(to_doubles(fa.out), reference_attention(a).out) < 1e-5);
    Tensor dsa = Tensor::zeros({a.Hq}), dsb = Tensor::zeros({b.Hq});
    const AttentionGrads ga = attention_backward(f32_tensor({1, kS, a.Hq, a.D}, dout_a), ta.q, ta.k, ta.v, fa,
                                                 ta.positions, ta.valid, ta.sinks, &dsa, ta.options);
    const AttentionGrads gb = attention_backward(f32_tensor({1, kS, b.Hq, b.D}, dout_b), tb.q, tb.k, tb.v, fb,
                                                 tb.positions, tb.valid, tb.sinks, &dsb, tb.options);
    const std::int64_t q_row = a.Hq * a.D, kv_row = a.Hkv * a.D;
    std::int64_t mismatches = 0;
    for (std::int64_t t = 0; t < kDoc; ++t) {
      for (std::int64_t i = 0; i < q_row; ++i) {
        mismatches += fa.out.data<float>()[(50 + t) * q_row + i] != fb.out.data<float>()[(100 + t) * q_row + i];
        mismatches += ga.dq.data<float>()[(50 + t) * q_row + i] != gb.dq.data<float>()[(100 + t) * q_row + i];
      }
      for (std::int64_t h = 0; h < a.Hq; ++h) mismatches += fa.lse.data<float>()[h * kS + 50 + t] != fb.lse.data<float>()[h * kS + 100 + t];
      for (std::int64_t i = 0; i < kv_row; ++i) {
        mismatches += ga.dk.data<float>()[(50 + t) * kv_row + i] != gb.dk.data<float>()[(100 + t) * kv_row + i];
        mismatches += ga.dv.data<float>()[(50 + t) * kv_row + i] != gb.dv.data<float>()[(100 + t) * kv_row + i];
      }
    }
    CHECK(mismatches == 0);
    CHECK(max_abs(to_doubles(ga.dk)) > 1e-3);  // not vacuous
  }
}

TEST_CASE("attention: queries given as a part of the key row (context parallelism) get the full row's bits",
          "[attention][cp]") {
  // A rank under context parallelism holds some queries of a row and all-gathers the keys: with
  // query_index naming each query's place among the keys, its outputs, lse and dq equal those rows
  // of the whole-row attention bit for bit; the dk/dv partials of complementary query sets add up
  // to the whole row's.
  constexpr std::int64_t kS = 160;
  for (const std::int64_t window : {0, 5}) {
    INFO("window " << window);
    AttnCase c = make_case(window, true, 93);
    c.B = 1;
    c.S = kS;
    c.pos.assign(kS, 0);
    c.valid.assign(kS, 1);
    for (std::int64_t t = 1; t < kS; ++t) {
      c.pos[static_cast<std::size_t>(t)] = t % 23 == 0 ? 0 : c.pos[static_cast<std::size_t>(t - 1)] + 1;
      c.valid[static_cast<std::size_t>(t)] = t % 17 != 9;
    }
    c.q = random_vector(c.q_size(), 93, 1.0, "q");
    c.k = random_vector(c.kv_size(), 93, 1.0, "k");
    c.v = random_vector(c.kv_size(), 93, 1.0, "v");
    const std::vector<double> dout = random_vector(c.q_size(), 94, 1.0, "dout");
    const TensorCase whole = tensors(c);
    const AttentionForward f = attention_forward(whole.q, whole.k, whole.v, whole.positions, whole.valid, whole.sinks,
                                                 whole.options);
    const Tensor dout_whole = f32_tensor({1, kS, c.Hq, c.D}, dout);
    const AttentionGrads g = attention_backward(dout_whole, whole.q, whole.k, whole.v, f, whole.positions, whole.valid,
                                                whole.sinks, nullptr, whole.options);
    const std::int64_t q_row = c.Hq * c.D;

    // A contiguous chunk, and a head-tail pair of chunks (the load-balanced CP split) with its
    // complement: the queries the other rank holds.
    std::vector<std::int64_t> chunk, head_tail, rest;
    for (std::int64_t t = 40; t < 110; ++t) chunk.push_back(t);
    for (std::int64_t t = 0; t < kS; ++t) (t < 40 || t >= 120 ? head_tail : rest).push_back(t);
    auto run_part = [&](const std::vector<std::int64_t>& rows) {
      const auto n = static_cast<std::int64_t>(rows.size());
      TensorCase part = whole;
      part.q = Tensor::empty({1, n, c.Hq, c.D});
      Tensor dout_part = Tensor::empty({1, n, c.Hq, c.D});
      part.positions = Tensor::empty({1, n}, DType::i64);
      part.options.query_index = Tensor::empty({1, n}, DType::i64);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t t = rows[static_cast<std::size_t>(i)];
        std::copy_n(whole.q.data<float>() + t * q_row, q_row, part.q.data<float>() + i * q_row);
        std::copy_n(dout_whole.data<float>() + t * q_row, q_row, dout_part.data<float>() + i * q_row);
        part.positions.data<std::int64_t>()[i] = c.pos[static_cast<std::size_t>(t)];
        part.options.query_index.data<std::int64_t>()[i] = t;
      }
      const AttentionForward pf = attention_forward(part.q, part.k, part.v, part.positions, part.valid, part.sinks,
                                                    part.options);
      const AttentionGrads pg = attention_backward(dout_part, part.q, part.k, part.v, pf, part.positions, part.valid,
                                                   part.sinks, nullptr, part.options);
      std::int64_t mismatches = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t t = rows[static_cast<std::size_t>(i)];
        for (std::int64_t e = 0; e < q_row; ++e) {
          mismatches += pf.out.data<float>()[i * q_row + e] != f.out.data<float>()[t * q_row + e];
          mismatches += pg.dq.data<float>()[i * q_row + e] != g.dq.data<float>()[t * q_row + e];
        }
        for (std::int64_t h = 0; h < c.Hq; ++h) {
          mismatches += pf.lse.data<float>()[h * n + i] != f.lse.data<float>()[h * kS + t];
        }
      }
      CHECK(mismatches == 0);
      return pg;
    };
    run_part(chunk);
    const AttentionGrads a = run_part(head_tail), b = run_part(rest);
    std::vector<double> dk_sum = to_doubles(a.dk), dv_sum = to_doubles(a.dv);
    const std::vector<double> dk_b = to_doubles(b.dk), dv_b = to_doubles(b.dv);
    for (std::size_t i = 0; i < dk_sum.size(); ++i) {
      dk_sum[i] += dk_b[i];
      dv_sum[i] += dv_b[i];
    }
    CHECK(max_abs_diff(dk_sum, to_doubles(g.dk)) < 1e-5 * std::max(1.0, max_abs(to_doubles(g.dk))));
    CHECK(max_abs_diff(dv_sum, to_doubles(g.dv)) < 1e-5 * std::max(1.0, max_abs(to_doubles(g.dv))));
    CHECK(max_abs(to_doubles(g.dk)) > 1e-3);  // not vacuous
  }
  // A query index outside the keys is refused.
  AttnCase c = make_case(0, false, 95);
  TensorCase t = tensors(c);
  t.options.query_index = Tensor::zeros({c.B, c.S}, DType::i64);
  t.options.query_index.data<std::int64_t>()[3] = c.S;
  CHECK_THROWS_WITH(attention_forward(t.q, t.k, t.v, t.positions, t.valid, t.sinks, t.options),
                    Catch::Contains("query_index"));
}

// The log-sum-exp is the fp32 value nearest log(sum) (double libm rounded once,
// kernels/cpu/libm_float.hpp), not glibc's logf, whose bits vary between builds and releases:
// 1579 keys of equal score make the sum exactly 1579, where this glibc's logf is an ulp off.
TEST_CASE("attention: the log-sum-exp is the fp32 value nearest log(sum)", "[attention][spec]") {
  constexpr std::int64_t S = 1579, D = 4;
  const Tensor zeros = Tensor::zeros({1, S, 1, D});  // every score 0: every key weighs exp(0) = 1
  Tensor positions = Tensor::empty({1, S}, DType::i64), valid = Tensor::empty({1, S}, DType::boolean);
  for (std::int64_t t = 0; t < S; ++t) {
    positions.data<std::int64_t>()[t] = t;
    valid.data<bool>()[t] = true;
  }
  const AttentionForward f = attention_forward(zeros, zeros, zeros, positions, valid, Tensor(), AttentionOptions{});
  const float last = f.lse.data<float>()[S - 1];  // the last query sees all S keys
  CHECK(last == static_cast<float>(std::log(static_cast<double>(S))));
  volatile float s = static_cast<float>(S);  // not folded at compile time (GCC folds correctly rounded)
  INFO("glibc logf(1579) = " << std::log(s) << ", the nearest fp32 " << last);  // differ on glibc 2.36
  CHECK(f.lse.data<float>()[0] == 0.0f);  // the first query sees one key: log(1)
}

namespace {

// A zero score bias that is not NoScoreBias: it sends a float run through the generic loops.
struct ZeroBias {
  float value(std::int64_t, std::int64_t, std::int64_t, std::int64_t) const { return 0.0f; }
  void add_grad(std::int64_t, std::int64_t, std::int64_t, std::int64_t, float) const {}
};

// Float attention inputs: q and dout [B, seq, Hq, D] and positions [B, seq] of the queries; k, v
// [B, keys, Hkv, D] and ok [B, keys] of the keys.
struct FloatCase {
  cpu::AttentionShape shape;
  std::vector<float> q, k, v, dout, sinks;
  std::vector<std::int64_t> pos, query_index;  // shape.query_index points into query_index
  std::unique_ptr<bool[]> ok;
  std::int64_t window = 0;
};

struct FloatRun {
  std::vector<float> out, lse, dq, dk, dv, dsinks;
};

// Forward and backward of float attention with the given bias type.
template <class Bias>
FloatRun run_float(const FloatCase& c) {
  const cpu::AttentionShape& shape = c.shape;
  FloatRun r{std::vector<float>(c.q.size()),
             std::vector<float>(static_cast<std::size_t>(shape.batch * shape.q_heads * shape.seq)),
             std::vector<float>(c.q.size()),
             std::vector<float>(c.k.size()),
             std::vector<float>(c.v.size()),
             std::vector<float>(c.sinks.size())};
  cpu::SinkLogits<float> sink_logits;
  if (!c.sinks.empty()) {
    sink_logits.values = c.sinks.data();
    sink_logits.grads = r.dsinks.data();
  }
  const float scale = 0.35f;
  cpu::attention_forward<float, Bias>(c.q.data(), c.k.data(), c.v.data(), c.pos.data(), c.ok.get(), sink_logits,
                                      r.out.data(), r.lse.data(), shape, c.window, scale);
  cpu::attention_backward<float, Bias>(c.dout.data(), c.q.data(), c.k.data(), c.v.data(), r.lse.data(), c.pos.data(),
                                       c.ok.get(), sink_logits, r.dq.data(), r.dk.data(), r.dv.data(), shape, c.window,
                                       scale);
  return r;
}

std::vector<float> floats(std::size_t n, std::uint64_t seed, const char* name) {
  const std::vector<double> d = random_vector(n, seed, 2.0, name);
  return {d.begin(), d.end()};
}

// Two rows of 150 tokens with documents of every length class around the 16 lanes (1, 15, 17,
// 40, ...), invalid keys, row 1 starting inside a document, and token 40's queries zero (zero
// scores). Under context parallelism (cp_chunk) the queries are the rows' second halves and the
// keys the whole rows, so tiles start at key offsets inside the row.
FloatCase row_loop_case(bool cp_chunk) {
  constexpr std::int64_t kRow = 150, kHq = 4, kHkv = 2, kD = 8;
  std::vector<std::int64_t> positions;  // of every token
  const std::vector<std::int64_t> docs_row0{1, 15, 17, 40, 3, 64, 10}, docs_row1{33, 100, 17};
  for (const auto* docs : {&docs_row0, &docs_row1}) {
    std::int64_t start = docs == &docs_row1 ? 5 : 0;
    for (const std::int64_t len : *docs) {
      for (std::int64_t i = 0; i < len; ++i) positions.push_back(start + i);
      start = 0;
    }
  }
  REQUIRE(positions.size() == 2 * kRow);
  FloatCase c;
  const std::int64_t first = cp_chunk ? kRow / 2 : 0, queries = kRow - first;
  c.shape = {2, queries, kHq, kHkv, kD};
  if (cp_chunk) {  // (moving the case moves the vector's buffer: the pointer stays valid)
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t t = first; t < kRow; ++t) c.query_index.push_back(t);
    c.shape.kv_seq = kRow;
    c.shape.query_index = c.query_index.data();
  }
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t = first; t < kRow; ++t) c.pos.push_back(positions[static_cast<std::size_t>(b * kRow + t)]);
  c.ok = std::make_unique<bool[]>(2 * kRow);
  for (std::size_t i = 0; i < 2 * kRow; ++i) c.ok[i] = !(i % 23 == 7 || i % 41 == 3);
  const std::size_t q_size = static_cast<std::size_t>(2 * queries * kHq * kD), kv_size = 2 * kRow * kHkv * kD;
  c.q = floats(q_size, 71, "q");
  c.k = floats(kv_size, 71, "k");
  c.v = floats(kv_size, 71, "v");
  c.dout = floats(q_size, 71, "dout");
  if (!cp_chunk) std::fill_n(c.q.begin() + 40 * kHq * kD, kHq * kD, 0.0f);
  return c;
}

}  // namespace

TEST_CASE("attention: the float row loops give the generic loops' bits at every instruction-set level", "[attention]") {
  for (const bool cp_chunk : {false, true}) {
    FloatCase c = row_loop_case(cp_chunk);
    for (const std::int64_t window : {std::int64_t{0}, std::int64_t{5}, std::int64_t{40}}) {
      for (const bool with_sinks : {false, true}) {
        INFO("context-parallel chunk " << cp_chunk << ", window " << window << ", sinks " << with_sinks);
        c.window = window;
        c.sinks = with_sinks ? floats(4, 72, "sinks") : std::vector<float>{};
        testing::for_each_isa_level([&] {
          const FloatRun fast = run_float<cpu::NoScoreBias<float>>(c);
          const FloatRun generic = run_float<ZeroBias>(c);
          CHECK(testing::same_bits(fast.out, generic.out));
          CHECK(testing::same_bits(fast.lse, generic.lse));
          CHECK(testing::same_bits(fast.dq, generic.dq));
          CHECK(testing::same_bits(fast.dk, generic.dk));
          CHECK(testing::same_bits(fast.dv, generic.dv));
          CHECK(testing::same_bits(fast.dsinks, generic.dsinks));
          CHECK(max_abs(std::vector<double>(fast.dq.begin(), fast.dq.end())) > 0.0);  // not a run of zeros
        });
      }
    }
  }
}

// MODELS.md §10.1.4 for Inkling2's relative attention with a query-conditioned sink
// (kernels/ops/relative_attention.hpp): "Masks test the key's validity only ... A query with no
// visible key outputs 0".
//
// Under §0.3's mask `valid[k] && (q - pos[q] <= k <= q) && (!local || q - k < window)` (the window
// counts the current token), §10.1.3 and §10.1.4, a valid query always sees its own key. So the
// only keyless queries are invalid ones whose document / window holds no valid key: a padding
// document (§5.7: pad slots are invalid and form a document of their own; §1.4.7: "rows with no
// visible key (padding queries) output 0"), an invalid token opening a document, and an invalid
// token whose window covers only invalid keys. Those rows are what this file checks, forward and
// backward.
//
// The sink's value is zero (§1.4.7), so a keyless query's probabilities are all on the sink:
// p_sink = exp(σ) / (exp(σ) + 0) = 1 and o = 0 for every σ. Hence d o / d σ = 0, and the log of the
// §1.4.7 denominator, which atoll saves as `lse` (kernels/ops/attention.hpp), is log(exp(σ)) = σ
// (-inf without a sink: the empty log-sum-exp of §1.4.7's LSE form).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/ops/relative_attention.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;

namespace {

constexpr std::int64_t Hq = 4, Hkv = 2, D = 3, R = 3;  // GQA: query heads 2h and 2h+1 read KV head h
constexpr float kScale = 0.57735026f;                  // D^-0.5

// One batch row of S tokens; per-token and per-(head, token) inputs in the kernel's layouts.
struct Problem {
  std::int64_t S = 0;
  std::vector<std::int64_t> pos;
  std::vector<std::uint8_t> valid;
  std::vector<float> q, k, v;   // [S, Hq, D], [S, Hkv, D], [S, Hkv, D]
  std::vector<float> profiles;  // [Hq, S, R]
  std::vector<float> sinks;     // [Hq, S]
  std::vector<float> dout;      // [S, Hq, D]
};

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  const std::vector<double> d = testing::random_vector(n, seed);
  return {d.begin(), d.end()};
}

Problem make_problem(std::vector<std::int64_t> pos, std::vector<std::uint8_t> valid, std::uint64_t seed) {
  Problem p;
  p.S = static_cast<std::int64_t>(pos.size());
  p.pos = std::move(pos);
  p.valid = std::move(valid);
  const auto S = static_cast<std::size_t>(p.S);
  p.q = random_floats(S * Hq * D, seed + 1);
  p.k = random_floats(S * Hkv * D, seed + 2);
  p.v = random_floats(S * Hkv * D, seed + 3);
  p.profiles = random_floats(Hq * S * R, seed + 4);
  p.sinks = random_floats(Hq * S, seed + 5);
  p.dout = random_floats(S * Hq * D, seed + 6);
  return p;
}

// The tokens `keep` (in order) of p, as a row of their own: per-token and per-(head, token) data
// copied, positions and validity kept.
Problem subset(const Problem& p, const std::vector<std::int64_t>& keep) {
  Problem r;
  r.S = static_cast<std::int64_t>(keep.size());
  for (std::int64_t t : keep) {
    r.pos.push_back(p.pos[t]);
    r.valid.push_back(p.valid[t]);
    r.q.insert(r.q.end(), p.q.begin() + t * Hq * D, p.q.begin() + (t + 1) * Hq * D);
    r.dout.insert(r.dout.end(), p.dout.begin() + t * Hq * D, p.dout.begin() + (t + 1) * Hq * D);
    r.k.insert(r.k.end(), p.k.begin() + t * Hkv * D, p.k.begin() + (t + 1) * Hkv * D);
    r.v.insert(r.v.end(), p.v.begin() + t * Hkv * D, p.v.begin() + (t + 1) * Hkv * D);
  }
  r.profiles.resize(static_cast<std::size_t>(Hq * r.S * R));
  r.sinks.resize(static_cast<std::size_t>(Hq * r.S));
  for (std::int64_t h = 0; h < Hq; ++h) {
    for (std::int64_t i = 0; i < r.S; ++i) {
      const std::int64_t t = keep[static_cast<std::size_t>(i)];
      r.sinks[h * r.S + i] = p.sinks[h * p.S + t];
      for (std::int64_t d = 0; d < R; ++d) r.profiles[(h * r.S + i) * R + d] = p.profiles[(h * p.S + t) * R + d];
    }
  }
  return r;
}

struct Result {
  AttentionForward f;
  RelativeAttentionGrads g;
};

Result run(const Problem& p, bool with_sink, std::int64_t window) {
  const std::int64_t S = p.S;
  const Tensor q = Tensor::from_floats({1, S, Hq, D}, p.q), k = Tensor::from_floats({1, S, Hkv, D}, p.k),
               v = Tensor::from_floats({1, S, Hkv, D}, p.v);
  const Tensor profiles = Tensor::from_floats({1, Hq, S, R}, p.profiles);
  const Tensor sinks = with_sink ? Tensor::from_floats({1, Hq, S}, p.sinks) : Tensor();
  Tensor positions = Tensor::empty({1, S}, DType::i64), valid = Tensor::empty({1, S}, DType::boolean);
  for (std::int64_t t = 0; t < S; ++t) {
    positions.data<std::int64_t>()[t] = p.pos[t];
    valid.data<bool>()[t] = p.valid[t] != 0;
  }
  AttentionOptions opts;
  opts.window = window;
  opts.scale = kScale;
  Result r;
  r.f = relative_attention_forward(q, k, v, positions, valid, profiles, sinks, opts);
  r.g = relative_attention_backward(Tensor::from_floats({1, S, Hq, D}, p.dout), q, k, v, r.f, positions, valid,
                                    profiles, sinks, opts);
  return r;
}

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

float at(const Tensor& t, std::int64_t i) { return t.data<float>()[i]; }

// Forward and backward of a keyless query row t: everything §10.1.4 and the zero-value sink imply.
void check_keyless_row(const Result& r, const Problem& p, std::int64_t t, bool with_sink) {
  const std::int64_t S = p.S;
  INFO("keyless query " << t << (with_sink ? " with" : " without") << " a sink");
  for (std::int64_t h = 0; h < Hq; ++h) {
    INFO("head " << h);
    for (std::int64_t d = 0; d < D; ++d) {
      // Mutations caught: the invalid query treated as seeing itself (mask on the query's validity,
      // or `j == t` always visible), a mask that ignores key validity, a window/document bound off
      // by one (row t would see a valid key), a keyless row given the mean of V or left unwritten
      // (Tensor::empty garbage), or NaN from exp(-inf - -inf) without the no-key branch (no sink).
      CHECK(at(r.f.out, (t * Hq + h) * D + d) == 0.0f);
    }
    const float lse = at(r.f.lse, h * S + t);
    if (with_sink) {
      // log(exp(σ) + empty sum) = σ exactly. Catches lse = 0 / -inf / σ + log(2) (the sink counted
      // twice) / a stale value on keyless rows.
      CHECK(same_bits(lse, p.sinks[h * S + t]));
      // d o / d σ = 0 since o ≡ 0. Catches a sink gradient of -p_sink·(something) without the
      // delta = <dout, o> = 0 factor, e.g. -p_sink = -1.
      CHECK(at(r.g.d_sink_logits, h * S + t) == 0.0f);
    } else {
      // Catches lse = 0 or NaN for an empty log-sum-exp.
      CHECK(lse == -std::numeric_limits<float>::infinity());
    }
    for (std::int64_t d = 0; d < R; ++d) {
      // Catches profile gradients written for masked keys (p = 0 but ds != 0, or NaN).
      CHECK(at(r.g.d_profiles, (h * S + t) * R + d) == 0.0f);
    }
    for (std::int64_t d = 0; d < D; ++d) {
      // Catches dq from a keyless row whose dout is non-zero (random here), or NaN from lse = -inf.
      CHECK(at(r.g.dq, (t * Hq + h) * D + d) == 0.0f);
    }
  }
}

// dk and dv at an invalid key slot: no query may see it (§10.1.4: masks test the key's validity).
void check_invalid_key_slot(const Result& r, std::int64_t t) {
  INFO("invalid key slot " << t);
  for (std::int64_t i = 0; i < Hkv * D; ++i) {
    // Catches a keyless query's dout/ds reaching its own (invalid) key or value.
    CHECK(at(r.g.dk, t * Hkv * D + i) == 0.0f);
    CHECK(at(r.g.dv, t * Hkv * D + i) == 0.0f);
  }
}

}  // namespace

TEST_CASE(
    "Relative attention: keyless padding and document-start queries output 0 and leave their neighbours "
    "bitwise unchanged",
    "[relative_attention][keyless][spec]") {
  // Row: document A (valid, pos 0..2) | K: an invalid token opening a one-token document |
  // padding document P (invalid, pos 0..1) | document C (valid, pos 0..2). K, P0, P1 have no
  // visible key: their documents hold only invalid keys. A2 and C0 are their neighbours.
  const Problem full = make_problem({0, 1, 2, 0, 0, 1, 0, 1, 2}, {1, 1, 1, 0, 0, 0, 1, 1, 1}, 100);
  const std::vector<std::int64_t> keyless = {3, 4, 5}, normal = {0, 1, 2, 6, 7, 8};
  const Problem reduced = subset(full, normal);  // the same row without the keyless tokens
  for (bool with_sink : {true, false}) {
    INFO((with_sink ? "query-conditioned sink" : "no sink"));
    const Result a = run(full, with_sink, 0), b = run(reduced, with_sink, 0);
    for (std::int64_t t : keyless) {
      check_keyless_row(a, full, t, with_sink);
      check_invalid_key_slot(a, t);
    }
    // Every normal query (A2 and C0 are the keyless tokens' neighbours) equals, bit for bit, the same
    // query of the row without them: forward, lse and every gradient. Catches keyless rows feeding
    // dk/dv (a key's sum over queries), a mask that lets A or C see K/P keys or P see A keys (then
    // K/P rows are no longer keyless either), or NaN/garbage of a keyless row spreading through a
    // shared tile GEMM (0·NaN = NaN in the P·V and dsᵀ·Q products).
    for (std::size_t i = 0; i < normal.size(); ++i) {
      const std::int64_t t = normal[i], u = static_cast<std::int64_t>(i);
      INFO("normal query " << t << " (row index " << u << " without the keyless tokens)");
      for (std::int64_t j = 0; j < Hq * D; ++j) {
        CHECK(same_bits(at(a.f.out, t * Hq * D + j), at(b.f.out, u * Hq * D + j)));
        CHECK(same_bits(at(a.g.dq, t * Hq * D + j), at(b.g.dq, u * Hq * D + j)));
      }
      for (std::int64_t j = 0; j < Hkv * D; ++j) {
        CHECK(same_bits(at(a.g.dk, t * Hkv * D + j), at(b.g.dk, u * Hkv * D + j)));
        CHECK(same_bits(at(a.g.dv, t * Hkv * D + j), at(b.g.dv, u * Hkv * D + j)));
      }
      for (std::int64_t h = 0; h < Hq; ++h) {
        CHECK(same_bits(at(a.f.lse, h * full.S + t), at(b.f.lse, h * reduced.S + u)));
        if (with_sink)
          CHECK(same_bits(at(a.g.d_sink_logits, h * full.S + t), at(b.g.d_sink_logits, h * reduced.S + u)));
        for (std::int64_t d = 0; d < R; ++d)
          CHECK(
              same_bits(at(a.g.d_profiles, (h * full.S + t) * R + d), at(b.g.d_profiles, (h * reduced.S + u) * R + d)));
      }
    }
    // The comparison has teeth: the normal rows' outputs and gradients are not all zero.
    double mass = 0;
    for (std::int64_t t : normal)
      for (std::int64_t j = 0; j < Hq * D; ++j)
        mass += std::abs(at(a.f.out, t * Hq * D + j)) + std::abs(at(a.g.dq, t * Hq * D + j));
    CHECK(mass > 0);
  }
}

TEST_CASE(
    "Relative attention: a query whose window holds only invalid keys outputs 0, one that sees only "
    "itself does not",
    "[relative_attention][keyless][spec]") {
  // One document, pos 0..7, window 2 (the current token and one before it, §0.3's counting).
  // Query 4 (invalid) sees keys 3 and 4, both invalid: keyless although the document has valid keys.
  // Query 3 (invalid) sees key 2 (valid): not keyless, its output is meaningless and unchecked.
  // Query 5 (valid) sees only itself (key 4 is invalid): a valid query is never keyless.
  constexpr std::int64_t window = 2;
  const Problem base = make_problem({0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 1, 0, 0, 1, 0, 1}, 200);
  const std::int64_t t_keyless = 4, t_self = 5;
  const Result a = run(base, true, window);
  check_keyless_row(a, base, t_keyless, true);
  check_invalid_key_slot(a, 3);
  check_invalid_key_slot(a, 4);

  // Query 5: o = v5 · exp(s) / (exp(σ) + exp(s)) with s = D^-0.5 <q5, k5> + P[5, 0] (double
  // reference). Catches "only itself visible" treated as keyless (o = 0), the self key dropped, or
  // key 4 (invalid) let in.
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t kh = h / (Hq / Hkv);
    double s = 0;
    for (std::int64_t d = 0; d < D; ++d)
      s += double(base.q[(t_self * Hq + h) * D + d]) * double(base.k[(t_self * Hkv + kh) * D + d]);
    s = double(kScale) * s + double(base.profiles[(h * base.S + t_self) * R + 0]);
    const double sigma = base.sinks[h * base.S + t_self];
    const double p = 1.0 / (1.0 + std::exp(sigma - s));
    for (std::int64_t d = 0; d < D; ++d) {
      const float o = at(a.f.out, (t_self * Hq + h) * D + d);
      CHECK(o != 0.0f);
      CHECK(o == Approx(p * base.v[(t_self * Hkv + kh) * D + d]).margin(1e-6));
    }
  }

  // The keyless query's own inputs (q, profiles, sink, dout) replaced: its row stays 0 with lse = the
  // new σ, and nothing else moves by a bit (the same rows computed without the old keyless query).
  // Catches a keyless row's q or dout reaching dk/dv or another row through the tile GEMMs.
  Problem changed = base;
  for (std::int64_t j = 0; j < Hq * D; ++j) {
    changed.q[t_keyless * Hq * D + j] = 1e3f * static_cast<float>(j + 1);
    changed.dout[t_keyless * Hq * D + j] = -1e3f * static_cast<float>(j + 2);
  }
  for (std::int64_t h = 0; h < Hq; ++h) {
    changed.sinks[h * base.S + t_keyless] = 5.0f + static_cast<float>(h);
    for (std::int64_t d = 0; d < R; ++d) changed.profiles[(h * base.S + t_keyless) * R + d] = 50.0f;
  }
  const Result c = run(changed, true, window);
  check_keyless_row(c, changed, t_keyless, true);
  for (std::int64_t t = 0; t < base.S; ++t) {
    INFO("query " << t);
    for (std::int64_t j = 0; j < Hkv * D; ++j) {
      CHECK(same_bits(at(a.g.dk, t * Hkv * D + j), at(c.g.dk, t * Hkv * D + j)));
      CHECK(same_bits(at(a.g.dv, t * Hkv * D + j), at(c.g.dv, t * Hkv * D + j)));
    }
    if (t == t_keyless) continue;
    for (std::int64_t j = 0; j < Hq * D; ++j) {
      CHECK(same_bits(at(a.f.out, t * Hq * D + j), at(c.f.out, t * Hq * D + j)));
      CHECK(same_bits(at(a.g.dq, t * Hq * D + j), at(c.g.dq, t * Hq * D + j)));
    }
    for (std::int64_t h = 0; h < Hq; ++h) {
      CHECK(same_bits(at(a.f.lse, h * base.S + t), at(c.f.lse, h * base.S + t)));
      CHECK(same_bits(at(a.g.d_sink_logits, h * base.S + t), at(c.g.d_sink_logits, h * base.S + t)));
      for (std::int64_t d = 0; d < R; ++d)
        CHECK(same_bits(at(a.g.d_profiles, (h * base.S + t) * R + d), at(c.g.d_profiles, (h * base.S + t) * R + d)));
    }
  }
}

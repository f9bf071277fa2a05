// MODELS.md §10.1 numerics, bitwise against scalar references written from the spec:
//   §10.1.8  expert combine: the sum over the K slots in fp32, in ascending expert id, rounded once;
//            invalid tokens routed but not dispatched (exactly 0); shared experts added in fp32 with weight 1.
//   §10.1.11 RoPE: inv_freq = θ^(-2i/D) and the angle pos·inv_freq in fp32, duplicated-half (NeoX)
//            cos/sin tables in fp32.
// Each case is built so that the wrong variant (slot order, a double accumulator, a double angle)
// gives other bits, and the test checks that too, so it can fail.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/ops/rope.hpp"
#include "kernels/precision.hpp"
#include "tests/support/gradcheck.hpp"

using namespace atl;

namespace {

std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (bits(a[i]) != bits(b[i])) return false;
  }
  return true;
}

std::vector<float> floats_of(const Tensor& t) {
  const auto s = t.span<float>();
  return {s.begin(), s.end()};
}

// The bf16 emulation point, written here from dtype.hpp's rounding (not the kernels' helpers).
float round_at(Precision p, float v) { return p == Precision::bf16 ? round_to_bf16(v) : v; }

// ------------------------------------------------------------------------------------------------
// Expert combine (§10.1.8)

// A combine input: for token t and expert e, row[(t*E + e)*H + c] is that expert's down output
// (what grouped_experts_forward leaves in down_out) for channel c.
struct CombineCase {
  std::int64_t tokens = 0, top_k = 0, experts = 0, hidden = 0;
  std::vector<std::int32_t> indices;  // [T,K], slots in the router's order (not ascending)
  std::vector<float> weights;         // [T,K]
  std::vector<char> valid;            // [T]
  std::vector<float> row;             // [T,E,H]
};

enum class SumOrder {
  ascending_fp32,         // the spec
  slot_fp32,              // mutation: sum in slot order (the router's order)
  ascending_double,       // mutation: accumulate in double, round at the end
  ascending_round_each,   // mutation: round to bf16 after every add instead of once
};

// Scalar reference: for each valid token, visit expert ids 0, 1, ..., E-1 and add the slot(s)
// routed to each, in a float accumulator; round once at the end. Invalid tokens stay exactly 0.
std::vector<float> reference_combine(const CombineCase& c, const ExpertsConfig& cfg, SumOrder order) {
  const std::int64_t T = c.tokens, K = c.top_k, E = c.experts, H = c.hidden;
  const Precision p = cfg.precision;
  std::vector<float> out(static_cast<std::size_t>(T * H), 0.0f);
  for (std::int64_t t = 0; t < T; ++t) {
    if (!c.valid[t]) continue;
    std::vector<std::int64_t> slots;
    if (order == SumOrder::slot_fp32) {
      for (std::int64_t j = 0; j < K; ++j) slots.push_back(j);
    } else {
      for (std::int64_t e = 0; e < E; ++e) {
        for (std::int64_t j = 0; j < K; ++j) {
          if (c.indices[t * K + j] == e) slots.push_back(j);
        }
      }
    }
    for (std::int64_t ch = 0; ch < H; ++ch) {
      float acc = 0.0f;
      double acc_d = 0.0;
      for (std::int64_t j : slots) {
        const std::int64_t e = c.indices[t * K + j];
        float y = c.row[(t * E + e) * H + ch];
        if (cfg.weight_after_down) y = round_at(p, c.weights[t * K + j] * y);
        acc = acc + y;
        acc_d += static_cast<double>(y);
        if (order == SumOrder::ascending_round_each) acc = round_at(p, acc);
      }
      out[t * H + ch] = round_at(p, order == SumOrder::ascending_double ? static_cast<float>(acc_d) : acc);
    }
  }
  return out;
}

Tensor indices_tensor(const CombineCase& c) {
  Tensor t = Tensor::empty({c.tokens, c.top_k}, DType::i32);
  for (std::int64_t i = 0; i < c.tokens * c.top_k; ++i) t.data<std::int32_t>()[i] = c.indices[i];
  return t;
}

Tensor mask_tensor(const CombineCase& c) {
  Tensor t = Tensor::empty({c.tokens}, DType::boolean);
  for (std::int64_t i = 0; i < c.tokens; ++i) t.data<bool>()[i] = c.valid[i] != 0;
  return t;
}

// The kernel: plan the dispatch, put each dispatched pair's expert row where the plan puts it,
// then combine_forward.
std::vector<float> kernel_combine(const CombineCase& c, const ExpertsConfig& cfg) {
  const std::int64_t T = c.tokens, K = c.top_k, E = c.experts, H = c.hidden;
  const ExpertDispatch d = plan_expert_dispatch(indices_tensor(c), Tensor::from_floats({T, K}, c.weights),
                                                mask_tensor(c), E);
  std::int64_t valid = 0;
  for (char v : c.valid) valid += v ? 1 : 0;
  CHECK(d.rows() == valid * K);  // invalid tokens are not dispatched
  Tensor down_out = Tensor::empty({d.rows(), H});
  const std::int64_t* pair_row = d.pair_row.data<std::int64_t>();
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < K; ++j) {
      const std::int64_t row = pair_row[t * K + j];
      if (row < 0) continue;
      const std::int64_t e = c.indices[t * K + j];
      for (std::int64_t ch = 0; ch < H; ++ch) down_out.data<float>()[row * H + ch] = c.row[(t * E + e) * H + ch];
    }
  }
  return floats_of(combine_forward(down_out, d, H, cfg));
}

// Sets token t's row of expert e to {v0, v1}; with the weight after down the row is divided by
// its slot's weight (powers of two: exact), so that w·y is {v0, v1} again.
void set_row(CombineCase& c, bool weight_after_down, std::int64_t t, std::int64_t e, float v0, float v1) {
  float w = 1.0f;
  for (std::int64_t j = 0; j < c.top_k; ++j) {
    if (c.indices[t * c.top_k + j] == e && weight_after_down) w = c.weights[t * c.top_k + j];
  }
  c.row[(t * c.experts + e) * c.hidden + 0] = v0 / w;
  c.row[(t * c.experts + e) * c.hidden + 1] = v1 / w;
}

// A case of T tokens, K slots, E experts and H channels: its slots and validity; weights and rows
// (all zero) for the caller to fill.
CombineCase make_case(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int64_t hidden,
                      std::vector<std::int32_t> indices, std::vector<char> valid) {
  CombineCase c;
  c.tokens = tokens;
  c.top_k = top_k;
  c.experts = experts;
  c.hidden = hidden;
  c.indices = std::move(indices);
  c.valid = std::move(valid);
  c.row.assign(static_cast<std::size_t>(tokens * experts * hidden), 0.0f);
  return c;
}

constexpr float kBig = 134217728.0f;  // 2^27: its fp32 ulp is 16, so kBig + 1 rounds back to kBig

// fp32. Per token and channel the three contributions are an arrangement of {B, 1, -B}: the fp32
// sum in ascending expert id is 0 or 1 depending on where the 1 sits, the exact (double) sum is 1.
// Token 0: slots in descending expert id {3,1,0}; token 1: invalid; token 2: slots {1,3,2}.
CombineCase order_case(bool weight_after_down) {
  CombineCase c = make_case(3, 3, 4, 2, {3, 1, 0, /*token 1*/ 2, 0, 1, /*token 2*/ 1, 3, 2}, {1, 0, 1});
  c.weights = weight_after_down ? std::vector<float>{2.0f, 0.5f, 4.0f, 1.0f, 1.0f, 1.0f, 0.25f, 8.0f, 2.0f}
                                : std::vector<float>{0.3f, 0.3f, 0.4f, 0.3f, 0.3f, 0.4f, 0.3f, 0.3f, 0.4f};
  const float B = kBig;
  // token 0, ascending e0,e1,e3 / slot order e3,e1,e0.
  //   ch0 {B, 1, -B}: ascending (B+1)-B = 0, slot (-B+1)+B = 0, double 1.
  //   ch1 {B, -B, 1}: ascending (B-B)+1 = 1, slot (1-B)+B = 0, double 1.
  set_row(c, weight_after_down, 0, 0, B, B);
  set_row(c, weight_after_down, 0, 1, 1.0f, -B);
  set_row(c, weight_after_down, 0, 3, -B, 1.0f);
  // token 1 is invalid: nonzero rows that must not reach the output.
  set_row(c, weight_after_down, 1, 0, 5.0f, 7.0f);
  set_row(c, weight_after_down, 1, 1, -3.0f, 2.0f);
  set_row(c, weight_after_down, 1, 2, 1.5f, 9.0f);
  // token 2, ascending e1,e2,e3 / slot order e1,e3,e2.
  //   ch0 {B, -B, 1}: ascending 1, slot (B+1)-B = 0, double 1.
  //   ch1 {B, 1, -B}: ascending 0, slot (B-B)+1 = 1, double 1.
  set_row(c, weight_after_down, 2, 1, B, B);
  set_row(c, weight_after_down, 2, 2, -B, 1.0f);
  set_row(c, weight_after_down, 2, 3, 1.0f, -B);
  return c;
}

// bf16: one token with slots {2,1,0}, one invalid token.
//   ch0 {1, 2^-8, 2^-8}: fp32 sum 1 + 2^-7 is a bf16 value; rounding after each add gives
//       round(1 + 2^-8) = 1 (tie to even), then 1 again.
//   ch1 {B, -B, 1}: ascending (B-B)+1 = 1, slot order (1-B)+B = 0.
CombineCase rounding_case(bool weight_after_down) {
  CombineCase c = make_case(2, 3, 3, 2, {2, 1, 0, /*token 1*/ 0, 1, 2}, {1, 0});
  c.weights = weight_after_down ? std::vector<float>{0.5f, 2.0f, 4.0f, 1.0f, 1.0f, 1.0f}
                                : std::vector<float>{0.2f, 0.3f, 0.5f, 0.2f, 0.3f, 0.5f};
  const float tiny = 1.0f / 256.0f;  // 2^-8
  set_row(c, weight_after_down, 0, 0, 1.0f, kBig);
  set_row(c, weight_after_down, 0, 1, tiny, -kBig);
  set_row(c, weight_after_down, 0, 2, tiny, 1.0f);
  for (std::int64_t e = 0; e < 3; ++e) set_row(c, weight_after_down, 1, e, 0.75f, -0.5f);
  return c;
}

// ------------------------------------------------------------------------------------------------
// RoPE (§10.1.11)

struct HalfTables {
  std::vector<float> cos, sin;  // [tokens, D/2]
};

// The spec: angle = pos · inv_freq as a float product; cos/sin of the float angle, the fp32 values
// nearest them (double libm rounded once).
HalfTables fp32_tables(const std::vector<std::int64_t>& pos, const std::vector<float>& inv_freq) {
  HalfTables tb;
  for (std::int64_t p : pos) {
    for (float inv : inv_freq) {
      const float angle = static_cast<float>(p) * inv;
      tb.cos.push_back(static_cast<float>(std::cos(static_cast<double>(angle))));  // the fp32 nearest cos(angle)
      tb.sin.push_back(static_cast<float>(std::sin(static_cast<double>(angle))));
    }
  }
  return tb;
}

// Mutation: the fp32 inv_freq, but the angle and cos/sin in double.
HalfTables double_angle_tables(const std::vector<std::int64_t>& pos, const std::vector<float>& inv_freq) {
  HalfTables tb;
  for (std::int64_t p : pos) {
    for (float inv : inv_freq) {
      const double angle = static_cast<double>(p) * static_cast<double>(inv);
      tb.cos.push_back(static_cast<float>(std::cos(angle)));
      tb.sin.push_back(static_cast<float>(std::sin(angle)));
    }
  }
  return tb;
}

// Mutation: inv_freq, angle and cos/sin all in double, rounded to float at the end.
HalfTables double_tables(const std::vector<std::int64_t>& pos, double theta, std::int64_t head_dim) {
  HalfTables tb;
  for (std::int64_t p : pos) {
    for (std::int64_t i = 0; i < head_dim / 2; ++i) {
      const double inv = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(p) * inv;
      tb.cos.push_back(static_cast<float>(std::cos(angle)));
      tb.sin.push_back(static_cast<float>(std::sin(angle)));
    }
  }
  return tb;
}

// NeoX rotate-half in fp32 with the duplicated-half table: channels i and i + D/2 use angle i.
std::vector<float> rotate(const std::vector<float>& x, const HalfTables& tb, std::int64_t tokens, std::int64_t heads,
                          std::int64_t head_dim) {
  const std::int64_t half = head_dim / 2;
  std::vector<float> y(x.size());
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t base = (t * heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const float c = tb.cos[t * half + i], s = tb.sin[t * half + i];
        const float lo = x[base + i], hi = x[base + i + half];
        y[base + i] = lo * c - hi * s;
        y[base + i + half] = hi * c + lo * s;
      }
    }
  }
  return y;
}

// Elements of tokens [t0, t1) where a and b differ in their bits.
std::int64_t count_different(const std::vector<float>& a, const std::vector<float>& b, std::int64_t t0,
                             std::int64_t t1, std::int64_t row) {
  std::int64_t n = 0;
  for (std::int64_t i = t0 * row; i < t1 * row; ++i) n += bits(a[i]) != bits(b[i]) ? 1 : 0;
  return n;
}

}  // namespace

// Fails when the combine (kernels/cpu/experts.hpp combine_rows) sums in slot order (iterating j
// instead of slots_by_expert: token 0 ch1, token 2 both channels), accumulates in double and
// rounds at the end (token 0 ch0, token 2 ch1), rounds after every add in bf16 (ch0 of the bf16
// case), or lets an invalid token's rows through.
TEST_CASE("spec numerics: expert combine sums in fp32 in ascending expert id and rounds once",
          "[experts][spec]") {
  SECTION("combine_forward on given expert rows") {
    for (bool after : {false, true}) {
      INFO((after ? "weight after down" : "weight before down"));
      ExpertsConfig cfg;
      cfg.weight_after_down = after;

      // fp32: order and accumulator precision.
      const CombineCase c = order_case(after);
      const std::vector<float> ref = reference_combine(c, cfg, SumOrder::ascending_fp32);
      // The reference itself, by hand (see order_case).
      CHECK(ref == std::vector<float>{0.0f, 1.0f, /*invalid*/ 0.0f, 0.0f, 1.0f, 0.0f});
      // The case tells the variants apart.
      CHECK_FALSE(same_bits(reference_combine(c, cfg, SumOrder::slot_fp32), ref));
      CHECK_FALSE(same_bits(reference_combine(c, cfg, SumOrder::ascending_double), ref));
      const std::vector<float> got = kernel_combine(c, cfg);
      CHECK(same_bits(got, ref));
      // The invalid token: routed, not dispatched, exactly 0.
      CHECK(got[1 * 2 + 0] == 0.0f);
      CHECK(got[1 * 2 + 1] == 0.0f);

      // bf16: the fp32 sum is rounded once.
      ExpertsConfig lo = cfg;
      lo.precision = Precision::bf16;
      const CombineCase r = rounding_case(after);
      const std::vector<float> ref_lo = reference_combine(r, lo, SumOrder::ascending_fp32);
      CHECK(ref_lo == std::vector<float>{1.0078125f, 1.0f, /*invalid*/ 0.0f, 0.0f});
      CHECK_FALSE(same_bits(reference_combine(r, lo, SumOrder::ascending_round_each), ref_lo));
      CHECK_FALSE(same_bits(reference_combine(r, lo, SumOrder::slot_fp32), ref_lo));
      const std::vector<float> got_lo = kernel_combine(r, lo);
      CHECK(same_bits(got_lo, ref_lo));
      CHECK(got_lo[2] == 0.0f);
      CHECK(got_lo[3] == 0.0f);
    }
  }

  // The same order through experts_forward (dispatch -> grouped experts -> combine). Every token
  // has x = (1, 0.5) and every expert gate_up = [[1,1],[0,0]], so each expert's activation is
  // a = silu(1); down rows are e0 (B, B), e1 (1, -B), e2 (-B, 1), so the expert outputs are a·down:
  // an arrangement of {aB, a, -aB} per channel, which cancels like the case above.
  SECTION("through experts_forward") {
    const std::int64_t T = 3, K = 3, E = 3, H = 2, I = 1;
    const float B = kBig;
    ExpertsConfig cfg;
    const Tensor x = Tensor::from_floats({T, H}, std::vector<float>{1.0f, 0.5f, 1.0f, 0.5f, 1.0f, 0.5f});
    std::vector<float> gu;
    for (std::int64_t e = 0; e < E; ++e) gu.insert(gu.end(), {1.0f, 1.0f, 0.0f, 0.0f});
    const Tensor gate_up = Tensor::from_floats({E, H, 2 * I}, gu);
    const Tensor down = Tensor::from_floats({E, I, H}, std::vector<float>{B, B, 1.0f, -B, -B, 1.0f});
    CombineCase c = make_case(T, K, E, H, {2, 1, 0, /*invalid*/ 1, 0, 2, /*token 2*/ 0, 2, 1}, {1, 0, 1});
    c.weights.assign(static_cast<std::size_t>(T * K), 1.0f);
    const ExpertsForward f = experts_forward(x, gate_up, down, indices_tensor(c),
                                             Tensor::from_floats({T, K}, c.weights), mask_tensor(c), cfg);
    // The reference combines the kernel's own expert outputs (down_out, one row per dispatched pair).
    const std::int64_t* pair_row = f.saved.dispatch.pair_row.data<std::int64_t>();
    const float* down_out = f.saved.experts.down_out.data<float>();
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t j = 0; j < K; ++j) {
        const std::int64_t row = pair_row[t * K + j];
        if (row < 0) continue;
        for (std::int64_t ch = 0; ch < H; ++ch) c.row[(t * E + c.indices[t * K + j]) * H + ch] = down_out[row * H + ch];
      }
    }
    const std::vector<float> ref = reference_combine(c, cfg, SumOrder::ascending_fp32);
    CHECK_FALSE(same_bits(reference_combine(c, cfg, SumOrder::slot_fp32), ref));
    CHECK_FALSE(same_bits(reference_combine(c, cfg, SumOrder::ascending_double), ref));
    const std::vector<float> got = floats_of(f.out);
    CHECK(same_bits(got, ref));
    // ch0 cancels to 0 in fp32 on both valid tokens; ch1 is a (expert 2's channel 1) on token 0.
    CHECK(got[0] == 0.0f);
    CHECK(got[1] == c.row[(0 * E + 2) * H + 1]);
    CHECK(got[1] != 0.0f);
    CHECK(got[2] == 0.0f);  // invalid token
    CHECK(got[3] == 0.0f);
  }

  // Shared experts: every token, valid or not, weight 1, added in fp32 (rounded once in bf16).
  // The kernels test binary does not link moe_combine_forward (graph/models/moe_mlp.cpp), which adds
  // them with scaled_add(routed, 1, shared, 1, precision): this checks that kernel. (A single fp32
  // add of two floats cannot differ from the same add done in double and rounded to float.)
  SECTION("shared experts are added with weight 1 in fp32") {
    const std::vector<float> routed{0.0f, 1.0f, /*invalid token*/ 0.0f, 0.0f, 3.5f, -2.25f};
    const std::vector<float> shared{0.1f, -0.3f, 0.7f, 1.25f, 1e-7f, 2e8f};
    const Tensor sum = scaled_add(Tensor::from_floats({3, 2}, routed), 1.0f, Tensor::from_floats({3, 2}, shared), 1.0f,
                                  Precision::fp32);
    for (std::size_t i = 0; i < routed.size(); ++i) {
      CHECK(bits(sum.data<float>()[i]) == bits(routed[i] + shared[i]));
    }
    CHECK(sum.data<float>()[2] == shared[2]);  // the invalid token gets the shared expert's output
    CHECK(sum.data<float>()[3] == shared[3]);
    // bf16: 1 + (2^-8 + 2^-20) is above the bf16 tie at 1 + 2^-8, so one rounding of the fp32 sum
    // gives 1 + 2^-7; rounding the addend first (2^-8) would land on the tie and give 1. (In the
    // model the shared output is a bulk linear output, already bf16: this checks the add itself.)
    const float s = 1.0f / 256.0f + 1.0f / 1048576.0f;
    const Tensor lo = scaled_add(Tensor::from_floats({1}, std::vector<float>{1.0f}), 1.0f,
                                 Tensor::from_floats({1}, std::vector<float>{s}), 1.0f, Precision::bf16);
    CHECK(bits(lo.data<float>()[0]) == bits(round_to_bf16(1.0f + s)));
    CHECK(lo.data<float>()[0] == 1.0078125f);
    CHECK(round_to_bf16(1.0f + round_to_bf16(s)) == 1.0f);
  }
}

// inv_freq: MODELS.md §10.1.11 writes θ^(-2i/D) in fp32 and does not fix how that fp32 value is
// evaluated. The kernel (kernels/cpu/rope.hpp RopeHalfTables) uses 1 / pow(θ, 2i/D), as HF's
// `1.0 / base**(arange(0, D, 2) / D)`; the literal pow(θ, -2i/D) may differ from it by an ulp. So
// each frequency of rope_forward's output must match, bitwise, one of the two fp32 evaluations
// (pinning the fp32 angle and tables, not the pow form). The angle pos·inv_freq is a float
// product, and cos/sin are the fp32 values nearest the cosine and sine of the float angle: libm's
// double functions rounded once (kernels/cpu/libm_float.hpp; glibc's cosf/sinf differ from those
// in the last bit at some of these positions, and glibc's float functions change between
// releases). Fails if the angle (or inv_freq and angle) is computed in double: at positions
// 4000..4100 and near 30000 that moves cos/sin by far more than an ulp, which the test checks on
// the double variants.
TEST_CASE("spec numerics: rope inv_freq and angles are fp32 at large positions", "[rope][spec]") {
  // Through a volatile so that the compiler cannot fold std::pow / std::cos below at compile time
  // (GCC folds with correctly rounded MPFR; the kernel calls libm at run time).
  volatile float theta_in = 10000.0f;
  const float theta = theta_in;
  std::vector<std::int64_t> pos;
  for (std::int64_t p = 4000; p <= 4100; ++p) pos.push_back(p);
  const std::int64_t block = static_cast<std::int64_t>(pos.size());  // tokens [0, block): 4000..4100
  pos.push_back(29999);
  pos.push_back(30011);
  const std::int64_t T = static_cast<std::int64_t>(pos.size()), heads = 2;
  Tensor positions = Tensor::empty({T}, DType::i64);
  for (std::int64_t t = 0; t < T; ++t) positions.data<std::int64_t>()[t] = pos[t];

  for (const std::int64_t D : {std::int64_t{8}, std::int64_t{64}}) {
    INFO("head dim " << D);
    const std::int64_t half = D / 2, row = heads * D;
    // Head 0: random values. Head 1: (1,...,1, 0,...,0), whose rotation is (cos, sin) itself.
    const auto r = atl::testing::random_vector(static_cast<std::size_t>(T * D), 17 + static_cast<std::uint64_t>(D));
    std::vector<float> x(static_cast<std::size_t>(T * row));
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t d = 0; d < D; ++d) {
        x[t * row + d] = static_cast<float>(r[t * D + d]);
        x[t * row + D + d] = d < half ? 1.0f : 0.0f;
      }
    }
    const std::vector<float> y = floats_of(rope_forward(Tensor::from_floats({T, heads, D}, x), positions, theta));

    std::vector<float> inv_pow(static_cast<std::size_t>(half)), inv_recip(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(D);  // exact: D is a power of two
      inv_pow[i] = static_cast<float>(std::pow(double{theta}, double{-e}));      // θ^(-2i/D), literally
      inv_recip[i] = 1.0f / static_cast<float>(std::pow(double{theta}, double{e}));  // HF's form
    }
    const HalfTables ref_pow = fp32_tables(pos, inv_pow), ref_recip = fp32_tables(pos, inv_recip);
    const std::vector<float> y_pow = rotate(x, ref_pow, T, heads, D), y_recip = rotate(x, ref_recip, T, heads, D);

    std::vector<float> inv_kernel(static_cast<std::size_t>(half));  // the form that matched, per frequency
    for (std::int64_t i = 0; i < half; ++i) {
      bool pow_ok = true, recip_ok = true;
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t h = 0; h < heads; ++h) {
          for (std::int64_t d : {i, i + half}) {
            const std::int64_t k = t * row + h * D + d;
            pow_ok = pow_ok && bits(y[k]) == bits(y_pow[k]);
            recip_ok = recip_ok && bits(y[k]) == bits(y_recip[k]);
          }
        }
      }
      INFO("frequency " << i);
      CHECK((pow_ok || recip_ok));
      inv_kernel[i] = pow_ok ? inv_pow[i] : inv_recip[i];
    }

    // A double angle would give other bits here, at 4000..4100 and near 30000 alike.
    const std::vector<float> y_double = rotate(x, double_tables(pos, 10000.0, D), T, heads, D);
    const std::vector<float> y_double_angle = rotate(x, double_angle_tables(pos, inv_kernel), T, heads, D);
    CHECK(count_different(y, y_double, 0, block, row) > 0);
    CHECK(count_different(y, y_double, block, T, row) > 0);
    CHECK(count_different(y, y_double_angle, 0, block, row) > 0);
    CHECK(count_different(y, y_double_angle, block, T, row) > 0);
  }
}

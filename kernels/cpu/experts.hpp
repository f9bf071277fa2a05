// Grouped MoE experts inside one process (MODELS.md §0.5, §10.1.8, §10.1.12), raw pointers, T = float
// or double. Per dispatched (token t, slot j) with expert e = indices[t,j], weight w = weights[t,j]:
//   h = x[t] @ gate_up[e] ([H,2I], native layout), a = act(h), y = (w·a) @ down[e] (weight before
//   down, default) or y = w·(a @ down[e]) (weight after down); out[t] = Σ_j y, summed in fp32 in
//   ascending expert id and rounded once. Tokens with token_mask false are routed but not dispatched:
//   their output is exactly 0 and they produce no gradient.
// Dispatch: the (token, slot) pairs are sorted by expert (stable, so by pair id inside an expert),
// each expert's rows are gathered and multiplied with one gemm. The flow is three steps
// (dispatch -> grouped experts -> combine, below) that expert parallelism can run on different
// ranks; experts_forward / experts_backward compose them in one process.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct ExpertsConfig {
  GluActivation activation = GluActivation::swiglu;
  GluLayout layout = GluLayout::concatenated;
  bool weight_after_down = false;  // apply_router_weight_after_down
  float beta_gate = 4.0f;          // situ only
  float beta_up = 25.0f;
  Precision precision = Precision::fp32;

  GluConfig glu() const { return GluConfig{activation, layout, beta_gate, beta_up}; }
};

namespace cpu {

struct ExpertsDims {
  std::int64_t tokens = 0, top_k = 0, experts = 0, hidden = 0, inter = 0;
};

// Which rows each expert gets. A "pair" is p = t*K + j; a "row" is a dispatched pair's place in
// expert-sorted order.
struct DispatchPlan {
  std::vector<std::int64_t> row_pair;        // [P] pair of each dispatched row, grouped by expert
  std::vector<std::int64_t> expert_offsets;  // [E+1] rows of expert e: [offsets[e], offsets[e+1])
  std::vector<std::int64_t> pair_row;        // [T*K] row of each pair, -1 if its token is masked out
};

// Raw-pointer view of a plan (so Tensor-level callers can keep it in tensors).
struct DispatchView {
  const std::int32_t* indices;         // [T,K]
  const std::int64_t* row_pair;        // [P]
  const std::int64_t* expert_offsets;  // [E+1]
  const std::int64_t* pair_row;        // [T*K]
};

inline DispatchView view_of(const DispatchPlan& plan, const std::int32_t* indices) {
  return {indices, plan.row_pair.data(), plan.expert_offsets.data(), plan.pair_row.data()};
}

// token_mask may be null (every token dispatched). Throws on an expert id outside [0, E).
inline DispatchPlan plan_dispatch(const std::int32_t* indices, const bool* token_mask, const ExpertsDims& d) {
  const std::int64_t pairs = d.tokens * d.top_k;
  DispatchPlan plan;
  plan.expert_offsets.assign(static_cast<std::size_t>(d.experts + 1), 0);
  plan.pair_row.assign(static_cast<std::size_t>(pairs), -1);
  for (std::int64_t p = 0; p < pairs; ++p) {
    const std::int64_t e = indices[p];
    if (e < 0 || e >= d.experts) {
      throw std::invalid_argument("experts: expert index " + std::to_string(e) + " at pair " + std::to_string(p) +
                                  " outside [0, " + std::to_string(d.experts) + ")");
    }
    if (!token_mask || token_mask[p / d.top_k]) ++plan.expert_offsets[static_cast<std::size_t>(e + 1)];
  }
  for (std::int64_t e = 0; e < d.experts; ++e) plan.expert_offsets[e + 1] += plan.expert_offsets[e];
  plan.row_pair.resize(static_cast<std::size_t>(plan.expert_offsets[d.experts]));
  std::vector<std::int64_t> next(plan.expert_offsets.begin(), plan.expert_offsets.end() - 1);
  for (std::int64_t p = 0; p < pairs; ++p) {  // counting sort: stable in p
    if (token_mask && !token_mask[p / d.top_k]) continue;
    const std::int64_t row = next[indices[p]]++;
    plan.row_pair[row] = p;
    plan.pair_row[p] = row;
  }
  return plan;
}

// Slots of token t in ascending expert id (ties by slot): the combine order. The order is total,
// so std::sort gives it without stable_sort's buffer (one allocation per token).
inline void slots_by_expert(const std::int32_t* idx_row, std::int64_t k, std::vector<std::int64_t>& slots) {
  slots.resize(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) slots[j] = j;
  std::sort(slots.begin(), slots.end(), [&](std::int64_t a, std::int64_t b) {
    return idx_row[a] < idx_row[b] || (idx_row[a] == idx_row[b] && a < b);
  });
}

// The down projection's input when the routing weight comes first: rows [r0, r0+n) of the
// activation `a` (n x I) times their row's weight, rounded at the emulation point, into `out`.
template <class T>
const T* weighted_rows(const T* a, const T* w_rows, std::int64_t r0, std::int64_t n, std::int64_t I, Precision prec,
                       T* out) {
  for (std::int64_t r = 0; r < n; ++r) scaled_values(a + r * I, w_rows[r0 + r], out + r * I, I);
  round_emulated_values(prec, out, n * I);
  return out;
}

// The most rows any of the experts owns: the size of the per-expert work buffers.
inline std::int64_t most_expert_rows(const std::int64_t* offsets, std::int64_t experts) {
  std::int64_t most = 0;
  for (std::int64_t e = 0; e < experts; ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
  return most;
}

// The MoE token flow in three steps, so that expert parallelism can put its all-to-alls between
// them: dispatch (rows in expert-sorted order) -> grouped expert compute (on whichever rank owns
// the experts, which it indexes by local id) -> combine (the weighted sum over K on the tokens'
// rank). experts_forward / experts_backward below run the three in one process.

// 1. Dispatch: row r of x_rows [P,H] is x[token of row r]; w_rows [P] its routing weight.
template <class T>
void dispatch_rows(const T* x, const T* weights, const DispatchView& plan, std::int64_t rows, std::int64_t H,
                   std::int64_t K, T* x_rows, T* w_rows) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = plan.row_pair[r];
    const T* src = x + (p / K) * H;
    std::copy(src, src + H, x_rows + r * H);
    w_rows[r] = weights[p];
  }
}

// 2. Grouped expert MLPs. Local expert e (of `experts`) owns rows [offsets[e], offsets[e+1]);
// gate_up [experts,H,2I] and down [experts,I,H] hold those experts only. Writes, per row:
// gate_up_out [P,2I] (the activation input), act_out [P,I] (the unweighted activation) and
// down_out [P,H] (the down output; already weighted when the weight comes first). In precision
// bf16 the gate_up output, the activation, the weighted activation and the down output are
// rounded (MODELS.md §10.1.12).
template <class T>
void grouped_experts_forward(const T* x_rows, const T* w_rows, const std::int64_t* offsets, std::int64_t experts,
                             std::int64_t H, std::int64_t I, const T* gate_up, const T* down, const ExpertsConfig& cfg,
                             T* gate_up_out, T* act_out, T* down_out) {
  const Precision prec = cfg.precision;
  const GluConfig glu = cfg.glu();
  // Both forward products read bf16 values in precision bf16 (rounded inputs, bf16 weights).
  const GemmOperands operands = gemm_operands(prec);
  const bool round_out = prec == Precision::bf16;  // both outputs rounded by the GEMM (gemm.hpp)
  // Fully written before each read: no zeroing (make_unique_for_overwrite).
  const auto most = static_cast<std::size_t>(most_expert_rows(offsets, experts) * I);
  const auto a_in = std::make_unique_for_overwrite<T[]>(most);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e] - offsets[0], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    T* h = gate_up_out + r0 * 2 * I;
    gemm<T>(false, false, n, 2 * I, H, x_rows + r0 * H, H, gate_up + e * H * 2 * I, 2 * I, false, h, 2 * I, operands,
            round_out);
    T* a = act_out + r0 * I;
    glu_forward(h, n, I, glu, prec, a);
    const T* down_in = cfg.weight_after_down ? a : weighted_rows(a, w_rows, r0, n, I, prec, a_in.get());
    T* y = down_out + r0 * H;
    gemm<T>(false, false, n, H, I, down_in, I, down + e * I * H, H, false, y, H, operands, round_out);
  }
}

// 3. Combine: out [T,H] (overwritten) = for each token, the sum of its slots' rows in ascending
// expert id, in fp32, rounded once; with the weight after down each row is first multiplied by
// its weight and rounded. Masked tokens (no rows) get exactly 0.
template <class T>
void combine_rows(const T* down_out, const T* weights, const DispatchView& plan, const ExpertsDims& d,
                  const ExpertsConfig& cfg, T* out) {
  const std::int64_t H = d.hidden, K = d.top_k;
  const Precision prec = cfg.precision;
  std::vector<std::int64_t> slots;
  std::vector<T> weighted(static_cast<std::size_t>(H));
  for (std::int64_t t = 0; t < d.tokens; ++t) {
    T* o = out + t * H;
    std::fill(o, o + H, T(0));
    slots_by_expert(plan.indices + t * K, K, slots);
    for (std::int64_t j : slots) {
      const std::int64_t row = plan.pair_row[t * K + j];
      if (row < 0) continue;
      const T* y = down_out + row * H;
      if (cfg.weight_after_down) {
        scaled_values(y, weights[t * K + j], weighted.data(), H);
        round_emulated_values(prec, weighted.data(), H);
        y = weighted.data();
      }
      add_values(o, y, H);
    }
  }
  round_emulated_values(prec, out, d.tokens * H);
}

// 3'. Combine backward: d_rows [P,H] is the gradient at each row's down output. With the weight
// after down: d_weights[p] = g.y and d_rows = w g; otherwise d_rows = g. d_weights [T,K] is
// overwritten where the weight comes after down (zero elsewhere).
template <class T>
void combine_backward(const T* d_out, const T* weights, const T* down_out, const DispatchView& plan,
                      const ExpertsDims& d, std::int64_t rows, const ExpertsConfig& cfg, T* d_rows, T* d_weights) {
  const std::int64_t H = d.hidden, K = d.top_k;
  std::fill(d_weights, d_weights + d.tokens * K, T(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = plan.row_pair[r];
    const T* g = d_out + (p / K) * H;
    T* dy = d_rows + r * H;
    if (cfg.weight_after_down) {
      const T* y = down_out + r * H;
      T dot = 0;
      for (std::int64_t c = 0; c < H; ++c) dot += g[c] * y[c];
      d_weights[p] = dot;
      const T w = weights[p];
      for (std::int64_t c = 0; c < H; ++c) dy[c] = w * g[c];
    } else {
      std::copy(g, g + H, dy);
    }
  }
}

// dots[r] = sum_i x[r*n_cols + i] * y[r*n_cols + i] for r < rows, each row one chain in i order
// (multiply, then add: no FMA). Eight rows at a time: their chains are independent, so they
// overlap instead of each waiting on the add before it.
template <class T>
void row_dots(const T* x, const T* y, std::int64_t rows, std::int64_t n_cols, T* dots) {
  constexpr std::int64_t kRows = 8;
  std::int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    T acc[kRows] = {};
    for (std::int64_t i = 0; i < n_cols; ++i) {
      for (std::int64_t j = 0; j < kRows; ++j) acc[j] += x[(r + j) * n_cols + i] * y[(r + j) * n_cols + i];
    }
    for (std::int64_t j = 0; j < kRows; ++j) dots[r + j] = acc[j];
  }
  for (; r < rows; ++r) {
    T acc = 0;
    for (std::int64_t i = 0; i < n_cols; ++i) acc += x[r * n_cols + i] * y[r * n_cols + i];
    dots[r] = acc;
  }
}

// 2'. Grouped expert backward over the rows of local experts (as in forward). d_x_rows [P,H] and
// d_w_rows [P] (the weight's gradient when it comes first; 0 otherwise) are overwritten; d_gate_up
// and d_down are accumulated. Roundings are straight-through; in precision bf16 the products read
// the gradients as bf16 (as the forward products read their inputs).
template <class T>
void grouped_experts_backward(const T* d_rows, const T* x_rows, const T* w_rows, const std::int64_t* offsets,
                              std::int64_t experts, std::int64_t H, std::int64_t I, const T* gate_up, const T* down,
                              const ExpertsConfig& cfg, const T* gate_up_out, const T* act_out, T* d_x_rows,
                              T* d_w_rows, T* d_gate_up, T* d_down) {
  const Precision prec = cfg.precision;
  const GluConfig glu = cfg.glu();
  const GemmOperands operands = gemm_operands(prec);
  std::fill(d_w_rows, d_w_rows + (offsets[experts] - offsets[0]), T(0));
  // Per-expert buffers, fully written before each read: no zeroing (make_unique_for_overwrite).
  const auto most = static_cast<std::size_t>(most_expert_rows(offsets, experts) * I);
  const auto a_in = std::make_unique_for_overwrite<T[]>(most), da = std::make_unique_for_overwrite<T[]>(most),
             dh = std::make_unique_for_overwrite<T[]>(2 * most);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e] - offsets[0], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const T* a = act_out + r0 * I;
    const T* dy = d_rows + r0 * H;
    // The down projection's input, as in forward.
    const T* down_in = cfg.weight_after_down ? a : weighted_rows(a, w_rows, r0, n, I, prec, a_in.get());
    gemm<T>(true, false, I, H, n, down_in, I, dy, H, true, d_down + e * I * H, H, operands);
    gemm<T>(false, true, n, I, H, dy, H, down + e * I * H, H, false, da.get(), I, operands);
    if (!cfg.weight_after_down) {
      row_dots(da.get(), a, n, I, d_w_rows + r0);
      for (std::int64_t r = 0; r < n; ++r) scaled_values(da.get() + r * I, w_rows[r0 + r], da.get() + r * I, I);
    }
    glu_backward(da.get(), gate_up_out + r0 * 2 * I, n, I, glu, dh.get());
    gemm<T>(true, false, H, 2 * I, n, x_rows + r0 * H, H, dh.get(), 2 * I, true, d_gate_up + e * H * 2 * I, 2 * I,
            operands);
    gemm<T>(false, true, n, H, 2 * I, dh.get(), 2 * I, gate_up + e * H * 2 * I, 2 * I, false, d_x_rows + r0 * H, H,
            operands);
  }
}

// 1'. Dispatch backward: dx [T,H] (overwritten) sums each token's rows in row order, i.e. in
// ascending expert id; d_weights[p] = d_w_rows[row of p] where the weight comes before down.
template <class T>
void dispatch_backward(const T* d_x_rows, const T* d_w_rows, const DispatchView& plan, const ExpertsDims& d,
                       std::int64_t rows, const ExpertsConfig& cfg, T* dx, T* d_weights) {
  const std::int64_t H = d.hidden;
  std::fill(dx, dx + d.tokens * H, T(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = plan.row_pair[r];
    T* dst = dx + (p / d.top_k) * H;
    const T* src = d_x_rows + r * H;
    add_values(dst, src, H);
    if (!cfg.weight_after_down) d_weights[p] = d_w_rows[r];
  }
}

// The three steps in one process, on raw pointers (the tests' double-precision reference).
// Forward saves, per dispatched row: gate_up_out [P,2I], act_out [P,I] and down_out [P,H]; out
// [T,H] is overwritten (MODELS.md §10.1.8, §10.1.12).
template <class T>
void experts_forward(const T* x, const T* gate_up, const T* down, const T* weights, const DispatchView& plan,
                     const ExpertsDims& d, const ExpertsConfig& cfg, T* gate_up_out, T* act_out, T* down_out, T* out) {
  const std::int64_t rows = plan.expert_offsets[d.experts];
  std::vector<T> x_rows(static_cast<std::size_t>(rows * d.hidden)), w_rows(static_cast<std::size_t>(rows));
  dispatch_rows(x, weights, plan, rows, d.hidden, d.top_k, x_rows.data(), w_rows.data());
  grouped_experts_forward(x_rows.data(), w_rows.data(), plan.expert_offsets, d.experts, d.hidden, d.inter, gate_up,
                          down, cfg, gate_up_out, act_out, down_out);
  combine_rows(down_out, weights, plan, d, cfg, out);
}

// Backward in one process. dx [T,H] and d_weights [T,K] are overwritten (zero for masked tokens);
// d_gate_up [E,H,2I] and d_down [E,I,H] are accumulated.
template <class T>
void experts_backward(const T* d_out, const T* x, const T* gate_up, const T* down, const T* weights,
                      const DispatchView& plan, const ExpertsDims& d, const ExpertsConfig& cfg, const T* gate_up_out,
                      const T* act_out, const T* down_out, T* dx, T* d_weights, T* d_gate_up, T* d_down) {
  const std::int64_t rows = plan.expert_offsets[d.experts], H = d.hidden;
  const auto n = static_cast<std::size_t>(rows);
  std::vector<T> x_rows(n * H), w_rows(n), d_rows(n * H), d_x_rows(n * H), d_w_rows(n);
  dispatch_rows(x, weights, plan, rows, H, d.top_k, x_rows.data(), w_rows.data());
  combine_backward(d_out, weights, down_out, plan, d, rows, cfg, d_rows.data(), d_weights);
  grouped_experts_backward(d_rows.data(), x_rows.data(), w_rows.data(), plan.expert_offsets, d.experts, H, d.inter,
                           gate_up, down, cfg, gate_up_out, act_out, d_x_rows.data(), d_w_rows.data(), d_gate_up,
                           d_down);
  dispatch_backward(d_x_rows.data(), d_w_rows.data(), plan, d, rows, cfg, dx, d_weights);
}

}  // namespace cpu
}  // namespace atl

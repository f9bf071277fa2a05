// Grouped MoE experts inside one process (MODELS.md §0.5, §10.1.8, §10.1.12), raw pointers, T = float
// or double. Per dispatched (token t, slot j) with expert e = indices[t,j], weight w = weights[t,j]:
//   h = x[t] @ gate_up[e] ([H,2I], native layout), a = act(h), y = (w·a) @ down[e] (weight before
//   down, default) or y = w·(a @ down[e]) (weight after down); out[t] = Σ_j y, summed in fp32 in
//   ascending expert id and rounded once. Tokens with token_mask false are routed but not dispatched:
//   their output is exactly 0 and they produce no gradient.
// Dispatch: the (token, slot) pairs are sorted by expert (stable, so by pair id inside an expert),
// each expert's rows are gathered and multiplied with one gemm.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/activation.hpp"
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

// Slots of token t in ascending expert id (ties by slot): the combine order.
inline void slots_by_expert(const std::int32_t* idx_row, std::int64_t k, std::vector<std::int64_t>& slots) {
  slots.resize(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) slots[j] = j;
  std::stable_sort(slots.begin(), slots.end(), [&](std::int64_t a, std::int64_t b) { return idx_row[a] < idx_row[b]; });
}

// The down projection's input when the routing weight comes first: rows [r0, r0+n) of the
// activation `a` (n x I) times their pair's weight, rounded at the emulation point, into `out`.
template <class T>
const T* weighted_rows(const T* a, const T* weights, const DispatchView& plan, std::int64_t r0, std::int64_t n,
                       std::int64_t I, Precision prec, std::vector<T>& out) {
  out.resize(static_cast<std::size_t>(n * I));
  for (std::int64_t r = 0; r < n; ++r) {
    const T w = weights[plan.row_pair[r0 + r]];
    for (std::int64_t i = 0; i < I; ++i) out[static_cast<std::size_t>(r * I + i)] = a[r * I + i] * w;
  }
  round_emulated_values(prec, out.data(), n * I);
  return out.data();
}

// Forward. Saves, per dispatched row: gate_up_out [P,2I] (the activation input), act_out [P,I] (the
// unweighted activation) and down_out [P,H] (the down-projection output, before the weight when
// weight_after_down). out [T,H] is overwritten. In precision bf16 the gate_up output, the
// activation, the weighted activation (weight before down), the down-projection output, the
// weighted down output w·y (weight after down) and the combined output are rounded; the sum over
// the K slots is fp32 (MODELS.md §10.1.8, §10.1.12).
template <class T>
void experts_forward(const T* x, const T* gate_up, const T* down, const T* weights, const DispatchView& plan,
                     const ExpertsDims& d, const ExpertsConfig& cfg, T* gate_up_out, T* act_out, T* down_out, T* out) {
  const std::int64_t H = d.hidden, I = d.inter, K = d.top_k;
  const Precision prec = cfg.precision;
  const GluConfig glu = cfg.glu();
  // Both forward products read bf16 values in precision bf16 (rounded inputs, bf16 weights).
  const GemmOperands operands = gemm_operands(prec);
  std::vector<T> xs, a_in;
  for (std::int64_t e = 0; e < d.experts; ++e) {
    const std::int64_t r0 = plan.expert_offsets[e], n = plan.expert_offsets[e + 1] - r0;
    if (n == 0) continue;
    xs.resize(static_cast<std::size_t>(n * H));
    for (std::int64_t r = 0; r < n; ++r) {
      const T* src = x + (plan.row_pair[r0 + r] / K) * H;
      std::copy(src, src + H, xs.data() + r * H);
    }
    T* h = gate_up_out + r0 * 2 * I;
    gemm<T>(false, false, n, 2 * I, H, xs.data(), H, gate_up + e * H * 2 * I, 2 * I, false, h, 2 * I, operands);
    round_emulated_values(prec, h, n * 2 * I);
    T* a = act_out + r0 * I;
    glu_forward(h, n, I, glu, prec, a);
    const T* down_in = cfg.weight_after_down ? a : weighted_rows(a, weights, plan, r0, n, I, prec, a_in);
    T* y = down_out + r0 * H;
    gemm<T>(false, false, n, H, I, down_in, I, down + e * I * H, H, false, y, H, operands);
    round_emulated_values(prec, y, n * H);
  }
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
        const T w = weights[t * K + j];
        for (std::int64_t c = 0; c < H; ++c) weighted[c] = w * y[c];
        round_emulated_values(prec, weighted.data(), H);
        y = weighted.data();
      }
      for (std::int64_t c = 0; c < H; ++c) o[c] += y[c];
    }
  }
  round_emulated_values(prec, out, d.tokens * H);
}

// Backward. dx [T,H] and d_weights [T,K] are overwritten (zero for masked tokens); d_gate_up
// [E,H,2I] and d_down [E,I,H] are accumulated. Roundings are straight-through; gradients stay in T,
// and in precision bf16 the products read them as bf16 (as the forward products read their inputs).
template <class T>
void experts_backward(const T* d_out, const T* x, const T* gate_up, const T* down, const T* weights,
                      const DispatchView& plan, const ExpertsDims& d, const ExpertsConfig& cfg, const T* gate_up_out,
                      const T* act_out, const T* down_out, T* dx, T* d_weights, T* d_gate_up, T* d_down) {
  const std::int64_t H = d.hidden, I = d.inter, K = d.top_k;
  const Precision prec = cfg.precision;
  const GluConfig glu = cfg.glu();
  // The backward of bf16-operand products: the gradients entering them are read as bf16 too.
  const GemmOperands operands = gemm_operands(prec);
  std::fill(dx, dx + d.tokens * H, T(0));
  std::fill(d_weights, d_weights + d.tokens * K, T(0));
  std::vector<T> dy, a_in, da, dh, xs, dxs;
  for (std::int64_t e = 0; e < d.experts; ++e) {
    const std::int64_t r0 = plan.expert_offsets[e], n = plan.expert_offsets[e + 1] - r0;
    if (n == 0) continue;
    const T* a = act_out + r0 * I;
    // Gradient at the down output, and d_weights when the weight comes after down.
    dy.resize(static_cast<std::size_t>(n * H));
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t p = plan.row_pair[r0 + r];
      const T* g = d_out + (p / K) * H;
      if (cfg.weight_after_down) {
        const T* y = down_out + (r0 + r) * H;
        T dot = 0;
        for (std::int64_t c = 0; c < H; ++c) dot += g[c] * y[c];
        d_weights[p] = dot;
        const T w = weights[p];
        for (std::int64_t c = 0; c < H; ++c) dy[r * H + c] = w * g[c];
      } else {
        std::copy(g, g + H, dy.data() + r * H);
      }
    }
    // The down projection's input, as in forward.
    const T* down_in = cfg.weight_after_down ? a : weighted_rows(a, weights, plan, r0, n, I, prec, a_in);
    gemm<T>(true, false, I, H, n, down_in, I, dy.data(), H, true, d_down + e * I * H, H, operands);
    da.resize(static_cast<std::size_t>(n * I));
    gemm<T>(false, true, n, I, H, dy.data(), H, down + e * I * H, H, false, da.data(), I, operands);
    if (!cfg.weight_after_down) {
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t p = plan.row_pair[r0 + r];
        const T w = weights[p];
        T dot = 0;
        for (std::int64_t i = 0; i < I; ++i) {
          dot += da[r * I + i] * a[r * I + i];
          da[r * I + i] *= w;
        }
        d_weights[p] = dot;
      }
    }
    dh.resize(static_cast<std::size_t>(n * 2 * I));
    glu_backward(da.data(), gate_up_out + r0 * 2 * I, n, I, glu, dh.data());
    xs.resize(static_cast<std::size_t>(n * H));
    for (std::int64_t r = 0; r < n; ++r) {
      const T* src = x + (plan.row_pair[r0 + r] / K) * H;
      std::copy(src, src + H, xs.data() + r * H);
    }
    gemm<T>(true, false, H, 2 * I, n, xs.data(), H, dh.data(), 2 * I, true, d_gate_up + e * H * 2 * I, 2 * I, operands);
    dxs.resize(static_cast<std::size_t>(n * H));
    gemm<T>(false, true, n, H, 2 * I, dh.data(), 2 * I, gate_up + e * H * 2 * I, 2 * I, false, dxs.data(), H, operands);
    // Experts ascend, so each token's dx sums its slots in ascending expert id.
    for (std::int64_t r = 0; r < n; ++r) {
      T* dst = dx + (plan.row_pair[r0 + r] / K) * H;
      for (std::int64_t c = 0; c < H; ++c) dst[c] += dxs[r * H + c];
    }
  }
}

}  // namespace cpu
}  // namespace atl

#include "kernels/ops/experts.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

namespace {

void check_rank(const char* op, const char* name, const Tensor& t, std::int64_t rank, const char* expected) {
  if (!t.defined() || t.rank() != rank) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be " + expected + ", got " +
                                t.describe());
  }
}

Tensor i64_tensor(const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::i64);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(std::int64_t));
  return t;
}

cpu::DispatchView view(const ExpertDispatch& d) {
  return {d.indices.data<std::int32_t>(), d.row_pair.data<std::int64_t>(), d.expert_offsets.data<std::int64_t>(),
          d.pair_row.data<std::int64_t>()};
}

cpu::ExpertsDims dims(const ExpertDispatch& d, std::int64_t hidden, std::int64_t inter = 0) {
  return {d.indices.size(0), d.indices.size(1), d.experts(), hidden, inter};
}

struct ExpertWeightDims {
  std::int64_t n, H, I;
};

// The experts' sizes from their parameters, gate_up f32 [n,H,2I] and down f32 [n,I,H], both checked.
ExpertWeightDims expert_weight_dims(const char* op, const Tensor& gate_up, const Tensor& down) {
  check_rank(op, "gate_up", gate_up, 3, "f32 [n,H,2I]");
  const std::int64_t n = gate_up.size(0), H = gate_up.size(1);
  if (gate_up.size(2) % 2 != 0) {
    throw std::invalid_argument(std::string(op) + ": gate_up last dim must be even (2I), got " + gate_up.describe());
  }
  const std::int64_t I = gate_up.size(2) / 2;
  detail::require_tensor(op, "gate_up", gate_up, DType::f32, {n, H, 2 * I});
  detail::require_tensor(op, "down", down, DType::f32, {n, I, H});
  return {n, H, I};
}

}  // namespace

ExpertDispatch plan_expert_dispatch(const Tensor& indices, const Tensor& weights, const Tensor& token_mask,
                                    std::int64_t experts) {
  const char* op = "plan_expert_dispatch";
  check_rank(op, "indices", indices, 2, "i32 [T,K]");
  const std::int64_t T = indices.size(0), K = indices.size(1);
  detail::require_tensor(op, "indices", indices, DType::i32, {T, K});
  detail::require_tensor(op, "weights", weights, DType::f32, {T, K});
  if (token_mask.defined()) detail::require_tensor(op, "token_mask", token_mask, DType::boolean, {T});
  const cpu::DispatchPlan plan = cpu::plan_dispatch(indices.data<std::int32_t>(),
                                                    token_mask.defined() ? token_mask.data<bool>() : nullptr,
                                                    cpu::ExpertsDims{T, K, experts, 0, 0});
  return {indices, weights, i64_tensor(plan.row_pair), i64_tensor(plan.expert_offsets), i64_tensor(plan.pair_row)};
}

DispatchedRows dispatch_forward(const Tensor& x, const ExpertDispatch& dispatch) {
  KernelScope scope(KernelKind::experts);
  check_rank("dispatch_forward", "x", x, 2, "f32 [T,H]");
  const std::int64_t H = x.size(1), P = dispatch.rows();
  detail::require_tensor("dispatch_forward", "x", x, DType::f32, {dispatch.indices.size(0), H});
  DispatchedRows out{Tensor::empty({P, H}), Tensor::empty({P})};
  cpu::dispatch_rows(x.data<float>(), dispatch.weights.data<float>(), view(dispatch), P, H, dispatch.indices.size(1),
                     out.x_rows.data<float>(), out.w_rows.data<float>());
  return out;
}

void dispatch_backward(const Tensor& d_x_rows, const Tensor& d_w_rows, const ExpertDispatch& dispatch,
                       const ExpertsConfig& cfg, const Tensor& dx, const Tensor& d_weights) {
  KernelScope scope(KernelKind::experts);
  const char* op = "dispatch_backward";
  check_rank(op, "dx", dx, 2, "f32 [T,H]");
  const std::int64_t T = dispatch.indices.size(0), K = dispatch.indices.size(1), H = dx.size(1), P = dispatch.rows();
  detail::require_tensor(op, "dx", dx, DType::f32, {T, H});
  detail::require_tensor(op, "d_weights", d_weights, DType::f32, {T, K});
  detail::require_tensor(op, "d_x_rows", d_x_rows, DType::f32, {P, H});
  detail::require_tensor(op, "d_w_rows", d_w_rows, DType::f32, {P});
  cpu::dispatch_backward(d_x_rows.data<float>(), d_w_rows.data<float>(), view(dispatch), dims(dispatch, H), P, cfg,
                         dx.data<float>(), d_weights.data<float>());
}

GroupedExpertsSaved grouped_experts_forward(const Tensor& x_rows, const Tensor& w_rows, const ExpertDispatch& dispatch,
                                            std::int64_t first_expert, const Tensor& gate_up, const Tensor& down,
                                            const ExpertsConfig& cfg) {
  const std::int64_t n = expert_weight_dims("grouped_experts_forward", gate_up, down).n;
  if (first_expert < 0 || first_expert + n > dispatch.experts()) {
    throw std::invalid_argument("grouped_experts_forward: local experts [" + std::to_string(first_expert) + ", " +
                                std::to_string(first_expert + n) + ") outside the routing's " +
                                std::to_string(dispatch.experts()) + " experts");
  }
  const std::int64_t* all = dispatch.expert_offsets.data<std::int64_t>();
  return grouped_experts_forward(x_rows, w_rows, std::vector<std::int64_t>(all + first_expert, all + first_expert + n + 1),
                                 gate_up, down, cfg);
}

GroupedExpertsSaved grouped_experts_forward(const Tensor& x_rows, const Tensor& w_rows,
                                            const std::vector<std::int64_t>& offsets, const Tensor& gate_up,
                                            const Tensor& down, const ExpertsConfig& cfg) {
  KernelScope scope(KernelKind::experts);
  const char* op = "grouped_experts_forward";
  const auto [n, H, I] = expert_weight_dims(op, gate_up, down);
  if (static_cast<std::int64_t>(offsets.size()) != n + 1 || !std::is_sorted(offsets.begin(), offsets.end())) {
    throw std::invalid_argument(std::string(op) + ": expected " + std::to_string(n + 1) +
                                " non-decreasing row offsets for " + std::to_string(n) + " experts, got " +
                                std::to_string(offsets.size()));
  }
  const std::int64_t R = offsets.back() - offsets.front();
  detail::require_tensor(op, "x_rows", x_rows, DType::f32, {R, H});
  detail::require_tensor(op, "w_rows", w_rows, DType::f32, {R});
  GroupedExpertsSaved s{x_rows,
                        w_rows,
                        i64_tensor(offsets),
                        Tensor::empty({R, 2 * I}),
                        Tensor::empty({R, I}),
                        Tensor::empty({R, H})};
  cpu::grouped_experts_forward(x_rows.data<float>(), w_rows.data<float>(), offsets.data(), n, H, I,
                               gate_up.data<float>(), down.data<float>(), cfg, s.gate_up_out.data<float>(),
                               s.act_out.data<float>(), s.down_out.data<float>());
  return s;
}

GroupedExpertsGrads grouped_experts_backward(const Tensor& d_rows, const GroupedExpertsSaved& saved,
                                             const Tensor& gate_up, const Tensor& down, const ExpertsConfig& cfg,
                                             const Tensor& d_gate_up, const Tensor& d_down) {
  KernelScope scope(KernelKind::experts);
  const char* op = "grouped_experts_backward";
  const auto [n, H, I] = expert_weight_dims(op, gate_up, down);
  detail::require_tensor(op, "saved.offsets", saved.offsets, DType::i64, {n + 1});
  const std::int64_t* offsets = saved.offsets.data<std::int64_t>();
  const std::int64_t R = offsets[n] - offsets[0];
  detail::require_tensor(op, "d_rows", d_rows, DType::f32, {R, H});
  detail::require_tensor(op, "saved.x_rows", saved.x_rows, DType::f32, {R, H});
  detail::require_tensor(op, "saved.gate_up_out", saved.gate_up_out, DType::f32, {R, 2 * I});
  detail::require_tensor(op, "saved.act_out", saved.act_out, DType::f32, {R, I});
  detail::require_tensor(op, "d_gate_up", d_gate_up, DType::f32, gate_up.shape());
  detail::require_tensor(op, "d_down", d_down, DType::f32, down.shape());
  GroupedExpertsGrads g{Tensor::empty({R, H}), Tensor::empty({R})};
  cpu::grouped_experts_backward(d_rows.data<float>(), saved.x_rows.data<float>(), saved.w_rows.data<float>(), offsets,
                                n, H, I, gate_up.data<float>(), down.data<float>(), cfg,
                                saved.gate_up_out.data<float>(), saved.act_out.data<float>(), g.d_x_rows.data<float>(),
                                g.d_w_rows.data<float>(), d_gate_up.data<float>(), d_down.data<float>());
  return g;
}

namespace {

// Elements per slot (from the slots: rows may be empty), and the check that rows fit them.
std::int64_t row_width(const char* op, const Tensor& rows, const Tensor& slots, const ExpertDispatch& d) {
  const std::int64_t pairs = d.indices.numel();
  const std::int64_t width = slots.rank() <= 1 ? 1 : slots.numel() / std::max<std::int64_t>(slots.size(0), 1);
  const bool rows_fit = rows.rank() == slots.rank() && rows.rank() >= 1 && rows.numel() == rows.size(0) * width;
  if (rows.dtype() != DType::f32 || slots.dtype() != DType::f32 || slots.rank() < 1 || slots.size(0) != pairs ||
      !rows_fit) {
    throw std::invalid_argument(std::string(op) + ": rows " + rows.describe() + " and slots " + slots.describe() +
                                " must be f32 with one slot per (token, slot) pair (" + std::to_string(pairs) + ")");
  }
  return width;
}

void check_row_range(const char* op, const ExpertDispatch& d, std::int64_t first, std::int64_t count) {
  if (first < 0 || count < 0 || first + count > d.rows()) {
    throw std::invalid_argument(std::string(op) + ": rows [" + std::to_string(first) + ", " +
                                std::to_string(first + count) + ") outside the dispatch's " + std::to_string(d.rows()));
  }
}

}  // namespace

void scatter_rows_to_slots(const Tensor& rows, const ExpertDispatch& dispatch, std::int64_t first_row,
                           const Tensor& slots) {
  const char* op = "scatter_rows_to_slots";
  const std::int64_t width = row_width(op, rows, slots, dispatch), count = rows.size(0);
  check_row_range(op, dispatch, first_row, count);
  const std::int64_t* pair = dispatch.row_pair.data<std::int64_t>() + first_row;
  const float* src = rows.data<float>();
  float* dst = slots.data<float>();
  for (std::int64_t r = 0; r < count; ++r) std::copy_n(src + r * width, width, dst + pair[r] * width);
}

Tensor gather_rows_from_slots(const Tensor& slots, const ExpertDispatch& dispatch, std::int64_t first_row,
                              std::int64_t count) {
  const char* op = "gather_rows_from_slots";
  detail::require(slots.rank() >= 1, op, [&] { return "slots must be [slots, ...], got " + slots.describe(); });
  Shape shape = slots.shape();
  shape[0] = count;
  Tensor rows = Tensor::empty(shape);
  const std::int64_t width = row_width(op, rows, slots, dispatch);
  check_row_range(op, dispatch, first_row, count);
  const std::int64_t* pair = dispatch.row_pair.data<std::int64_t>() + first_row;
  const float* src = slots.data<float>();
  float* dst = rows.data<float>();
  for (std::int64_t r = 0; r < count; ++r) std::copy_n(src + pair[r] * width, width, dst + r * width);
  return rows;
}

Tensor combine_forward(const Tensor& down_out, const ExpertDispatch& dispatch, std::int64_t hidden,
                       const ExpertsConfig& cfg) {
  KernelScope scope(KernelKind::experts);
  detail::require_tensor("combine_forward", "down_out", down_out, DType::f32, {dispatch.rows(), hidden});
  Tensor out = Tensor::empty({dispatch.indices.size(0), hidden});
  cpu::combine_rows(down_out.data<float>(), dispatch.weights.data<float>(), view(dispatch), dims(dispatch, hidden), cfg,
                    out.data<float>());
  return out;
}

CombineGrads combine_backward(const Tensor& d_out, const Tensor& down_out, const ExpertDispatch& dispatch,
                              const ExpertsConfig& cfg) {
  KernelScope scope(KernelKind::experts);
  check_rank("combine_backward", "d_out", d_out, 2, "f32 [T,H]");
  const std::int64_t T = dispatch.indices.size(0), K = dispatch.indices.size(1), H = d_out.size(1), P = dispatch.rows();
  detail::require_tensor("combine_backward", "d_out", d_out, DType::f32, {T, H});
  detail::require_tensor("combine_backward", "down_out", down_out, DType::f32, {P, H});
  CombineGrads g{Tensor::empty({P, H}), Tensor::empty({T, K})};
  cpu::combine_backward(d_out.data<float>(), dispatch.weights.data<float>(), down_out.data<float>(), view(dispatch),
                        dims(dispatch, H), P, cfg, g.d_rows.data<float>(), g.d_weights.data<float>());
  return g;
}

ExpertsForward experts_forward(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& indices,
                               const Tensor& weights, const Tensor& token_mask, const ExpertsConfig& cfg) {
  check_rank("experts_forward", "gate_up", gate_up, 3, "f32 [E,H,2I]");
  ExpertsForward f;
  f.saved.dispatch = plan_expert_dispatch(indices, weights, token_mask, gate_up.size(0));
  const DispatchedRows rows = dispatch_forward(x, f.saved.dispatch);
  f.saved.experts = grouped_experts_forward(rows.x_rows, rows.w_rows, f.saved.dispatch, 0, gate_up, down, cfg);
  f.out = combine_forward(f.saved.experts.down_out, f.saved.dispatch, x.size(1), cfg);
  return f;
}

ExpertsGrads experts_backward(const Tensor& d_out, const ExpertsSaved& saved, const Tensor& gate_up,
                              const Tensor& down, const ExpertsConfig& cfg, const Tensor& d_gate_up,
                              const Tensor& d_down) {
  CombineGrads c = combine_backward(d_out, saved.experts.down_out, saved.dispatch, cfg);
  const GroupedExpertsGrads g = grouped_experts_backward(c.d_rows, saved.experts, gate_up, down, cfg, d_gate_up, d_down);
  ExpertsGrads out{Tensor::empty(d_out.shape()), c.d_weights};
  dispatch_backward(g.d_x_rows, g.d_w_rows, saved.dispatch, cfg, out.dx, out.d_weights);
  return out;
}

}  // namespace atl

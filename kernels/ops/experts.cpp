#include "kernels/ops/experts.hpp"
#include "kernels/kernel_clock.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace atl {

namespace {

void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype, const Shape& shape) {
  if (!t.defined() || t.dtype() != dtype || t.device() != Device::cpu || t.shape() != shape) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a cpu " + std::string(dtype_name(dtype)) +
                                shape_string(shape) + " tensor, got " +
                                (t.defined() ? t.describe() : std::string("undefined")));
  }
}

void check_rank(const char* op, const char* name, const Tensor& t, std::int64_t rank, const char* expected) {
  if (!t.defined() || t.rank() != rank) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be " + expected + ", got " +
                                (t.defined() ? t.describe() : std::string("undefined")));
  }
}

// Dims from the parameters and the routing; checks every shape.
cpu::ExpertsDims experts_dims(const char* op, const Tensor& x, const Tensor& gate_up, const Tensor& down,
                              const Tensor& indices) {
  check_rank(op, "x", x, 2, "f32 [T,H]");
  check_rank(op, "gate_up", gate_up, 3, "f32 [E,H,2I]");
  check_rank(op, "indices", indices, 2, "i32 [T,K]");
  cpu::ExpertsDims d;
  d.tokens = x.size(0);
  d.hidden = x.size(1);
  d.experts = gate_up.size(0);
  d.top_k = indices.size(1);
  if (gate_up.size(2) % 2 != 0) {
    throw std::invalid_argument(std::string(op) + ": gate_up last dim must be even (2I), got " + gate_up.describe());
  }
  d.inter = gate_up.size(2) / 2;
  check_tensor(op, "x", x, DType::f32, {d.tokens, d.hidden});
  check_tensor(op, "gate_up", gate_up, DType::f32, {d.experts, d.hidden, 2 * d.inter});
  check_tensor(op, "down", down, DType::f32, {d.experts, d.inter, d.hidden});
  check_tensor(op, "indices", indices, DType::i32, {d.tokens, d.top_k});
  return d;
}

Tensor i64_tensor(const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::i64);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(std::int64_t));
  return t;
}

cpu::DispatchView saved_view(const ExpertsSaved& s) {
  return {s.indices.data<std::int32_t>(), s.row_pair.data<std::int64_t>(), s.expert_offsets.data<std::int64_t>(),
          s.pair_row.data<std::int64_t>()};
}

}  // namespace

ExpertsForward experts_forward(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& indices,
                               const Tensor& weights, const Tensor& token_mask, const ExpertsConfig& cfg) {
  KernelScope scope(KernelKind::experts);
  const char* op = "experts_forward";
  const cpu::ExpertsDims d = experts_dims(op, x, gate_up, down, indices);
  check_tensor(op, "weights", weights, DType::f32, {d.tokens, d.top_k});
  if (token_mask.defined()) check_tensor(op, "token_mask", token_mask, DType::boolean, {d.tokens});

  const cpu::DispatchPlan plan = cpu::plan_dispatch(indices.data<std::int32_t>(),
                                                    token_mask.defined() ? token_mask.data<bool>() : nullptr, d);
  const std::int64_t rows = static_cast<std::int64_t>(plan.row_pair.size());
  ExpertsForward f;
  f.out = Tensor::empty({d.tokens, d.hidden});
  ExpertsSaved& s = f.saved;
  s.x = x;
  s.indices = indices;
  s.weights = weights;
  s.row_pair = i64_tensor(plan.row_pair);
  s.expert_offsets = i64_tensor(plan.expert_offsets);
  s.pair_row = i64_tensor(plan.pair_row);
  s.gate_up_out = Tensor::empty({rows, 2 * d.inter});
  s.act_out = Tensor::empty({rows, d.inter});
  s.down_out = Tensor::empty({rows, d.hidden});
  cpu::experts_forward(x.data<float>(), gate_up.data<float>(), down.data<float>(), weights.data<float>(),
                       cpu::view_of(plan, indices.data<std::int32_t>()), d, cfg, s.gate_up_out.data<float>(),
                       s.act_out.data<float>(), s.down_out.data<float>(), f.out.data<float>());
  return f;
}

ExpertsGrads experts_backward(const Tensor& d_out, const ExpertsSaved& saved, const Tensor& gate_up,
                              const Tensor& down, const ExpertsConfig& cfg, const Tensor& d_gate_up,
                              const Tensor& d_down) {
  KernelScope scope(KernelKind::experts);
  const char* op = "experts_backward";
  const cpu::ExpertsDims d = experts_dims(op, saved.x, gate_up, down, saved.indices);
  check_tensor(op, "d_out", d_out, DType::f32, {d.tokens, d.hidden});
  check_tensor(op, "saved.weights", saved.weights, DType::f32, {d.tokens, d.top_k});
  check_tensor(op, "d_gate_up", d_gate_up, DType::f32, gate_up.shape());
  check_tensor(op, "d_down", d_down, DType::f32, down.shape());
  check_tensor(op, "saved.expert_offsets", saved.expert_offsets, DType::i64, {d.experts + 1});
  check_tensor(op, "saved.pair_row", saved.pair_row, DType::i64, {d.tokens * d.top_k});
  check_rank(op, "saved.row_pair", saved.row_pair, 1, "i64 [P]");
  const std::int64_t rows = saved.row_pair.size(0);
  check_tensor(op, "saved.row_pair", saved.row_pair, DType::i64, {rows});
  check_tensor(op, "saved.gate_up_out", saved.gate_up_out, DType::f32, {rows, 2 * d.inter});
  check_tensor(op, "saved.act_out", saved.act_out, DType::f32, {rows, d.inter});
  check_tensor(op, "saved.down_out", saved.down_out, DType::f32, {rows, d.hidden});

  ExpertsGrads g{Tensor::empty({d.tokens, d.hidden}), Tensor::empty({d.tokens, d.top_k})};
  cpu::experts_backward(d_out.data<float>(), saved.x.data<float>(), gate_up.data<float>(), down.data<float>(),
                        saved.weights.data<float>(), saved_view(saved), d, cfg, saved.gate_up_out.data<float>(),
                        saved.act_out.data<float>(), saved.down_out.data<float>(), g.dx.data<float>(),
                        g.d_weights.data<float>(), d_gate_up.data<float>(), d_down.data<float>());
  return g;
}

}  // namespace atl

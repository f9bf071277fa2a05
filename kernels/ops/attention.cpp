#include "kernels/ops/attention.hpp"


#include <stdexcept>
#include <string>

#include "kernels/cpu/attention.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

namespace {


// Checks every input against q's shape and returns the problem sizes.
cpu::AttentionShape check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& positions, const Tensor& valid, const Tensor& sinks,
                                 const AttentionOptions& options) {
  if (!q.defined() || q.dtype() != DType::f32 || q.device() != Device::cpu || q.rank() != 4) {
    throw std::invalid_argument(std::string(op) + ": q must be a cpu f32 tensor [B, S, Hq, D], got " +
                                q.describe());
  }
  cpu::AttentionShape s;
  s.batch = q.size(0);
  s.seq = q.size(1);
  s.q_heads = q.size(2);
  s.head_dim = q.size(3);
  s.kv_heads = k.defined() && k.rank() == 4 ? k.size(2) : 0;
  if (s.kv_heads <= 0 || s.q_heads % s.kv_heads != 0) {
    throw std::invalid_argument(std::string(op) + ": k must be [B, Sk, Hkv, D] with Hq (" +
                                std::to_string(s.q_heads) + ") a multiple of Hkv, got " + k.describe());
  }
  // Without query_index the queries are the keys (Sk = Sq); with it, query t sits at key
  // query_index[b, t] of a longer (or reordered) key row: context parallelism.
  s.kv_seq = options.query_index.defined() ? k.size(1) : s.seq;
  const Shape kv_shape{s.batch, s.kv_seq, s.kv_heads, s.head_dim};
  detail::require_tensor(op, "k", k, DType::f32, kv_shape);
  detail::require_tensor(op, "v", v, DType::f32, kv_shape);
  detail::require_tensor(op, "positions", positions, DType::i64, {s.batch, s.seq});
  detail::require_tensor(op, "valid", valid, DType::boolean, {s.batch, s.kv_seq});
  if (options.query_index.defined()) {
    detail::require_tensor(op, "query_index", options.query_index, DType::i64, {s.batch, s.seq});
    s.query_index = options.query_index.data<std::int64_t>();
    for (std::int64_t i = 0; i < options.query_index.numel(); ++i) {
      if (s.query_index[i] < 0 || s.query_index[i] >= s.kv_seq) {
        throw std::invalid_argument(std::string(op) + ": query_index " + std::to_string(s.query_index[i]) +
                                    " outside the " + std::to_string(s.kv_seq) + " keys of its row");
      }
    }
  }
  if (sinks.defined()) detail::require_tensor(op, "sinks", sinks, DType::f32, {s.q_heads});
  if (options.window < 0) {
    throw std::invalid_argument(std::string(op) + ": window must be >= 0, got " + std::to_string(options.window));
  }
  const std::int64_t* pos = positions.data<std::int64_t>();
  for (std::int64_t i = 0; i < positions.numel(); ++i) {
    if (pos[i] < 0) {
      throw std::invalid_argument(std::string(op) + ": negative position " + std::to_string(pos[i]) + " at row " +
                                  std::to_string(i / s.seq) + ", col " + std::to_string(i % s.seq));
    }
  }
  return s;
}

cpu::SinkLogits<float> per_head_sinks(const Tensor& sinks, Tensor* dsinks) {
  cpu::SinkLogits<float> out;
  if (!sinks.defined()) return out;
  out.values = sinks.data<float>();
  out.grads = dsinks != nullptr ? dsinks->data<float>() : nullptr;
  out.batch_stride = 0;
  out.head_stride = 1;
  out.query_stride = 0;
  return out;
}

}  // namespace

void validate_positions(const Tensor& positions) {
  if (!positions.defined() || positions.dtype() != DType::i64 || positions.device() != Device::cpu ||
      (positions.rank() != 1 && positions.rank() != 2)) {
    throw std::invalid_argument("validate_positions: positions must be a cpu i64 tensor [B, S] or [S], got " +
                                positions.describe());
  }
  const std::int64_t cols = positions.size(-1);
  const std::int64_t rows = positions.rank() == 2 ? positions.size(0) : 1;
  const std::int64_t* pos = positions.data<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t* row = pos + r * cols;
    for (std::int64_t t = 0; t < cols; ++t) {
      if (row[t] < 0) {
        throw std::invalid_argument("validate_positions: negative position " + std::to_string(row[t]) + " at row " +
                                    std::to_string(r) + ", col " + std::to_string(t));
      }
      if (t > 0 && row[t] != 0 && row[t] != row[t - 1] + 1) {
        throw std::invalid_argument("validate_positions: at row " + std::to_string(r) + ", col " +
                                    std::to_string(t) + " position " + std::to_string(row[t]) + " follows " +
                                    std::to_string(row[t - 1]) + " (expected " + std::to_string(row[t - 1] + 1) +
                                    " or 0)");
      }
    }
  }
}

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                   const Tensor& valid, const Tensor& sinks, const AttentionOptions& options) {
  KernelScope scope(KernelKind::attention);
  const cpu::AttentionShape s = check_inputs("attention_forward", q, k, v, positions, valid, sinks, options);
  AttentionForward f;
  f.out = Tensor::empty(q.shape(), DType::f32);
  f.lse = Tensor::empty({s.batch, s.q_heads, s.seq}, DType::f32);
  cpu::attention_forward<float>(q.data<float>(), k.data<float>(), v.data<float>(), positions.data<std::int64_t>(),
                                valid.data<bool>(), per_head_sinks(sinks, nullptr), f.out.data<float>(),
                                f.lse.data<float>(), s, options.window, options.scale);
  return f;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionForward& saved, const Tensor& positions, const Tensor& valid,
                                  const Tensor& sinks, Tensor* dsinks, const AttentionOptions& options) {
  KernelScope scope(KernelKind::attention);
  const char* op = "attention_backward";
  const cpu::AttentionShape s = check_inputs(op, q, k, v, positions, valid, sinks, options);
  detail::require_tensor(op, "dout", dout, DType::f32, q.shape());
  detail::require_tensor(op, "saved.lse", saved.lse, DType::f32, {s.batch, s.q_heads, s.seq});
  if (sinks.defined() && dsinks != nullptr) detail::require_tensor(op, "dsinks", *dsinks, DType::f32, {s.q_heads});
  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), DType::f32);
  g.dk = Tensor::empty(k.shape(), DType::f32);
  g.dv = Tensor::empty(v.shape(), DType::f32);
  cpu::attention_backward<float>(dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                                 saved.lse.data<float>(), positions.data<std::int64_t>(), valid.data<bool>(),
                                 per_head_sinks(sinks, dsinks), g.dq.data<float>(), g.dk.data<float>(),
                                 g.dv.data<float>(), s, options.window, options.scale);
  return g;
}

}  // namespace atl

#include "kernels/ops/relative_attention.hpp"

#include "kernels/cpu/relative_attention.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {

cpu::AttentionShape check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& positions, const Tensor& valid, const Tensor& profiles,
                                 const Tensor& sink_logits, const AttentionOptions& options) {
  detail::require_dtype(op, "q", q, DType::f32);
  require(q.rank() == 4, op, [&] { return "q must be [B, S, Hq, D], got " + q.describe(); });
  cpu::AttentionShape s;
  s.batch = q.size(0);
  s.seq = q.size(1);
  s.q_heads = q.size(2);
  s.head_dim = q.size(3);
  detail::require_dtype(op, "k", k, DType::f32);
  s.kv_heads = k.rank() == 4 ? k.size(2) : 0;
  require(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, op, [&] {
    return "k must be [B, S, Hkv, D] with Hq (" + std::to_string(s.q_heads) + ") a multiple of Hkv, got " +
           k.describe();
  });
  const Shape kv{s.batch, s.seq, s.kv_heads, s.head_dim};
  detail::require_tensor(op, "k", k, DType::f32, kv);
  detail::require_tensor(op, "v", v, DType::f32, kv);
  detail::require_tensor(op, "positions", positions, DType::i64, {s.batch, s.seq});
  detail::require_tensor(op, "valid", valid, DType::boolean, {s.batch, s.seq});
  if (profiles.defined()) {
    require(profiles.rank() == 4 && profiles.size(3) >= 1, op,
            [&] { return "profiles must be [B, Hq, S, R] with R >= 1, got " + profiles.describe(); });
    detail::require_tensor(op, "profiles", profiles, DType::f32, {s.batch, s.q_heads, s.seq, profiles.size(3)});
  }
  if (sink_logits.defined()) detail::require_tensor(op, "sink_logits", sink_logits, DType::f32, {s.batch, s.q_heads, s.seq});
  require(options.window >= 0, op, [&] { return "window must be >= 0, got " + std::to_string(options.window); });
  // Profiles are indexed by query row and distance t - j within the row: queries sit at their own
  // key index (no context-parallel query_index here).
  require(!options.query_index.defined(), op, "query_index is not supported (queries are keys 0..S-1)");
  for (std::int64_t p : positions.span<std::int64_t>())
    require(p >= 0, op, [&] { return "negative position " + std::to_string(p); });
  return s;
}

cpu::RelativeProfileBias<float> profile_bias(const Tensor& profiles, const Tensor& d_profiles,
                                             const cpu::AttentionShape& s) {
  cpu::RelativeProfileBias<float> bias;
  bias.heads = s.q_heads;
  bias.seq = s.seq;
  if (!profiles.defined()) return bias;  // extent 0: every bias is 0
  bias.profiles = profiles.data<float>();
  bias.grads = d_profiles.defined() ? d_profiles.data<float>() : nullptr;
  bias.extent = profiles.size(3);
  return bias;
}

cpu::SinkLogits<float> sinks_of(const Tensor& sink_logits, const Tensor& grads, const cpu::AttentionShape& s) {
  if (!sink_logits.defined()) return {};
  return cpu::query_sink_logits<float>(sink_logits.data<float>(), grads.defined() ? grads.data<float>() : nullptr,
                                       s.q_heads, s.seq);
}

}  // namespace

AttentionForward relative_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                            const Tensor& valid, const Tensor& profiles, const Tensor& sink_logits,
                                            const AttentionOptions& options) {
  KernelScope scope(KernelKind::attention);
  const cpu::AttentionShape s =
      check_inputs("relative_attention_forward", q, k, v, positions, valid, profiles, sink_logits, options);
  AttentionForward f{Tensor::empty(q.shape()), Tensor::empty({s.batch, s.q_heads, s.seq})};
  cpu::attention_forward<float>(q.data<float>(), k.data<float>(), v.data<float>(), positions.data<std::int64_t>(),
                                valid.data<bool>(), sinks_of(sink_logits, Tensor(), s), f.out.data<float>(),
                                f.lse.data<float>(), s, options.window, options.scale,
                                profile_bias(profiles, Tensor(), s));
  return f;
}

RelativeAttentionGrads relative_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                   const Tensor& v, const AttentionForward& saved,
                                                   const Tensor& positions, const Tensor& valid, const Tensor& profiles,
                                                   const Tensor& sink_logits, const AttentionOptions& options) {
  KernelScope scope(KernelKind::attention);
  constexpr const char* op = "relative_attention_backward";
  const cpu::AttentionShape s = check_inputs(op, q, k, v, positions, valid, profiles, sink_logits, options);
  detail::require_tensor(op, "dout", dout, DType::f32, q.shape());
  detail::require_tensor(op, "saved.lse", saved.lse, DType::f32, {s.batch, s.q_heads, s.seq});
  RelativeAttentionGrads g;
  g.dq = Tensor::empty(q.shape());
  g.dk = Tensor::empty(k.shape());
  g.dv = Tensor::empty(v.shape());
  if (profiles.defined()) g.d_profiles = Tensor::zeros(profiles.shape());
  if (sink_logits.defined()) g.d_sink_logits = Tensor::zeros(sink_logits.shape());
  cpu::attention_backward<float>(dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                                 saved.lse.data<float>(), positions.data<std::int64_t>(), valid.data<bool>(),
                                 sinks_of(sink_logits, g.d_sink_logits, s), g.dq.data<float>(), g.dk.data<float>(),
                                 g.dv.data<float>(), s, options.window, options.scale,
                                 profile_bias(profiles, g.d_profiles, s));
  return g;
}

}  // namespace atl

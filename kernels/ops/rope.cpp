#include "kernels/ops/rope.hpp"

#include <stdexcept>
#include <string>

#include "kernels/cpu/rope.hpp"
#include "kernels/kernel_clock.hpp"

namespace atl {

namespace {

struct TokenLayout {
  std::int64_t tokens = 0, heads = 0, head_dim = 0;
};

// Checks x [T, heads, D] / [B, S, heads, D] (f32, cpu) against positions (i64, one per token).
TokenLayout check_inputs(const char* op, const char* x_name, const Tensor& x, const Tensor& positions,
                         bool even_head_dim) {
  const std::string where = std::string(op) + ": ";
  if (!x.defined() || x.dtype() != DType::f32 || x.device() != Device::cpu || (x.rank() != 3 && x.rank() != 4)) {
    throw std::invalid_argument(where + x_name + " must be a cpu f32 tensor [T, heads, D] or [B, S, heads, D], got " +
                                x.describe());
  }
  TokenLayout l;
  l.heads = x.size(-2);
  l.head_dim = x.size(-1);
  l.tokens = x.rank() == 3 ? x.size(0) : x.size(0) * x.size(1);
  if (even_head_dim && l.head_dim % 2 != 0) {
    throw std::invalid_argument(where + x_name + " head dim D must be even, got " + x.describe());
  }
  if (!positions.defined() || positions.dtype() != DType::i64 || positions.device() != Device::cpu ||
      positions.numel() != l.tokens) {
    throw std::invalid_argument(where + "positions must be a cpu i64 tensor with one entry per token (" +
                                std::to_string(l.tokens) + "), got " +
                                positions.describe());
  }
  return l;
}

}  // namespace

Tensor rope_forward(const Tensor& x, const Tensor& positions, float theta) {
  KernelScope scope(KernelKind::elementwise);
  const TokenLayout l = check_inputs("rope_forward", "x", x, positions, true);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  cpu::rope_forward<float>(x.data<float>(), positions.data<std::int64_t>(), y.data<float>(), l.tokens, l.heads,
                           l.head_dim, theta);
  return y;
}

Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta) {
  KernelScope scope(KernelKind::elementwise);
  const TokenLayout l = check_inputs("rope_backward", "dy", dy, positions, true);
  Tensor dx = Tensor::empty(dy.shape(), DType::f32);
  cpu::rope_backward<float>(dy.data<float>(), positions.data<std::int64_t>(), dx.data<float>(), l.tokens, l.heads,
                            l.head_dim, theta);
  return dx;
}

Tensor ssmax_forward(const Tensor& q, const Tensor& positions, float base, float exponent) {
  KernelScope scope(KernelKind::elementwise);
  const TokenLayout l = check_inputs("ssmax_forward", "q", q, positions, false);
  Tensor y = Tensor::empty(q.shape(), DType::f32);
  cpu::ssmax_forward<float>(q.data<float>(), positions.data<std::int64_t>(), y.data<float>(), l.tokens,
                            l.heads * l.head_dim, base, exponent);
  return y;
}

Tensor ssmax_backward(const Tensor& dy, const Tensor& positions, float base, float exponent) {
  KernelScope scope(KernelKind::elementwise);
  const TokenLayout l = check_inputs("ssmax_backward", "dy", dy, positions, false);
  Tensor dq = Tensor::empty(dy.shape(), DType::f32);
  cpu::ssmax_backward<float>(dy.data<float>(), positions.data<std::int64_t>(), dq.data<float>(), l.tokens,
                             l.heads * l.head_dim, base, exponent);
  return dq;
}

}  // namespace atl

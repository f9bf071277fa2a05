#include "kernels/ops/short_conv.hpp"

#include "kernels/cpu/short_conv.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {

// Positions/valid [B, S] and the token count they imply.
void check_layout(const char* op, const Tensor& positions, const Tensor& valid, cpu::ShortConvDims& d) {
  detail::require_dtype(op, "positions", positions, DType::i64);
  detail::require_dtype(op, "valid", valid, DType::boolean);
  require(positions.rank() == 2, op, [&] { return "positions must be [B, S], got " + positions.describe(); });
  require(valid.shape() == positions.shape(), op,
          [&] { return "valid " + valid.describe() + " must match positions " + positions.describe(); });
  d.batch = positions.size(0);
  d.seq = positions.size(1);
  for (std::int64_t v : positions.span<std::int64_t>()) {
    require(v >= 0, op, [&] { return "negative position " + std::to_string(v); });
  }
}

cpu::ShortConvDims static_dims(const char* op, const Tensor& x, const Tensor& weight, const Tensor& positions,
                               const Tensor& valid) {
  cpu::ShortConvDims d;
  check_layout(op, positions, valid, d);
  detail::require_dtype(op, "x", x, DType::f32);
  detail::require_dtype(op, "weight", weight, DType::f32);
  require(x.rank() >= 1, op, [&] { return "x must have a channel dim, got " + x.describe(); });
  const std::int64_t C = x.size(-1);
  require(weight.rank() == 2 && weight.size(0) > 0 && C % weight.size(0) == 0, op, [&] {
    return "weight must be [G, W] with G dividing the " + std::to_string(C) + " channels of x, got " +
           weight.describe();
  });
  require(x.numel() == d.batch * d.seq * C, op, [&] {
    return "x " + x.describe() + " must hold B*S = " + std::to_string(d.batch * d.seq) + " tokens of " +
           std::to_string(C) + " channels";
  });
  d.groups = weight.size(0);
  d.group_size = C / d.groups;
  d.width = weight.size(1);
  return d;
}

cpu::ShortConvDims dynamic_dims(const char* op, const Tensor& x, const Tensor& taps, const Tensor& positions,
                                const Tensor& valid) {
  cpu::ShortConvDims d;
  check_layout(op, positions, valid, d);
  detail::require_dtype(op, "x", x, DType::f32);
  detail::require_dtype(op, "taps", taps, DType::f32);
  require(x.rank() >= 2 && taps.rank() >= 2 && x.size(-2) == taps.size(-2), op, [&] {
    return "x must be [..., Hh, Dh] and taps [..., Hh, W] with the same Hh, got x " + x.describe() + ", taps " +
           taps.describe();
  });
  d.groups = x.size(-2);
  d.group_size = x.size(-1);
  d.width = taps.size(-1);
  const std::int64_t tokens = d.batch * d.seq;
  require(x.numel() == tokens * d.channels() && taps.numel() == tokens * d.groups * d.width, op, [&] {
    return "x " + x.describe() + " and taps " + taps.describe() + " must hold B*S = " + std::to_string(tokens) +
           " tokens";
  });
  return d;
}

}  // namespace

Tensor short_conv_forward(const Tensor& x, const Tensor& weight, const Tensor& positions, const Tensor& valid,
                          Precision precision) {
  KernelScope scope(KernelKind::elementwise);
  const cpu::ShortConvDims d = static_dims("short_conv_forward", x, weight, positions, valid);
  Tensor y = Tensor::empty(x.shape());
  cpu::short_conv_forward<float>(x.data<float>(), weight.data<float>(), 0, positions.data<std::int64_t>(),
                                 valid.data<bool>(), y.data<float>(), d, precision == Precision::bf16);
  return y;
}

Tensor short_conv_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& positions,
                           const Tensor& valid, const Tensor* dweight) {
  KernelScope scope(KernelKind::elementwise);
  constexpr const char* op = "short_conv_backward";
  const cpu::ShortConvDims d = static_dims(op, x, weight, positions, valid);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dy.shape() == x.shape(), op, [&] { return "dy " + dy.describe() + " must match x " + x.describe(); });
  float* dw = nullptr;
  if (dweight) {
    detail::require_dtype(op, "dweight", *dweight, DType::f32);
    require(dweight->shape() == weight.shape(), op,
            [&] { return "dweight " + dweight->describe() + " must match weight " + weight.describe(); });
    dw = dweight->data<float>();
  }
  Tensor dx = Tensor::empty(x.shape());
  cpu::short_conv_backward<float>(dy.data<float>(), x.data<float>(), weight.data<float>(), 0,
                                  positions.data<std::int64_t>(), valid.data<bool>(), dx.data<float>(), dw, d);
  return dx;
}

Tensor dynamic_short_conv_forward(const Tensor& x, const Tensor& taps, const Tensor& positions, const Tensor& valid,
                                  Precision precision) {
  KernelScope scope(KernelKind::elementwise);
  const cpu::ShortConvDims d = dynamic_dims("dynamic_short_conv_forward", x, taps, positions, valid);
  Tensor y = Tensor::empty(x.shape());
  cpu::short_conv_forward<float>(x.data<float>(), taps.data<float>(), d.groups * d.width,
                                 positions.data<std::int64_t>(), valid.data<bool>(), y.data<float>(), d,
                                 precision == Precision::bf16);
  return y;
}

DynamicShortConvGrads dynamic_short_conv_backward(const Tensor& dy, const Tensor& x, const Tensor& taps,
                                                  const Tensor& positions, const Tensor& valid) {
  KernelScope scope(KernelKind::elementwise);
  constexpr const char* op = "dynamic_short_conv_backward";
  const cpu::ShortConvDims d = dynamic_dims(op, x, taps, positions, valid);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dy.shape() == x.shape(), op, [&] { return "dy " + dy.describe() + " must match x " + x.describe(); });
  DynamicShortConvGrads g{Tensor::empty(x.shape()), Tensor::zeros(taps.shape())};
  cpu::short_conv_backward<float>(dy.data<float>(), x.data<float>(), taps.data<float>(), d.groups * d.width,
                                  positions.data<std::int64_t>(), valid.data<bool>(), g.dx.data<float>(),
                                  g.dtaps.data<float>(), d);
  return g;
}

}  // namespace atl

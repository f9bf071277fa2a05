#include "kernels/ops/l2_clip.hpp"

#include "kernels/cpu/l2_clip.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {
const float* scale_ptr(const char* op, const Tensor& scale, std::int64_t dim) {
  if (!scale.defined()) return nullptr;
  detail::require_dtype(op, "scale", scale, DType::f32);
  require(scale.numel() == dim && scale.rank() == 1, op,
          [&] { return "scale must be [" + std::to_string(dim) + "], got " + scale.describe(); });
  return scale.data<float>();
}
}  // namespace

L2ClipForward l2_clip_forward(const Tensor& x, const Tensor& scale, float radius, Precision precision) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "l2_clip_forward";
  detail::require_dtype(op, "x", x, DType::f32);
  require(radius > 0, op, [&] { return "radius must be positive, got " + std::to_string(radius); });
  const auto [rows, dim] = detail::rows_of(op, "x", x);
  L2ClipForward f{Tensor::empty(x.shape()), Tensor::empty({rows})};
  cpu::l2_clip_forward<float>(x.data<float>(), scale_ptr(op, scale, dim), radius, f.y.data<float>(),
                              f.norms.data<float>(), rows, dim, precision == Precision::bf16);
  return f;
}

Tensor l2_clip_backward(const Tensor& dy, const Tensor& x, const Tensor& scale, float radius, const Tensor& norms,
                        const Tensor* dscale) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "l2_clip_backward";
  detail::require_dtype(op, "x", x, DType::f32);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dy.shape() == x.shape(), op, [&] { return "dy " + dy.describe() + " must match x " + x.describe(); });
  const auto [rows, dim] = detail::rows_of(op, "x", x);
  detail::require_dtype(op, "norms", norms, DType::f32);
  require(norms.numel() == rows, op, [&] { return "norms " + norms.describe() + " does not match x " + x.describe(); });
  const float* s = scale_ptr(op, scale, dim);
  float* ds = nullptr;
  if (s && dscale) {
    detail::require_dtype(op, "dscale", *dscale, DType::f32);
    require(dscale->numel() == dim, op,
            [&] { return "dscale " + dscale->describe() + " must be [" + std::to_string(dim) + "]"; });
    ds = dscale->data<float>();
  }
  Tensor dx = Tensor::empty(x.shape());
  cpu::l2_clip_backward<float>(dy.data<float>(), x.data<float>(), s, radius, norms.data<float>(), dx.data<float>(), ds,
                               rows, dim);
  return dx;
}

}  // namespace atl

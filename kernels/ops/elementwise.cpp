#include "kernels/ops/elementwise.hpp"

#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

Tensor scaled_add(const Tensor& a, float ca, const Tensor& b, float cb, Precision precision) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scaled_add", "a", a, DType::f32);
  detail::require_dtype("scaled_add", "b", b, DType::f32);
  detail::require(a.shape() == b.shape(), "scaled_add", "a " + a.describe() + " and b " + b.describe());
  Tensor y = Tensor::empty(a.shape());
  const float *pa = a.data<float>(), *pb = b.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i) py[i] = round_activation(precision, ca * pa[i] + cb * pb[i]);
  return y;
}

Tensor scaled(const Tensor& a, float c) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scaled", "a", a, DType::f32);
  Tensor y = Tensor::empty(a.shape());
  const float* pa = a.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i) py[i] = c * pa[i];
  return y;
}

void scale_inplace(const Tensor& t, float factor) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scale_inplace", "t", t, DType::f32);
  for (float& x : t.span<float>()) x *= factor;
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("add_inplace", "dst", dst, DType::f32);
  detail::require_dtype("add_inplace", "src", src, DType::f32);
  detail::require(dst.shape() == src.shape(), "add_inplace", "dst " + dst.describe() + " and src " + src.describe());
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  for (std::int64_t i = 0; i < dst.numel(); ++i) d[i] += s[i];
}

}  // namespace atl

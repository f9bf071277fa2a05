#include "kernels/ops/norm.hpp"

#include "kernels/cpu/norm.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {
const float* weight_ptr(const char* op, const Tensor& weight, const Tensor& weight_f32, std::int64_t dim) {
  if (!weight.defined()) return nullptr;
  require(weight.rank() == 1 && weight.size(0) == dim, op,
          [&] { return "weight must be [" + std::to_string(dim) + "], got " + weight.describe(); });
  return weight_f32.data<float>();
}
}  // namespace

RmsNormForward rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Precision precision) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "rmsnorm_forward";
  detail::require_dtype(op, "x", x, DType::f32);
  const auto [rows, dim] = detail::rows_of(op, "x", x);
  Tensor w32 = weight.defined() ? detail::as_f32(op, "weight", weight) : Tensor();
  RmsNormForward out{Tensor::empty(x.shape()), Tensor::empty({rows})};
  cpu::rmsnorm_forward<float>(x.data<float>(), weight_ptr(op, weight, w32, dim), out.y.data<float>(),
                              out.rstd.data<float>(), rows, dim, eps, precision == Precision::bf16);
  return out;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor* dweight) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "rmsnorm_backward";
  detail::require_dtype(op, "x", x, DType::f32);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dy.shape() == x.shape(), op, [&] { return "dy " + dy.describe() + " must match x " + x.describe(); });
  const auto [rows, dim] = detail::rows_of(op, "x", x);
  require(rstd.numel() == rows, op, [&] { return "rstd " + rstd.describe() + " does not match x " + x.describe(); });
  Tensor w32 = weight.defined() ? detail::as_f32(op, "weight", weight) : Tensor();
  require(!dweight || weight.defined(), op, [] { return std::string("dweight without a weight: nothing to accumulate"); });
  float* dw = nullptr;
  if (dweight) {
    detail::require_dtype(op, "dweight", *dweight, DType::f32);
    require(dweight->numel() == dim, op,
            [&] { return "dweight " + dweight->describe() + " must be [" + std::to_string(dim) + "]"; });
    dw = dweight->data<float>();
  }
  Tensor dx = Tensor::empty(x.shape());
  cpu::rmsnorm_backward<float>(dy.data<float>(), x.data<float>(), weight_ptr(op, weight, w32, dim),
                               rstd.data<float>(), dx.data<float>(), dw, rows, dim);
  return dx;
}

}  // namespace atl

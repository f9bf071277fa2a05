#include "kernels/ops/elementwise.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

Tensor scaled_add(const Tensor& a, float ca, const Tensor& b, float cb, Precision precision) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scaled_add", "a", a, DType::f32);
  detail::require_dtype("scaled_add", "b", b, DType::f32);
  detail::require(a.shape() == b.shape(), "scaled_add", [&] { return "a " + a.describe() + " and b " + b.describe(); });
  Tensor y = Tensor::empty(a.shape());
  cpu::scaled_sum_values(a.data<float>(), ca, b.data<float>(), cb, precision == Precision::bf16, y.data<float>(),
                         a.numel());
  return y;
}

Tensor scaled(const Tensor& a, float c) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scaled", "a", a, DType::f32);
  Tensor y = Tensor::empty(a.shape());
  cpu::scaled_values(a.data<float>(), c, y.data<float>(), a.numel());
  return y;
}

void scale_inplace(const Tensor& t, float factor) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("scale_inplace", "t", t, DType::f32);
  cpu::scaled_values(t.data<float>(), factor, t.data<float>(), t.numel());
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  KernelScope scope(KernelKind::elementwise);
  detail::require_dtype("add_inplace", "dst", dst, DType::f32);
  detail::require_dtype("add_inplace", "src", src, DType::f32);
  detail::require(dst.shape() == src.shape(), "add_inplace",
                  [&] { return "dst " + dst.describe() + " and src " + src.describe(); });
  cpu::add_values(dst.data<float>(), src.data<float>(), dst.numel());
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw std::invalid_argument("concat_rows: no parts");
  Shape shape = parts.front().shape();
  std::int64_t rows = 0;
  for (const Tensor& t : parts) {
    Shape trailing = t.shape();
    if (t.rank() < 1 || t.rank() != static_cast<std::int64_t>(shape.size()) || t.dtype() != DType::f32 ||
        !std::equal(trailing.begin() + 1, trailing.end(), shape.begin() + 1)) {
      throw std::invalid_argument("concat_rows: part " + t.describe() + " does not stack on " +
                                  parts.front().describe());
    }
    rows += t.size(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape);
  std::int64_t at = 0;
  for (const Tensor& t : parts) {
    if (t.size(0) > 0) out.slice_rows(at, at + t.size(0)).copy_from(t);
    at += t.size(0);
  }
  return out;
}

}  // namespace atl

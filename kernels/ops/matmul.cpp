#include "kernels/ops/matmul.hpp"

#include "kernels/cpu/gemm.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::as_f32;
using detail::require;


namespace {
// x[..., in] and w[out, in]: the rows of x.
std::int64_t linear_rows(const char* op, const Tensor& x, const Tensor& w) {
  require(w.rank() == 2 && x.rank() >= 1 && x.size(-1) == w.size(1), op, [&] {
    return "x " + x.describe() + " and w " + w.describe() + " do not match (expected x[..., in], w[out, in])";
  });
  return detail::rows_of(op, "x", x).rows;
}
}  // namespace

Tensor linear_forward(const Tensor& x_in, const Tensor& w_in, Precision operands, bool round_output) {
  constexpr const char* op = "linear_forward";
  Tensor x = as_f32(op, "x", x_in), w = as_f32(op, "w", w_in);
  const std::int64_t in = w.size(1), out = w.size(0), rows = linear_rows(op, x, w);
  Shape y_shape = x.shape();
  y_shape.back() = out;
  Tensor y = Tensor::empty(y_shape);
  cpu::linear_forward<float>(x.data<float>(), w.data<float>(), y.data<float>(), rows, in, out,
                            cpu::gemm_operands(operands), round_output);
  return y;
}

Tensor linear_backward(const Tensor& x_in, const Tensor& w_in, const Tensor& dy, const Tensor* dw,
                       Precision operands) {
  constexpr const char* op = "linear_backward";
  Tensor x = as_f32(op, "x", x_in), w = as_f32(op, "w", w_in);
  const std::int64_t in = w.size(1), out = w.size(0), rows = linear_rows(op, x, w);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dy.numel() == rows * out, op, [&] { return "dy " + dy.describe() + " does not match x " + x.describe(); });
  if (dw) {
    detail::require_dtype(op, "dw", *dw, DType::f32);
    require(dw->shape() == w.shape(), op, [&] { return "dw " + dw->describe() + " must match w " + w.describe(); });
  }
  Tensor dx = Tensor::empty(x.shape());
  cpu::linear_backward<float>(x.data<float>(), w.data<float>(), dy.data<float>(), dx.data<float>(),
                              dw ? dw->data<float>() : nullptr, rows, in, out, cpu::gemm_operands(operands));
  return dx;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  constexpr const char* op = "matmul";
  Tensor a = as_f32(op, "a", a_in), b = as_f32(op, "b", b_in);
  require(a.rank() == 2 && b.rank() == 2 && a.size(1) == b.size(0), op,
          [&] { return "expected a[M,K] @ b[K,N], got " + a.describe() + " @ " + b.describe(); });
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor c = Tensor::empty({m, n});
  cpu::gemm<float>(false, false, m, n, k, a.data<float>(), k, b.data<float>(), n, false, c.data<float>(), n);
  return c;
}

Tensor matmul_backward(const Tensor& a_in, const Tensor& b_in, const Tensor& dc, const Tensor* db) {
  constexpr const char* op = "matmul_backward";
  Tensor a = as_f32(op, "a", a_in), b = as_f32(op, "b", b_in);
  require(a.rank() == 2 && b.rank() == 2 && a.size(1) == b.size(0), op,
          [&] { return "expected a[M,K] and b[K,N], got " + a.describe() + " and " + b.describe(); });
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  detail::require_dtype(op, "dc", dc, DType::f32);
  require(dc.numel() == m * n, op, [&] {
    return "dc " + dc.describe() + " does not match [" + std::to_string(m) + ", " + std::to_string(n) + "]";
  });
  Tensor da = Tensor::empty({m, k});
  cpu::gemm<float>(false, true, m, k, n, dc.data<float>(), n, b.data<float>(), n, false, da.data<float>(), k);
  if (db) {
    detail::require_dtype(op, "db", *db, DType::f32);
    require(db->shape() == b.shape(), op, [&] { return "db " + db->describe() + " must match b " + b.describe(); });
    cpu::gemm<float>(true, false, k, n, m, a.data<float>(), k, dc.data<float>(), n, true, db->data<float>(), n);
  }
  return da;
}

}  // namespace atl

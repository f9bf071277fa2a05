#include "kernels/ops/embedding.hpp"

#include "kernels/cpu/embedding.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {
void check_ids(const char* op, const Tensor& ids, std::int64_t vocab) {
  detail::require_dtype(op, "ids", ids, DType::i64);
  const std::int64_t* p = ids.data<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    require(p[i] >= 0 && p[i] < vocab, op, [&] {
      return "token id " + std::to_string(p[i]) + " at index " + std::to_string(i) + " is outside [0, " +
             std::to_string(vocab) + ")";
    });
  }
}
}  // namespace

Tensor embedding_forward(const Tensor& table_in, const Tensor& ids) {
  KernelScope scope(KernelKind::elementwise);
  constexpr const char* op = "embedding_forward";
  Tensor table = detail::as_f32(op, "table", table_in);
  require(table.rank() == 2, op, [&] { return "table must be [V, H], got " + table.describe(); });
  check_ids(op, ids, table.size(0));
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  Tensor y = Tensor::empty(shape);
  cpu::embedding_forward<float>(table.data<float>(), ids.data<std::int64_t>(), y.data<float>(), ids.numel(),
                                table.size(1));
  return y;
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable) {
  KernelScope scope(KernelKind::elementwise);
  constexpr const char* op = "embedding_backward";
  detail::require_dtype(op, "dtable", dtable, DType::f32);
  detail::require_dtype(op, "dy", dy, DType::f32);
  require(dtable.rank() == 2 && dy.numel() == ids.numel() * dtable.size(1), op, [&] {
    return "dy " + dy.describe() + " does not match ids " + ids.describe() + " and dtable " + dtable.describe();
  });
  check_ids(op, ids, dtable.size(0));
  cpu::embedding_backward<float>(dy.data<float>(), ids.data<std::int64_t>(), dtable.data<float>(), ids.numel(),
                                 dtable.size(1));
}

}  // namespace atl

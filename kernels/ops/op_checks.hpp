// Shared argument checks for the Tensor-level ops: each error names the op, the argument and
// what was expected, so a wrong call reads like a sentence.
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/tensor.hpp"

namespace atl::detail {

// The message is a literal or a callable that builds it: ops run thousands of times a step, and a
// message built before the check (a std::string argument) cost a heap allocation on every call.
inline void require(bool ok, const char* op, const char* what) {
  if (!ok) [[unlikely]]
    throw std::invalid_argument(std::string(op) + ": " + what);
}
template <class Message>
requires std::is_invocable_r_v<std::string, Message>
inline void require(bool ok, const char* op, Message&& what) {
  if (!ok) [[unlikely]]
    throw std::invalid_argument(std::string(op) + ": " + what());
}

inline void require_cpu(const char* op, const char* arg, const Tensor& t) {
  require(t.defined(), op, [&] { return std::string(arg) + " is undefined"; });
  require(t.device() == Device::cpu, op, [&] {
    return std::string(arg) + " is on a CUDA device; this op has only a CPU implementation in this build";
  });
}

inline void require_dtype(const char* op, const char* arg, const Tensor& t, DType dtype) {
  require_cpu(op, arg, t);
  require(t.dtype() == dtype, op,
          [&] { return std::string(arg) + " must be " + std::string(dtype_name(dtype)) + ", got " + t.describe(); });
}

// A cpu tensor of exactly this dtype and shape.
inline void require_tensor(const char* op, const char* arg, const Tensor& t, DType dtype, const Shape& shape) {
  require(t.defined() && t.device() == Device::cpu && t.dtype() == dtype && t.shape() == shape, op, [&] {
    return std::string(arg) + " must be a cpu " + std::string(dtype_name(dtype)) + shape_string(shape) +
           " tensor, got " + t.describe();
  });
}

// A tensor as rows of its last dimension, which must not be empty (a row of nothing has no norm
// or product to take, and rows = numel / width would divide by zero).
struct Rows {
  std::int64_t rows, width;
};
inline Rows rows_of(const char* op, const char* arg, const Tensor& t) {
  require(t.rank() >= 1 && t.size(-1) > 0, op,
          [&] { return std::string(arg) + " must have a last dimension of at least 1, got " + t.describe(); });
  return {t.numel() / t.size(-1), t.size(-1)};
}

// fp32 view of a floating tensor: the tensor itself when f32, an upcast copy when bf16.
inline Tensor as_f32(const char* op, const char* arg, const Tensor& t) {
  require_cpu(op, arg, t);
  if (t.dtype() == DType::f32) return t;
  require(t.dtype() == DType::bf16, op, [&] { return std::string(arg) + " must be f32 or bf16, got " + t.describe(); });
  return t.to(DType::f32);
}

}  // namespace atl::detail

#include "kernels/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/vector_math.hpp"
#include "kernels/host_allocator.hpp"
#include "kernels/kernel_clock.hpp"

namespace atl {

namespace {

// The conversions on hot paths (gathers in bf16, upcasts), vectorized
// per instruction set (integer bit work: the same bits at every level).
struct ToBf16Loop {
  [[gnu::always_inline]] void operator()(const float* src, bf16* dst, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
  }
};
struct ToFloatLoop {
  [[gnu::always_inline]] void operator()(const bf16* src, float* dst, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  }
};

// v as an integer (truncated toward zero); a NaN, an infinity or a value out of I's range has no
// integer value (the plain cast would be undefined behaviour).
template <class I>
I checked_integer(double v, std::int64_t index) {
  constexpr double low = static_cast<double>(std::numeric_limits<I>::min());  // -2^31 or -2^63: exact
  if (!(v >= low && v < -low)) {
    throw std::domain_error("Tensor conversion: element " + std::to_string(index) + " (" + std::to_string(v) +
                            ") has no " + std::to_string(sizeof(I) * 8) + "-bit integer value");
  }
  return static_cast<I>(v);
}

}  // namespace

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    // (A product past int64 would wrap to a small size: a buffer far smaller than its indexing.)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      throw std::invalid_argument("shape " + shape_string(shape) + ": " +
                                  (d < 0 ? "a negative size" : "more elements than an int64 counts"));
    }
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device != Device::cpu) {
    throw std::runtime_error("Storage: only cpu storage is allocated by the CPU build");
  }
  data_ = host_allocate(bytes);
}

Storage::~Storage() { host_free(data_, bytes_); }

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("Tensor: negative dimension in shape " + shape_string(shape));
  }
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.dtype_ = dtype;
  if (t.numel_ > std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(element_size(dtype))) {
    throw std::invalid_argument("Tensor: shape " + shape_string(t.shape_) + " holds more bytes than an int64 counts");
  }
  t.storage_ = std::make_shared<Storage>(t.bytes(), device);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.bytes());
  return t;
}

Tensor Tensor::full(Shape shape, float value) {
  Tensor t = empty(std::move(shape), DType::f32);
  t.fill(value);
  return t;
}

Tensor Tensor::from_floats(Shape shape, std::span<const float> values) {
  Tensor t = empty(std::move(shape), DType::f32);
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument("Tensor::from_floats: " + std::to_string(values.size()) +
                                " values for shape " + shape_string(t.shape_));
  }
  std::memcpy(t.raw(), values.data(), t.bytes());
  return t;
}

std::int64_t Tensor::size(std::int64_t dim) const {
  std::int64_t r = rank();
  if (dim < 0) dim += r;
  if (dim < 0 || dim >= r) {
    throw std::out_of_range("Tensor::size: dim " + std::to_string(dim) + " of " + describe());
  }
  return shape_[static_cast<std::size_t>(dim)];
}

void* Tensor::raw() const {
  if (!storage_) throw std::logic_error("Tensor: use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

void Tensor::check_dtype(DType expected) const {
  if (expected != dtype_) {
    throw std::logic_error("Tensor: accessed " + describe() + " as " + std::string(dtype_name(expected)));
  }
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape_numel(shape) != numel()) {
    throw std::invalid_argument("Tensor::reshape: " + describe() + " to " + shape_string(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  return t;
}

Tensor Tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  if (rank() == 0 || begin < 0 || end < begin || end > shape_[0]) {
    throw std::out_of_range("Tensor::slice_rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") of " + describe());
  }
  Tensor t = *this;
  std::int64_t row = numel() / std::max<std::int64_t>(shape_[0], 1);
  t.byte_offset_ += static_cast<std::size_t>(begin * row) * element_size(dtype_);
  t.shape_[0] = end - begin;
  t.numel_ = shape_numel(t.shape_);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  std::memcpy(t.raw(), raw(), bytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype);
  convert_into(t);
  return t;
}

void Tensor::convert_into(const Tensor& t) const {
  KernelScope scope(KernelKind::conversion);
  if (t.shape_ != shape_) throw std::invalid_argument("Tensor::convert_into: " + describe() + " into " + t.describe());
  const DType dtype = t.dtype_;
  if (dtype == dtype_) return t.copy_from(*this);
  const std::int64_t n = numel();
  // The two conversions on hot paths (gathers in bf16, upcasts for compute) get plain loops.
  if (dtype_ == DType::f32 && dtype == DType::bf16) {
    cpu::run_for_isa<ToBf16Loop>(data<float>(), t.data<bf16>(), n);
    return;
  }
  if (dtype_ == DType::bf16 && dtype == DType::f32) {
    cpu::run_for_isa<ToFloatLoop>(data<bf16>(), t.data<float>(), n);
    return;
  }
  auto read = [&](std::int64_t i) -> double {
    switch (dtype_) {
      case DType::f32: return data<float>()[i];
      case DType::bf16: return to_float(data<bf16>()[i]);
      case DType::i32: return data<std::int32_t>()[i];
      case DType::i64: return static_cast<double>(data<std::int64_t>()[i]);
      case DType::boolean: return data<bool>()[i] ? 1.0 : 0.0;
    }
    return 0.0;
  };
  for (std::int64_t i = 0; i < n; ++i) {
    double v = read(i);
    switch (dtype) {
      case DType::f32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::bf16: t.data<bf16>()[i] = to_bf16(static_cast<float>(v)); break;
      case DType::i32: t.data<std::int32_t>()[i] = checked_integer<std::int32_t>(v, i); break;
      case DType::i64: t.data<std::int64_t>()[i] = checked_integer<std::int64_t>(v, i); break;
      case DType::boolean: t.data<bool>()[i] = v != 0.0; break;
    }
  }
}

void Tensor::fill(float value) const {
  if (dtype_ == DType::f32) {
    for (float& x : span<float>()) x = value;
  } else if (dtype_ == DType::bf16) {
    for (bf16& x : span<bf16>()) x = to_bf16(value);
  } else {
    throw std::logic_error("Tensor::fill: floating tensors only, got " + describe());
  }
}

void Tensor::copy_from(const Tensor& other) const {
  if (other.shape_ != shape_ || other.dtype_ != dtype_) {
    throw std::invalid_argument("Tensor::copy_from: " + other.describe() + " into " + describe());
  }
  std::memmove(raw(), other.raw(), bytes());
}

std::string Tensor::describe() const {
  return defined() ? std::string(dtype_name(dtype_)) + shape_string(shape_) : std::string("undefined");
}

void round_to_bf16_inplace(const Tensor& t) {
  KernelScope scope(KernelKind::conversion);
  cpu::round_to_bf16_values(t.data<float>(), t.numel());
}

Tensor bf16_rounded(const Tensor& t) {
  KernelScope scope(KernelKind::conversion);
  if (t.dtype() != DType::f32) throw std::invalid_argument("bf16_rounded: expected f32, got " + t.describe());
  Tensor out = Tensor::empty(t.shape());
  cpu::round_to_bf16_copy(t.data<float>(), out.data<float>(), t.numel());
  return out;
}

}  // namespace atl

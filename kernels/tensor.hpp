// Tensor: a shape, an element type, a device and reference-counted contiguous storage.
// Copies of a Tensor share storage (like torch.Tensor handles); clone() copies the bytes.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

namespace atl {

enum class Device : std::uint8_t { cpu, cuda };

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

// One allocation; freed when the last Tensor that refers to it goes away.
class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_ = Device::cpu;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(Shape shape, DType dtype = DType::f32);
  static Tensor full(Shape shape, float value);
  static Tensor from_floats(Shape shape, std::span<const float> values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t rank() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t dim) const;  // negative dims count from the end
  std::int64_t numel() const { return numel_; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * element_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const;
  template <class T> T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <class T> std::span<T> span() const { return {data<T>(), static_cast<std::size_t>(numel())}; }

  // Same storage, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of dim 0, sharing storage.
  Tensor slice_rows(std::int64_t begin, std::int64_t end) const;
  Tensor clone() const;
  // Element-type conversion (f32 <-> bf16 rounds to nearest even; integer types copy values).
  Tensor to(DType dtype) const;
  // The same conversion into an existing tensor of the same shape (reused buffers).
  void convert_into(const Tensor& destination) const;
  void fill(float value) const;
  void copy_from(const Tensor& other) const;

  std::string describe() const;  // "f32[2, 3]"; "undefined" for an undefined tensor

 private:
  void check_dtype(DType expected) const;

  Shape shape_;
  std::int64_t numel_ = 1;  // product of shape_, kept with it (loops read numel() per element)
  DType dtype_ = DType::f32;
  std::shared_ptr<Storage> storage_;
  std::size_t byte_offset_ = 0;
};

// Round every element of an f32 tensor to the nearest bf16 value, in place.
void round_to_bf16_inplace(const Tensor& t);
// A new f32 tensor holding t's elements rounded to the nearest bf16 value (one pass: no copy first).
Tensor bf16_rounded(const Tensor& t);

}  // namespace atl

// Element types and the bf16 format. bf16 is stored as uint16_t (the top half of an IEEE
// float32); conversion rounds to nearest, ties to even, and keeps NaN a (quiet) NaN.
#pragma once

#include <cstdint>
#include <cstddef>
#include <string_view>

namespace atl {

enum class DType : std::uint8_t { f32, bf16, i32, i64, boolean };

constexpr std::size_t element_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

struct bf16 {
  std::uint16_t bits = 0;
};

#if defined(__CUDACC__)
#define ATOLL_HOST_DEVICE __host__ __device__
#else
#define ATOLL_HOST_DEVICE
#endif

ATOLL_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = __builtin_bit_cast(std::uint32_t, f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN stays NaN (quieted)
  }
  // Round to nearest even; infinities pass through unchanged, overflow rounds to infinity.
  std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

ATOLL_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t b) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(b) << 16);  // builtin: nvcc in C++17 has no std::bit_cast
}

constexpr bf16 to_bf16(float f) { return bf16{float_to_bf16_bits(f)}; }
constexpr float to_float(bf16 b) { return bf16_bits_to_float(b.bits); }

// The float nearest to f that bf16 can represent: the emulation point used in precision bf16.
ATOLL_HOST_DEVICE constexpr float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

}  // namespace atl

// Shared fixtures for checkpoint tests: a temporary directory, raw file bytes, tensors with
// deterministic contents of every dtype, bitwise comparison.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "graph/param.hpp"
#include "tests/support/same_bits.hpp"

namespace atl::checkpoint_testing {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("atoll_test_checkpoint_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// The file's bytes; a missing file fails the test (two missing files are not "the same bytes").
inline std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  INFO("reading " << file.string());
  REQUIRE(in.is_open());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a literal header and data buffer (for corruption cases).
inline void write_raw_safetensors(const fs::path& file, const std::string& header, const std::string& data) {
  write_bytes(file, le64(header.size()) + header + data);
}

// Bytes from a small deterministic generator (splitmix64), so contents differ per tensor and seed.
inline std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline Tensor random_f32(Shape shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(static_cast<double>(splitmix(seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return t;
}

// Every byte random except bool, whose bytes are 0 or 1.
inline Tensor random_tensor(Shape shape, DType dtype, std::uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (std::size_t i = 0; i < t.bytes(); ++i) {
    auto byte = static_cast<unsigned char>(splitmix(seed) & 0xff);
    p[i] = dtype == DType::boolean ? (byte & 1) : byte;
  }
  return t;
}

using atl::testing::same_bits;

// Same names (in any order) and bitwise-equal tensors.
inline bool same_tensors(const TensorMap& a, const TensorMap& b) {
  if (a.names().size() != b.names().size()) return false;
  for (const auto& name : a.names()) {
    if (!b.contains(name) || !same_bits(a.at(name), b.at(name))) return false;
  }
  return true;
}

}  // namespace atl::checkpoint_testing

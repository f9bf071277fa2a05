// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value depends only on
// (key, counter), so parameter init is a pure function of (seed, parameter name, element index)
// and does not change with how a parameter is sharded or in which order elements are visited.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace atl {

using PhiloxBlock = std::array<std::uint32_t, 4>;

constexpr PhiloxBlock philox4x32(PhiloxBlock counter, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * counter[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// FNV-1a: a stable 64-bit name hash (std::hash is not stable across builds).
constexpr std::uint64_t stable_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A stream of random numbers identified by (seed, name); element i is independent of the others.
class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::string_view name) {
    std::uint64_t mixed = seed ^ stable_hash(name);
    key_ = {static_cast<std::uint32_t>(mixed), static_cast<std::uint32_t>(mixed >> 32)};
    stream_ = static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(seed);
  }

  PhiloxBlock block(std::uint64_t index) const {
    return philox4x32({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream_, 0u},
                      key_);
  }
  // Uniform in (0, 1): never 0, so log() is safe.
  static double to_unit(std::uint32_t x) { return (static_cast<double>(x) + 0.5) * (1.0 / 4294967296.0); }
  double uniform(std::uint64_t index) const { return to_unit(block(index)[0]); }
  // Standard normal by Box-Muller on the first two words of the block.
  double normal(std::uint64_t index) const {
    PhiloxBlock b = block(index);
    double u1 = to_unit(b[0]), u2 = to_unit(b[1]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::uint64_t bits64(std::uint64_t index) const {
    PhiloxBlock b = block(index);
    return (static_cast<std::uint64_t>(b[2]) << 32) | b[3];
  }
  // Uniform integer in [0, n) (n > 0); the modulo bias is below 2^-32 for the n we use.
  std::uint64_t below(std::uint64_t index, std::uint64_t n) const { return bits64(index) % n; }

 private:
  std::array<std::uint32_t, 2> key_{};
  std::uint32_t stream_ = 0;
};

}  // namespace atl

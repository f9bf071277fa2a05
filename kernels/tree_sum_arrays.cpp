#include "kernels/tree_sum_arrays.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace atl {

namespace {

constexpr std::int64_t kBlock = 1024;  // floats summed at once: a few blocks stay in L1
constexpr int kMaxDepth = 32;          // tree levels: count < 2^32

// dst[0..len) = tree(lo, count) at offset `at`; scratch holds one block per deeper level.
void tree_block(const float* const* parts, int lo, int count, std::int64_t at, std::int64_t len, float* dst,
                float* scratch) {
  if (count == 1) {
    std::memcpy(dst, parts[lo] + at, static_cast<std::size_t>(len) * sizeof(float));
    return;
  }
  int p = 1;
  while (p * 2 < count) p *= 2;
  tree_block(parts, lo, p, at, len, dst, scratch);
  const float* right = parts[lo + p] + at;
  if (count - p > 1) {
    tree_block(parts, lo + p, count - p, at, len, scratch, scratch + kBlock);
    right = scratch;
  }
  for (std::int64_t k = 0; k < len; ++k) dst[k] += right[k];
}

}  // namespace

void tree_sum_arrays(const float* const* parts, int count, std::int64_t n, float* out) {
  if (count < 1) throw std::invalid_argument("tree_sum_arrays: no parts");
  alignas(64) float blocks[kMaxDepth + 1][kBlock];
  for (std::int64_t at = 0; at < n; at += kBlock) {
    const std::int64_t len = std::min(kBlock, n - at);
    tree_block(parts, 0, count, at, len, blocks[0], blocks[1]);
    std::memcpy(out + at, blocks[0], static_cast<std::size_t>(len) * sizeof(float));
  }
}

}  // namespace atl

// The pairwise tree of tree_sum.hpp over whole float arrays, elementwise: out[k] = tree over
// parts[0..count) of parts[i][k]. Evaluated in cache-sized blocks with no allocation, so a
// transport can sum a reduction's chunk as it arrives (comm/ucx) with the very additions, in the
// very order, of PairwiseTreeSum over the same values: the bits are the same.
#pragma once
#include <cstdint>

namespace atl {

// `out` may be any part itself (each block is summed aside, then stored); it must not overlap a
// part at another offset.
void tree_sum_arrays(const float* const* parts, int count, std::int64_t n, float* out);

}  // namespace atl

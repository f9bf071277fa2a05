// Runs on a GPU machine; exits 77 (CTest: skipped) where no CUDA device answers.
#include <cstdio>

#include "kernels/cuda/device_query.hpp"

int main() {
  int count = atl::cuda::device_count();
  if (count <= 0) {
    std::printf("no CUDA device (device_count=%d): skipping\n", count);
    return 77;
  }
  bool ok = atl::cuda::bf16_rounding_matches_known_bits();
  std::printf("%d CUDA device(s); bf16 rounding on device gives the known bits: %s\n", count, ok ? "yes" : "NO");
  return ok ? 0 : 1;
}

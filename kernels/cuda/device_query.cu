#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/device_query.hpp"
#include "kernels/dtype.hpp"

namespace atl::cuda {

namespace {
__global__ void round_to_bf16_kernel(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = atl::round_to_bf16(in[i]);
}
}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return -1;
  return count;
}

bool bf16_rounding_matches_known_bits() {
  constexpr int n = 7;
  const float host_in[n] = {1.0f, 1.00390625f, 1.01171875f, 3.14159265f, -2.5e-3f, 65504.0f, 1e30f};
  // The high halves of round-to-nearest-even, by hand: 1 + 2^-8 ties down to even (0x3f80),
  // 1 + 3 * 2^-8 ties up to even (0x3f82), 65504's mantissa carries into the exponent (65536).
  const std::uint32_t expected[n] = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x40490000u,
                                     0xbb240000u, 0x47800000u, 0x714a0000u};
  float host_out[n] = {};
  float *d_in = nullptr, *d_out = nullptr;
  bool ok = cudaMalloc(&d_in, sizeof host_in) == cudaSuccess && cudaMalloc(&d_out, sizeof host_out) == cudaSuccess &&
            cudaMemcpy(d_in, host_in, sizeof host_in, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    round_to_bf16_kernel<<<1, 32>>>(d_in, d_out, n);
    ok = cudaGetLastError() == cudaSuccess &&
         cudaMemcpy(host_out, d_out, sizeof host_out, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  cudaFree(d_in);
  cudaFree(d_out);
  for (int i = 0; ok && i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &host_out[i], sizeof bits);
    ok = bits == expected[i];
  }
  return ok;
}

}  // namespace atl::cuda

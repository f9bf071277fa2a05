#include <cuda_runtime.h>

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

bool bf16_round_trip_matches_host() {
  constexpr int n = 6;
  const float host_in[n] = {1.0f, 1.00390625f, 3.14159265f, -2.5e-3f, 65504.0f, 1e30f};
  float host_out[n] = {};
  float *d_in = nullptr, *d_out = nullptr;
  if (cudaMalloc(&d_in, sizeof host_in) != cudaSuccess) return false;
  if (cudaMalloc(&d_out, sizeof host_out) != cudaSuccess) return false;
  cudaMemcpy(d_in, host_in, sizeof host_in, cudaMemcpyHostToDevice);
  round_to_bf16_kernel<<<1, 32>>>(d_in, d_out, n);
  cudaMemcpy(host_out, d_out, sizeof host_out, cudaMemcpyDeviceToHost);
  cudaFree(d_in);
  cudaFree(d_out);
  for (int i = 0; i < n; ++i) {
    if (host_out[i] != atl::round_to_bf16(host_in[i])) return false;
  }
  return true;
}

}  // namespace atl::cuda

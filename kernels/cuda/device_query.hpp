// The first CUDA translation unit: how many devices answer. Used to skip GPU tests cleanly.
#pragma once

namespace atl::cuda {
// Number of CUDA devices, or -1 when the runtime cannot reach a driver (no GPU here).
int device_count();
// Runs a one-block kernel that rounds a few floats to bf16 on the device (atoll's round_to_bf16,
// the function host and device share) and checks the bits against values worked out by hand:
// ties to even both ways, a carry into the exponent. False when a CUDA call fails or a bit differs.
bool bf16_rounding_matches_known_bits();
}  // namespace atl::cuda

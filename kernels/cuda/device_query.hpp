// The first CUDA translation unit: how many devices answer. Used to skip GPU tests cleanly.
#pragma once

namespace atl::cuda {
// Number of CUDA devices, or -1 when the runtime cannot reach a driver (no GPU here).
int device_count();
// Runs a one-block kernel that rounds a few floats to bf16 on the device and checks the result
// against the host rounding; returns true when every value matches.
bool bf16_round_trip_matches_host();
}  // namespace atl::cuda

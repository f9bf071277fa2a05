// Host memory for tensor storage: a caching allocator. Training allocates the same sizes every
// step (op outputs, gradients, gathers); returning large blocks to the OS and faulting them in
// again costs more than the work on small models. Freed blocks of 64 KiB and more are kept in size
// classes (four per power of two, so at most 25% slack) and handed out again; smaller ones go
// straight to malloc, which already caches them. Thread-safe. Blocks are 64-byte aligned.
#pragma once
#include <cstddef>
#include <cstdint>

namespace atl {

struct HostCacheStats {
  std::size_t cached_bytes = 0;  // held in free lists now
  std::size_t cache_limit = 0;   // the most the free lists may hold
  std::uint64_t reused = 0;      // allocations served from the cache
  std::uint64_t fresh = 0;       // cacheable allocations that went to the system
};

// At least `bytes` bytes (any size; 0 gives a minimal block). Throws std::bad_alloc when the
// system refuses even after the cache was released.
void* host_allocate(std::size_t bytes);
// `bytes` as passed to host_allocate.
void host_free(void* p, std::size_t bytes);

// Frees every cached block back to the system.
void host_release_cached();
// Bounds the cached bytes (default 2 GiB); blocks that would exceed it are freed at once.
void host_set_cache_limit(std::size_t bytes);
HostCacheStats host_cache_stats();

// Bytes of tensor storage allocated and not yet freed (as requested, before size classes), and
// the most there was since the last reset: what a run's tensors need at their peak.
std::size_t host_live_bytes();
// Tensor storage allocations so far (every host_allocate, cached or not): allocations per step.
std::uint64_t host_allocation_count();
std::size_t host_peak_live_bytes();
void host_reset_peak_live_bytes();

}  // namespace atl

#include "kernels/host_allocator.hpp"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace atl {

namespace {

constexpr std::size_t kAlignment = 64;  // one cache line; AVX-512 loads stay aligned
constexpr std::size_t kMinCached = std::size_t{64} << 10;

// The class size of a cacheable request: the smallest of 2^e, 1.25, 1.5, 1.75 x 2^e that holds it.
std::size_t class_size(std::size_t bytes) {
  const int e = std::bit_width(bytes - 1) - 1;  // 2^e < bytes <= 2^(e+1)
  const std::size_t base = std::size_t{1} << e, quarter = base / 4;
  std::size_t size = base + quarter;
  while (size < bytes) size += quarter;
  return size;
}

void* system_allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
}

struct HostCache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;
  HostCacheStats stats{0, std::size_t{2} << 30, 0, 0};

  void release_locked() {
    for (auto& [size, blocks] : free_blocks) {
      for (void* p : blocks) std::free(p);
      stats.cached_bytes -= size * blocks.size();
      blocks.clear();
    }
  }
};

std::atomic<std::size_t> g_live{0}, g_peak{0};
std::atomic<std::uint64_t> g_allocations{0};

void count_allocation(std::size_t bytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// Leaked on purpose: tensors held by static objects may be freed after main returns.
HostCache& cache() {
  static HostCache* c = new HostCache;
  return *c;
}

}  // namespace

namespace {
void* allocate_block(std::size_t bytes) {
  if (bytes > (std::size_t{1} << 62)) throw std::bad_alloc();  // no machine has it; size classes would wrap
  if (bytes < kMinCached) {
    void* p = system_allocate(bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const std::size_t size = class_size(bytes);
  HostCache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.stats.cached_bytes -= size;
      ++c.stats.reused;
      return p;
    }
    ++c.stats.fresh;
  }
  void* p = system_allocate(size);
  if (!p) {  // the cache may hold what the system lacks
    {
      std::lock_guard lock(c.mutex);
      c.release_locked();
    }
    p = system_allocate(size);
    if (!p) throw std::bad_alloc();
  }
  return p;
}

}  // namespace

void* host_allocate(std::size_t bytes) {
  void* p = allocate_block(bytes);
  count_allocation(bytes);
  return p;
}

void host_free(void* p, std::size_t bytes) {
  if (!p) return;
  g_live.fetch_sub(bytes, std::memory_order_relaxed);
  if (bytes < kMinCached) {
    std::free(p);
    return;
  }
  const std::size_t size = class_size(bytes);
  HostCache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (c.stats.cached_bytes + size <= c.stats.cache_limit) {
      c.free_blocks[size].push_back(p);
      c.stats.cached_bytes += size;
      return;
    }
  }
  std::free(p);
}

void host_release_cached() {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  c.release_locked();
}

void host_set_cache_limit(std::size_t bytes) {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  c.stats.cache_limit = bytes;
  if (c.stats.cached_bytes > bytes) c.release_locked();
}

std::size_t host_live_bytes() { return g_live.load(std::memory_order_relaxed); }
std::uint64_t host_allocation_count() { return g_allocations.load(std::memory_order_relaxed); }
std::size_t host_peak_live_bytes() { return g_peak.load(std::memory_order_relaxed); }
void host_reset_peak_live_bytes() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

HostCacheStats host_cache_stats() {
  HostCache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.stats;
}

}  // namespace atl

// The caching host allocator behind tensor storage: reuse within a size class, the cache limit,
// release, alignment, and integrity under two threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/host_allocator.hpp"
#include "kernels/tensor.hpp"

using namespace atl;

TEST_CASE("host allocator: a freed large block serves the next request of its size class", "[allocator]") {
  host_release_cached();
  const HostCacheStats before = host_cache_stats();
  void* a = host_allocate(1'000'000);
  host_free(a, 1'000'000);
  CHECK(host_cache_stats().cached_bytes >= 1'000'000);
  void* b = host_allocate(1'000'100);  // same class (1 MiB = 1.0 x 2^20 holds both)
  CHECK(b == a);
  CHECK(host_cache_stats().reused == before.reused + 1);
  host_free(b, 1'000'100);  // cached again
  void* c = host_allocate(3'000'000);  // another class: the cached 1 MiB block must not serve it
  CHECK(c != a);
  host_free(c, 3'000'000);
  host_release_cached();
  CHECK(host_cache_stats().cached_bytes == 0);
}

TEST_CASE("host allocator: nothing is cached beyond the limit, small blocks never are", "[allocator]") {
  host_release_cached();
  host_set_cache_limit(0);
  void* big = host_allocate(1 << 20);
  host_free(big, 1 << 20);
  CHECK(host_cache_stats().cached_bytes == 0);
  host_set_cache_limit(std::size_t{2} << 30);
  void* small = host_allocate(1000);
  host_free(small, 1000);
  CHECK(host_cache_stats().cached_bytes == 0);
}

TEST_CASE("host allocator: blocks are 64-byte aligned, a freed block is reused, and zeros() clears it",
          "[allocator]") {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{65536}, std::size_t{65537},
                            std::size_t{5'000'000}}) {
    void* p = host_allocate(bytes);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    if (bytes) std::memset(p, 0xab, bytes);  // all of it is ours (ASan would say otherwise)
    host_free(p, bytes);
  }
  const std::size_t limit = host_cache_stats().cache_limit;
  host_set_cache_limit(std::size_t{2} << 30);
  Tensor t = Tensor::full({300, 300}, 2.5f);  // a cached size class
  const void* block = t.raw();
  t = Tensor();  // back to the cache, 2.5f still in it
  const std::uint64_t reused_before = host_cache_stats().reused;
  Tensor z = Tensor::zeros({300, 300});
  REQUIRE(host_cache_stats().reused == reused_before + 1);  // the same size class: served from the cache
  CHECK(z.raw() == block);
  for (float v : z.span<float>()) REQUIRE(v == 0.0f);  // zeros() clears the reused block
  host_set_cache_limit(limit);
}

TEST_CASE("host allocator: two threads allocating and freeing never share a live block", "[allocator]") {
  // Each thread keeps 8 blocks alive at a time and checks every byte of one before freeing it; the
  // live blocks of both threads are registered, so a block handed out while still live anywhere
  // (an overlap) is found at once, not only when the other thread's bytes happen to show.
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> live;  // start -> bytes
  bool overlap = false;
  auto claim = [&](const void* p, std::size_t bytes) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex);
    const auto next = live.lower_bound(at);
    if (next != live.end() && next->first < at + bytes) overlap = true;
    if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > at) overlap = true;
    live[at] = bytes;
  };
  auto release = [&](const void* p) {
    std::lock_guard<std::mutex> lock(mutex);
    live.erase(reinterpret_cast<std::uintptr_t>(p));
  };
  auto work = [&](std::uint8_t tag, bool* ok) {
    std::array<std::pair<std::uint8_t*, std::size_t>, 8> ring{};
    auto retire = [&](std::pair<std::uint8_t*, std::size_t>& slot) {
      if (!slot.first) return;
      *ok = *ok && std::all_of(slot.first, slot.first + slot.second, [tag](std::uint8_t b) { return b == tag; });
      release(slot.first);
      host_free(slot.first, slot.second);
      slot = {nullptr, 0};
    };
    for (int i = 0; i < 300; ++i) {
      auto& slot = ring[static_cast<std::size_t>(i) % ring.size()];
      retire(slot);
      const std::size_t bytes = std::size_t{70'000} + static_cast<std::size_t>(i % 7) * 40'000;
      auto* p = static_cast<std::uint8_t*>(host_allocate(bytes));
      claim(p, bytes);
      std::memset(p, tag, bytes);
      slot = {p, bytes};
    }
    for (auto& slot : ring) retire(slot);
  };
  const std::uint64_t reused_before = host_cache_stats().reused;
  bool ok1 = true, ok2 = true;
  std::thread a(work, std::uint8_t{1}, &ok1), b(work, std::uint8_t{2}, &ok2);
  a.join();
  b.join();
  CHECK_FALSE(overlap);
  CHECK(ok1);
  CHECK(ok2);
  CHECK(host_cache_stats().reused > reused_before);  // freed blocks were served again (the cache ran)
}

#include "kernels/kernel_clock.hpp"

#include <atomic>
#include <chrono>

namespace atl {

namespace {

std::atomic<bool> g_enabled{false};
std::array<std::atomic<std::int64_t>, kKernelKinds> g_ns{};
thread_local KernelScope* t_open = nullptr;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* kernel_kind_name(KernelKind kind) {
  static constexpr const char* kNames[kKernelKinds] = {"gemm",       "attention",  "norm", "activation",
                                                       "routing",    "experts",    "loss", "optimizer",
                                                       "conversion", "elementwise"};
  return kNames[static_cast<int>(kind)];
}

void kernel_clock_enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void kernel_clock_reset() {
  for (auto& ns : g_ns) ns.store(0, std::memory_order_relaxed);
}

std::array<double, kKernelKinds> kernel_clock_seconds() {
  std::array<double, kKernelKinds> s{};
  for (int i = 0; i < kKernelKinds; ++i) s[i] = static_cast<double>(g_ns[i].load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

KernelScope::KernelScope(KernelKind kind) : kind_(kind) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  active_ = true;
  parent_ = t_open;
  t_open = this;
  start_ns_ = now_ns();
}

KernelScope::~KernelScope() {
  if (!active_) return;
  const std::int64_t elapsed = now_ns() - start_ns_;
  g_ns[static_cast<int>(kind_)].fetch_add(elapsed - child_ns_, std::memory_order_relaxed);
  if (parent_) parent_->child_ns_ += elapsed;
  t_open = parent_;
}

}  // namespace atl

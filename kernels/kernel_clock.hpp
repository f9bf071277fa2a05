// Where a step's time goes, by kind of kernel: off by default (one relaxed load per kernel call),
// turned on by the benchmark. Times are exclusive: a GEMM inside attention counts as gemm, not as
// attention. Each thread's scopes add up separately, so with several compute threads the totals
// are thread-seconds.
#pragma once
#include <array>
#include <cstdint>

namespace atl {

enum class KernelKind : int {
  gemm,
  attention,
  norm,
  activation,
  routing,
  experts,
  loss,
  optimizer,
  conversion,
  elementwise,
  count
};
inline constexpr int kKernelKinds = static_cast<int>(KernelKind::count);

const char* kernel_kind_name(KernelKind kind);

void kernel_clock_enable(bool on);
void kernel_clock_reset();
// Seconds per kind since the last reset.
std::array<double, kKernelKinds> kernel_clock_seconds();

// Times its own lifetime, less the lifetime of scopes opened inside it on the same thread.
class KernelScope {
 public:
  explicit KernelScope(KernelKind kind);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  KernelKind kind_;
  bool active_ = false;
  std::int64_t start_ns_ = 0, child_ns_ = 0;
  KernelScope* parent_ = nullptr;
};

}  // namespace atl

// The kernel clock behind the benchmark's step breakdown: off by default, per-kind totals, and
// exclusive time (a GEMM inside an attention scope counts once, as gemm).
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.hpp"
#include "kernels/kernel_clock.hpp"

using namespace atl;

namespace {
void some_gemm() {
  std::vector<float> a(256 * 256, 1.0f), b(256 * 256, 0.5f), c(256 * 256);
  cpu::gemm<float>(false, false, 256, 256, 256, a.data(), 256, b.data(), 256, false, c.data(), 256);
}
double at(KernelKind k) { return kernel_clock_seconds()[static_cast<int>(k)]; }
}  // namespace

TEST_CASE("kernel clock: records nothing while off", "[kernel_clock]") {
  kernel_clock_enable(false);
  kernel_clock_reset();
  some_gemm();
  CHECK(at(KernelKind::gemm) == 0.0);
}

TEST_CASE("kernel clock: a scope inside another counts once, under its own kind", "[kernel_clock]") {
  kernel_clock_reset();
  kernel_clock_enable(true);
  const auto t0 = std::chrono::steady_clock::now();
  {
    KernelScope outer(KernelKind::attention);
    for (int i = 0; i < 4; ++i) some_gemm();  // gemm_f32 opens its own scope
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kernel_clock_enable(false);
  CHECK(at(KernelKind::gemm) > 0.0);
  // Exclusive: the two kinds together fit in the wall time of the outer scope (counting the GEMMs
  // under both kinds would exceed it by the GEMMs' time).
  CHECK(at(KernelKind::gemm) + at(KernelKind::attention) <= wall);
  CHECK(at(KernelKind::loss) == 0.0);
  CHECK(std::string(kernel_kind_name(KernelKind::elementwise)) == "elementwise");
}

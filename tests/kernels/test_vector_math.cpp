// exp, sigmoid, tanh and bf16 rounding of vector_math.hpp: accuracy against double, the special
// values, and the same bits at every instruction-set level and between the vector loop and the
// scalar function.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/vector_math.hpp"
#include "kernels/dtype.hpp"
#include "kernels/rng.hpp"
#include "tests/support/isa_levels.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;

namespace {

// Arguments over exp's whole finite range plus the softmax range [-30, 0] densely, with an odd
// count so the vector loops have a remainder.
std::vector<float> arguments() {
  std::vector<float> x;
  CounterRng rng(5, "exp");
  for (std::uint64_t i = 0; i < 20001; ++i) {
    const double u = rng.uniform(i);
    x.push_back(static_cast<float>(i % 2 ? -30.0 * u : -87.0 + 175.72 * u));  // up to 88.72, below ln(FLT_MAX)
  }
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 0.5f * 0.6931472f, -87.0f, 88.0f, 88.5f, 88.72f}) x.push_back(v);
  return x;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Runs fn(x) at every instruction-set level this CPU has; all must give the same bits.
template <class Fn>
std::vector<float> same_at_every_level(const std::vector<float>& x, Fn fn) {
  std::vector<float> first;
  bool have_first = false;
  testing::for_each_isa_level([&] {
    std::vector<float> y = x;
    fn(y.data(), static_cast<std::int64_t>(y.size()));
    if (!have_first) {
      first = y;
      have_first = true;
    } else {
      CHECK(bits_of(y) == bits_of(first));
    }
  });
  return first;
}

}  // namespace

TEST_CASE("vector math: exp is within 2^-22 relative of exp in double, the same bits everywhere", "[vector_math]") {
  const std::vector<float> x = arguments();
  const std::vector<float> y = same_at_every_level(x, cpu::exp_inplace);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = atl::testing::worst_of(worst, std::abs(y[i] - want) / want);
    CHECK(cpu::exp_f32(x[i]) == y[i]);
  }
  CHECK(worst < 0x1p-22);
  CHECK(cpu::exp_f32(0.0f) == 1.0f);
}

TEST_CASE("vector math: exp's range ends and special values", "[vector_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x{-inf, -1e30f, -88.0f, 89.0f, 1e30f, inf, std::numeric_limits<float>::quiet_NaN()};
  cpu::exp_inplace(x.data(), static_cast<std::int64_t>(x.size()));
  CHECK(x[0] == 0.0f);  // masked scores: exp(-inf) is exactly 0
  CHECK(x[1] == 0.0f);
  CHECK(x[2] == 0.0f);  // below the normal range: flushed, not a denormal
  CHECK(x[3] == inf);
  CHECK(x[4] == inf);
  CHECK(x[5] == inf);
  CHECK(std::isnan(x[6]));
}

TEST_CASE("vector math: sigmoid matches double, never overflows, the same bits everywhere", "[vector_math]") {
  std::vector<float> x = arguments();
  for (float v : {-1e30f, 1e30f, -100.0f, 100.0f}) x.push_back(v);
  const std::vector<float> y = same_at_every_level(x, cpu::sigmoid_inplace);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    CHECK(std::isfinite(y[i]));
    if (want < 0x1p-125) continue;  // exp(-|x|) flushed to 0 below the normal range
    worst = atl::testing::worst_of(worst, std::abs(y[i] - want) / want);
  }
  CHECK(worst < 0x1p-21);
  CHECK(y[y.size() - 4] == 0.0f);
  CHECK(y[y.size() - 3] == 1.0f);
  std::vector<double> d{-3.0, 0.0, 3.0};
  cpu::sigmoid_values(d.data(), 3);
  CHECK(d[1] == 0.5);
  CHECK(d[0] + d[2] == Approx(1.0).epsilon(1e-15));
}

TEST_CASE("vector math: tanh is within 2^-22 relative of tanh in double, odd, the same bits everywhere",
          "[vector_math]") {
  std::vector<float> x;
  CounterRng rng(6, "tanh");
  for (std::uint64_t i = 0; i < 20001; ++i) {  // dense around the polynomial's edge, and out to 12
    const double u = rng.uniform(i);
    x.push_back(static_cast<float>(i % 2 ? -1.5 + 3.0 * u : -12.0 + 24.0 * u));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.625f, -0.625f, std::nextafter(0.625f, 0.0f), 1e-30f, 1e-3f, 9.0f, 20.0f, 50.0f, 1e30f, inf, -inf})
    x.push_back(v);
  const std::vector<float> y = same_at_every_level(x, cpu::tanh_inplace);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::tanh(static_cast<double>(x[i]));
    worst = atl::testing::worst_of(worst, std::abs(y[i] - want) / std::abs(want));
    CHECK(cpu::tanh_f32(x[i]) == y[i]);
    CHECK(cpu::tanh_f32(-x[i]) == -y[i]);
  }
  CHECK(worst < 0x1p-22);
  CHECK(y[y.size() - 2] == 1.0f);
  CHECK(y[y.size() - 1] == -1.0f);
  CHECK(std::signbit(cpu::tanh_f32(-0.0f)));
  CHECK(cpu::tanh_f32(0.0f) == 0.0f);
  CHECK(std::isnan(cpu::tanh_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("vector math: bf16 rounding in place and into a copy gives round_to_bf16's bits everywhere",
          "[vector_math]") {
  // Random bit patterns (NaNs, infinities, denormals among them), ties both ways, the largest
  // float (rounds to infinity) and a signalling NaN (comes back quiet).
  std::vector<float> x;
  CounterRng rng(9, "bf16");
  for (std::uint64_t i = 0; i < 4099; ++i) {
    x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng.uniform(i) * 4294967296.0)));
  }
  for (std::uint32_t b : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800001u, 0x00008000u, 0x80000001u}) {
    x.push_back(std::bit_cast<float>(b));
  }
  std::vector<std::uint32_t> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = std::bit_cast<std::uint32_t>(round_to_bf16(x[i]));
  CHECK(bits_of(same_at_every_level(x, cpu::round_to_bf16_values)) == want);
  const std::vector<float> copied = same_at_every_level(x, [&](float* out, std::int64_t n) {
    const std::vector<float> src = x;
    cpu::round_to_bf16_copy(src.data(), out, n);
    CHECK(bits_of(src) == bits_of(x));  // the source is left as it was
  });
  CHECK(bits_of(copied) == want);
  CHECK(want[want.size() - 4] == 0x7f800000u);  // FLT_MAX rounds to infinity
  CHECK(want[want.size() - 3] == 0x7fc00000u);  // the signalling NaN, quieted
}

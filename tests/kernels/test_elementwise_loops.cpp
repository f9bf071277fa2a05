// The elementwise loops of kernels/cpu/elementwise.hpp: at every instruction-set level the bits of
// the one IEEE operation per element written out here, on lengths around the vector widths, in
// place and into a separate output.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/dtype.hpp"
#include "tests/support/isa_levels.hpp"
#include "tests/support/same_bits.hpp"

using namespace atl;

using testing::same_bits;

TEST_CASE("elementwise loops give one IEEE operation's bits per element at every instruction-set level",
          "[elementwise][isa]") {
  for (const std::int64_t n : {0, 1, 7, 16, 17, 33, 1001}) {
    INFO("n " << n);
    std::mt19937 rng(static_cast<unsigned>(n) + 3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = normal(rng), b[i] = normal(rng);
    const float ca = 0.7071f, cb = -1.3f;
    std::vector<float> add = a, scaled = a, sum = a, sum_bf16 = a;
    for (std::size_t i = 0; i < a.size(); ++i) {
      add[i] = a[i] + b[i];
      scaled[i] = ca * a[i];
      const float lhs = ca * a[i], rhs = cb * b[i];  // two roundings, then the add: no FMA
      sum[i] = lhs + rhs;
      sum_bf16[i] = round_to_bf16(sum[i]);
    }
    testing::for_each_isa_level([&] {
      std::vector<float> x = a, y(a.size(), -7.0f);
      cpu::add_values(x.data(), b.data(), n);
      CHECK(same_bits(x, add));
      cpu::scaled_values(a.data(), ca, y.data(), n);
      CHECK(same_bits(y, scaled));
      x = a;  // in place (scale_inplace and the experts use it so)
      cpu::scaled_values(x.data(), ca, x.data(), n);
      CHECK(same_bits(x, scaled));
      cpu::scaled_sum_values(a.data(), ca, b.data(), cb, false, y.data(), n);
      CHECK(same_bits(y, sum));
      x = a;  // in place: the output is input a itself
      cpu::scaled_sum_values(x.data(), ca, b.data(), cb, true, x.data(), n);
      CHECK(same_bits(x, sum_bf16));
    });
  }
}

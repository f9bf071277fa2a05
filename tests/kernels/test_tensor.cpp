#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>

#include "kernels/dtype.hpp"
#include "kernels/rng.hpp"
#include "kernels/tensor.hpp"

using namespace atl;

TEST_CASE("bf16 rounds to nearest, ties to even", "[dtype]") {
  // 1 + 2^-8 lies exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6 (even): rounds up.
  CHECK(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // above halfway: up
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(-2.0f) == 0xc000);
}

TEST_CASE("bf16 keeps NaN, infinity and overflow semantics", "[dtype]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
  CHECK(round_to_bf16(inf) == inf);
  CHECK(round_to_bf16(-inf) == -inf);
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == inf);  // rounds past the largest bf16
  CHECK(round_to_bf16(0x1p-130f) == 0x1p-130f);                     // subnormals survive
}

TEST_CASE("Tensor shares storage on copy and reshape, clones deeply", "[tensor]") {
  Tensor a = Tensor::from_floats({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor b = a.reshape({3, 2});
  b.data<float>()[0] = 9;
  CHECK(a.data<float>()[0] == 9);
  Tensor c = a.clone();
  c.data<float>()[1] = -1;
  CHECK(a.data<float>()[1] == 2);
  Tensor row = a.slice_rows(1, 2);
  CHECK(row.shape() == Shape{1, 3});
  CHECK(row.data<float>()[0] == 4);
  CHECK_THROWS_WITH(a.data<std::int64_t>(), Catch::Contains("f32[2, 3]"));
  CHECK_THROWS(a.reshape({4}));
}

TEST_CASE("Tensor dtype conversion rounds f32 to bf16 and back", "[tensor]") {
  Tensor a = Tensor::from_floats({3}, std::vector<float>{1.0f + 0x1p-8f, 3.14159f, -7.0f});
  Tensor h = a.to(DType::bf16);
  CHECK(h.bytes() == 6);
  Tensor back = h.to(DType::f32);
  // By hand: 1 + 2^-8 ties to even (1), pi keeps 8 bits of mantissa (3.140625), -7 is exact.
  CHECK(back.data<float>()[0] == 1.0f);
  CHECK(back.data<float>()[1] == 3.140625f);
  CHECK(back.data<float>()[2] == -7.0f);
}

TEST_CASE("Tensor conversion to integers truncates, and refuses NaN, infinity and out-of-range values",
          "[tensor]") {
  const Tensor fine = Tensor::from_floats({3}, std::vector<float>{-2.75f, 0.5f, 2147483520.0f}).to(DType::i32);
  CHECK(fine.data<std::int32_t>()[0] == -2);
  CHECK(fine.data<std::int32_t>()[1] == 0);
  CHECK(fine.data<std::int32_t>()[2] == 2147483520);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 2147483648.0f,
                    -2147483904.0f}) {
    INFO(bad);
    CHECK_THROWS_WITH(Tensor::from_floats({2}, std::vector<float>{1.0f, bad}).to(DType::i32),
                      Catch::Contains("element 1") && Catch::Contains("has no 32-bit integer value"));
  }
  CHECK(Tensor::from_floats({1}, std::vector<float>{-9.2233720e18f}).to(DType::i64).data<std::int64_t>()[0] ==
        static_cast<std::int64_t>(-9.2233720e18f));
  CHECK_THROWS_WITH(Tensor::from_floats({1}, std::vector<float>{9.2233720e18f}).to(DType::i64),
                    Catch::Contains("element 0") && Catch::Contains("has no 64-bit integer value"));
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  PhiloxBlock zero = philox4x32({0, 0, 0, 0}, {0, 0});
  CHECK(zero == PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  PhiloxBlock ones = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  CHECK(ones == PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
}

TEST_CASE("Counter RNG depends only on seed, name and index", "[rng]") {
  CounterRng a(7, "layers.0.w"), b(7, "layers.0.w"), c(8, "layers.0.w"), d(7, "layers.1.w");
  CHECK(a.normal(123) == b.normal(123));
  CHECK(a.normal(123) != c.normal(123));
  CHECK(a.normal(123) != d.normal(123));
  // Mean and variance of the normal stream over 20000 draws.
  double sum = 0, sum_sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double x = a.normal(static_cast<std::uint64_t>(i));
    sum += x;
    sum_sq += x * x;
  }
  CHECK(std::abs(sum / n) < 0.03);
  CHECK(std::abs(sum_sq / n - 1.0) < 0.05);
}

TEST_CASE("Tensor refuses a shape whose element or byte count would wrap around int64", "[tensor]") {
  // (A wrapped count is a small buffer that its indexing treats as a huge one.)
  CHECK_THROWS_WITH(Tensor::empty({std::int64_t{1} << 62, 4}),
                    Catch::Contains("more elements than an int64 counts"));
  CHECK_THROWS_WITH(Tensor::empty({std::int64_t{1} << 62}), Catch::Contains("holds more bytes than an int64 counts"));
  CHECK(shape_numel({std::int64_t{1} << 31, std::int64_t{1} << 31}) == std::int64_t{1} << 62);
}

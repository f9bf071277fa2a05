// atoll's GEMM (kernels/cpu/gemm.hpp): the documented FMA order checked against scalar reference
// chains, agreement with double, batch invariance (a row alone = the same row inside any batch),
// thread-count invariance, and the same bits from every instruction-set level.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/dtype.hpp"

using namespace atl;
using namespace atl::cpu;

namespace {

struct Case {
  bool ta = false, tb = false, accumulate = false;
  std::int64_t m = 1, n = 1, k = 1;
  std::vector<float> a, b, c0;  // c0: C before the call (used when accumulating)
};

float element(const std::vector<float>& v, bool trans, std::int64_t rows, std::int64_t cols, std::int64_t r,
              std::int64_t c) {
  return trans ? v[c * rows + r] : v[r * cols + c];  // stored transposed: [cols][rows]
}
float a_at(const Case& t, std::int64_t i, std::int64_t k) { return element(t.a, t.ta, t.m, t.k, i, k); }
float b_at(const Case& t, std::int64_t k, std::int64_t j) { return element(t.b, t.tb, t.k, t.n, k, j); }

Case random_case(std::mt19937& rng, std::int64_t max_m, std::int64_t max_n, std::int64_t max_k) {
  Case t;
  t.ta = rng() & 1;
  t.tb = rng() & 1;
  t.accumulate = (rng() % 3) == 0;
  t.m = 1 + static_cast<std::int64_t>(rng() % max_m);
  t.n = 1 + static_cast<std::int64_t>(rng() % max_n);
  t.k = 1 + static_cast<std::int64_t>(rng() % max_k);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  t.a.resize(static_cast<std::size_t>(t.m * t.k));
  t.b.resize(static_cast<std::size_t>(t.k * t.n));
  t.c0.resize(static_cast<std::size_t>(t.m * t.n));
  for (auto& v : t.a) v = normal(rng);
  for (auto& v : t.b) v = normal(rng);
  for (auto& v : t.c0) v = normal(rng);
  return t;
}

std::vector<float> run(const Case& t, GemmOperands operands, std::int64_t row_begin = 0, std::int64_t rows = -1) {
  if (rows < 0) rows = t.m;
  // Rows [row_begin, row_begin + rows) of A, as their own matrix in the same storage order.
  std::vector<float> a(static_cast<std::size_t>(rows * t.k));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < t.k; ++k) (t.ta ? a[k * rows + i] : a[i * t.k + k]) = a_at(t, row_begin + i, k);
  std::vector<float> c(t.c0.begin() + row_begin * t.n, t.c0.begin() + (row_begin + rows) * t.n);
  const GemmShape s{t.ta, t.tb, rows, t.n, t.k, t.ta ? rows : t.k, t.tb ? t.k : t.n, t.n, t.accumulate};
  gemm_f32(s, a.data(), t.b.data(), c.data(), operands);
  return c;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The contract of gemm.hpp, one scalar FMA at a time.
float reference_chain(const Case& t, std::int64_t i, std::int64_t j, GemmOperands operands) {
  float c = t.accumulate ? t.c0[i * t.n + j] : 0.0f;
  if (operands == GemmOperands::f32) {
    for (std::int64_t k = 0; k < t.k; ++k) c = std::fma(a_at(t, i, k), b_at(t, k, j), c);
    return c;
  }
  auto a = [&](std::int64_t k) { return k < t.k ? round_to_bf16(a_at(t, i, k)) : 0.0f; };
  auto b = [&](std::int64_t k) { return k < t.k ? round_to_bf16(b_at(t, k, j)) : 0.0f; };
  for (std::int64_t k = 0; k < t.k; k += 2) {
    c = std::fma(a(k + 1), b(k + 1), c);
    c = std::fma(a(k), b(k), c);
  }
  return c;
}

const GemmOperands kBoth[] = {GemmOperands::f32, GemmOperands::bf16};

}  // namespace

TEST_CASE("gemm computes exactly the documented FMA chain per element", "[gemm]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const Case t = random_case(rng, 40, 70, 600);  // k past one 256 block, odd and even
    for (GemmOperands op : kBoth) {
      const std::vector<float> c = run(t, op);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < t.m; ++i)
        for (std::int64_t j = 0; j < t.n; ++j) {
          const float want = reference_chain(t, i, j, op);
          if (std::memcmp(&want, &c[i * t.n + j], sizeof(float)) != 0) ++wrong;
        }
      INFO("m=" << t.m << " n=" << t.n << " k=" << t.k << " ta=" << t.ta << " tb=" << t.tb
                << " acc=" << t.accumulate << " bf16=" << (op == GemmOperands::bf16));
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("gemm agrees with a double-precision product within a K-derived bound", "[gemm]") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 30; ++trial) {
    const Case t = random_case(rng, 120, 90, 700);
    for (GemmOperands op : kBoth) {
      const std::vector<float> c = run(t, op);
      double worst = 0;
      for (std::int64_t i = 0; i < t.m; ++i)
        for (std::int64_t j = 0; j < t.n; ++j) {
          double exact = t.accumulate ? t.c0[i * t.n + j] : 0.0, magnitude = std::fabs(exact);
          for (std::int64_t k = 0; k < t.k; ++k) {
            double x = a_at(t, i, k), y = b_at(t, k, j);
            if (op == GemmOperands::bf16) x = round_to_bf16(static_cast<float>(x)), y = round_to_bf16(static_cast<float>(y));
            exact += x * y;
            magnitude += std::fabs(x * y);
          }
          // A chain of K fp32 FMAs: |error| <= K * 2^-24 * sum |terms| (first order).
          worst = std::max(worst, std::fabs(c[i * t.n + j] - exact) / (magnitude * (t.k + 1) * 0x1p-24));
        }
      INFO("m=" << t.m << " n=" << t.n << " k=" << t.k);
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("gemm rows are bitwise independent of the batch they are computed in, for 1..4 threads", "[gemm]") {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 12; ++trial) {
    const Case t = random_case(rng, 300, 100, 300);
    for (GemmOperands op : kBoth) {
      const std::vector<float> whole = run(t, op);
      for (int threads = 1; threads <= 4; ++threads) {
        ComputePool pool(threads);
        ComputePoolScope scope(&pool);
        CHECK(same_bits(run(t, op), whole));
        const std::int64_t probes[] = {0, t.m / 2, t.m - 1};
        for (std::int64_t row : probes) {
          const std::vector<float> alone = run(t, op, row, 1);
          CHECK(same_bits(alone, std::vector<float>(whole.begin() + row * t.n, whole.begin() + (row + 1) * t.n)));
        }
        const std::int64_t mid = t.m / 3, count = t.m - mid;  // a block starting off any tile boundary
        CHECK(same_bits(run(t, op, mid, count),
                        std::vector<float>(whole.begin() + mid * t.n, whole.begin() + t.m * t.n)));
      }
    }
  }
}

TEST_CASE("every instruction-set level gives the same bits", "[gemm][isa]") {
  const CpuFeatures best = detected_cpu_features();
  const CpuFeatures saved = cpu_features();
  std::vector<CpuFeatures> levels{{Isa::portable, false}};
  if (best.isa >= Isa::avx2) levels.push_back({Isa::avx2, false});
  if (best.isa >= Isa::avx512) levels.push_back({Isa::avx512, false});
  if (best.bf16_dot) levels.push_back({Isa::avx512, true});
  std::mt19937 rng(14);
  for (int trial = 0; trial < 10; ++trial) {
    const Case t = random_case(rng, 80, 80, 400);
    for (GemmOperands op : kBoth) {
      std::vector<std::vector<float>> results;
      for (const CpuFeatures& f : levels) {
        use_cpu_features(f);
        results.push_back(run(t, op));
      }
      use_cpu_features(saved);
      for (std::size_t l = 1; l < results.size(); ++l) {
        INFO("level " << kernel_description(levels[l]) << " vs portable, bf16=" << (op == GemmOperands::bf16));
        CHECK(same_bits(results[l], results[0]));
      }
    }
  }
  WARN("levels compared on this CPU: " << levels.size() << " (best: " << kernel_description(best) << ")");
}

TEST_CASE("gemm handles empty and degenerate shapes", "[gemm]") {
  std::vector<float> a{1, 2}, b{3, 4}, c{5};
  gemm_f32({false, false, 1, 1, 0, 1, 1, 1, false}, a.data(), b.data(), c.data());
  CHECK(c[0] == 0.0f);  // K = 0 overwrites with the empty sum
  c[0] = 5;
  gemm_f32({false, false, 1, 1, 0, 1, 1, 1, true}, a.data(), b.data(), c.data());
  CHECK(c[0] == 5.0f);  // ... and leaves C alone when accumulating
  gemm_f32({false, false, 1, 1, 2, 2, 1, 1, false}, a.data(), b.data(), c.data());
  CHECK(c[0] == 11.0f);
  CHECK_THROWS_WITH(gemm_f32({false, false, 2, 2, 2, 1, 2, 2, false}, a.data(), b.data(), c.data()),
                    Catch::Contains("lda=1"));
}

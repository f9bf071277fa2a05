// atoll's GEMM (kernels/cpu/gemm.hpp): the documented FMA order checked against scalar reference
// chains, agreement with double, batch invariance (a row alone = the same row inside any batch),
// thread-count invariance, and the same bits from every instruction-set level.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>

#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/dtype.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;
using namespace atl::cpu;
using atl::testing::same_bits;

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

struct Sizes {
  std::int64_t min_m, max_m, min_n, max_n, min_k, max_k;
};

Case random_case(std::mt19937& rng, const Sizes& z) {
  auto draw = [&](std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(rng() % (hi - lo + 1)); };
  Case t;
  t.ta = rng() & 1;
  t.tb = rng() & 1;
  t.accumulate = (rng() % 3) == 0;
  t.m = draw(z.min_m, z.max_m);
  t.n = draw(z.min_n, z.max_n);
  t.k = draw(z.min_k, z.max_k);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  t.a.resize(static_cast<std::size_t>(t.m * t.k));
  t.b.resize(static_cast<std::size_t>(t.k * t.n));
  t.c0.resize(static_cast<std::size_t>(t.m * t.n));
  for (auto& v : t.a) v = normal(rng);
  for (auto& v : t.b) v = normal(rng);
  for (auto& v : t.c0) v = normal(rng);
  return t;
}

std::vector<float> run(const Case& t, GemmOperands operands, std::int64_t row_begin = 0, std::int64_t rows = -1,
                       bool round_bf16 = false) {
  if (rows < 0) rows = t.m;
  // Rows [row_begin, row_begin + rows) of A, as their own matrix in the same storage order.
  std::vector<float> a(static_cast<std::size_t>(rows * t.k));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < t.k; ++k) (t.ta ? a[k * rows + i] : a[i * t.k + k]) = a_at(t, row_begin + i, k);
  std::vector<float> c(t.c0.begin() + row_begin * t.n, t.c0.begin() + (row_begin + rows) * t.n);
  const GemmShape s{t.ta, t.tb, rows, t.n, t.k, t.ta ? rows : t.k, t.tb ? t.k : t.n, t.n, t.accumulate, round_bf16};
  gemm_f32(s, a.data(), t.b.data(), c.data(), operands);
  return c;
}

// vdpbf16ps's denormal rule: a value below FLT_MIN in magnitude counts as a zero of its sign.
float flushed(float v) { return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.0f, v) : v; }

// The contract of gemm.hpp, one scalar FMA at a time (`flush`: bf16's denormal rule; false only to
// show that a test meets denormals).
float reference_chain(const Case& t, std::int64_t i, std::int64_t j, GemmOperands operands, bool flush = true) {
  float c = t.accumulate ? t.c0[i * t.n + j] : 0.0f;
  if (operands == GemmOperands::f32) {
    for (std::int64_t k = 0; k < t.k; ++k) c = std::fma(a_at(t, i, k), b_at(t, k, j), c);
    return c;
  }
  auto f = [&](float v) { return flush ? flushed(v) : v; };
  auto a = [&](std::int64_t k) { return k < t.k ? f(round_to_bf16(a_at(t, i, k))) : 0.0f; };
  auto b = [&](std::int64_t k) { return k < t.k ? f(round_to_bf16(b_at(t, k, j))) : 0.0f; };
  for (std::int64_t k = 0; k < t.k; k += 2) {
    c = f(std::fma(a(k + 1), b(k + 1), f(c)));
    c = f(std::fma(a(k), b(k), c));
  }
  return c;
}

// The levels of instruction set this CPU runs: portable first.
std::vector<CpuFeatures> cpu_levels() {
  const CpuFeatures best = detected_cpu_features();
  std::vector<CpuFeatures> levels{{Isa::portable, false}};
  if (best.isa >= Isa::avx2) levels.push_back({Isa::avx2, false});
  if (best.isa >= Isa::avx512) levels.push_back({Isa::avx512, false});
  if (best.bf16_dot) levels.push_back({Isa::avx512, true});
  return levels;
}

// `trials` random cases (seeded), each run with fp32 and with bf16 operands.
void for_each_case(unsigned seed, int trials, const Sizes& sizes,
                   const std::function<void(const Case&, GemmOperands)>& check) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const Case t = random_case(rng, sizes);
    for (GemmOperands op : {GemmOperands::f32, GemmOperands::bf16}) {
      INFO("m=" << t.m << " n=" << t.n << " k=" << t.k << " ta=" << t.ta << " tb=" << t.tb
                << " acc=" << t.accumulate << " bf16=" << (op == GemmOperands::bf16));
      check(t, op);
    }
  }
}

// The worst error of C against the product in double (of the bf16-rounded operands for bf16), in
// units of a chain of K fp32 FMAs' bound: |error| <= K * 2^-24 * sum |terms| (first order).
double worst_against_double(const Case& t, GemmOperands op, const std::vector<float>& c) {
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
      worst = atl::testing::worst_of(worst, std::fabs(c[i * t.n + j] - exact) / (magnitude * (t.k + 1) * 0x1p-24));
    }
  return worst;
}

// Rows alone (first, middle, last) and a block starting off any tile boundary equal the same rows
// of the whole product, bitwise.
void check_rows_independent_of_batch(const Case& t, GemmOperands op) {
    const std::vector<float> whole = run(t, op);
    auto rows_of_whole = [&](std::int64_t begin, std::int64_t end) {
      return std::vector<float>(whole.begin() + begin * t.n, whole.begin() + end * t.n);
    };
    for (std::int64_t row : {std::int64_t{0}, t.m / 2, t.m - 1}) CHECK(same_bits(run(t, op, row, 1), rows_of_whole(row, row + 1)));
  const std::int64_t mid = t.m / 3;
  CHECK(same_bits(run(t, op, mid, t.m - mid), rows_of_whole(mid, t.m)));
}

// The same bits on compute pools of 2..4 threads as on one; the case must be big enough to split.
void check_independent_of_threads(const Case& t, GemmOperands op) {
  REQUIRE(t.m * t.n * t.k >= 2 * kGemmMinParallelWork);
  const std::vector<float> serial = run(t, op);
  for (int threads = 2; threads <= 4; ++threads) {
    ComputePool pool(threads);
    ComputePoolScope scope(&pool);
    INFO("threads=" << threads);
    CHECK(same_bits(run(t, op), serial));
    CHECK(pool.shared_runs() > 0);  // the GEMM split its output into parts offered to the workers
  }
}

}  // namespace

TEST_CASE("gemm computes exactly the documented FMA chain per element", "[gemm]") {
  // k past one K block (256 fp32, 512 bf16), odd and even; then n past one column block (512)
  // and m past one row block (96): A packed once for all its rows (up to 2048) and every column
  // block, over one K block and several; and m past 2048, where A is packed per column block.
  const auto exact = [](const Case& t, GemmOperands op) {
    const std::vector<float> c = run(t, op);
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < t.m; ++i)
      for (std::int64_t j = 0; j < t.n; ++j) {
        const float want = reference_chain(t, i, j, op);
        if (std::memcmp(&want, &c[i * t.n + j], sizeof(float)) != 0) ++wrong;
      }
    CHECK(wrong == 0);
  };
  for_each_case(11, 40, {1, 40, 1, 70, 1, 600}, exact);
  for_each_case(16, 4, {97, 200, 513, 700, 1, 256}, exact);
  for_each_case(17, 2, {97, 150, 513, 600, 520, 700}, exact);
  for_each_case(18, 1, {2049, 2100, 513, 530, 1, 40}, exact);
}

TEST_CASE("gemm with leading dimensions past its matrices reads and writes only their elements", "[gemm]") {
  // Attention and the experts call the GEMM on strided views. The padding of A and B holds NaN
  // (read, it would reach a result); C's padding and one element past C's end hold a marker that
  // must stay.
  std::mt19937 pads(5);
  const float marker = -12345.5f;
  for_each_case(19, 40, {1, 40, 1, 70, 1, 300}, [&](const Case& t, GemmOperands op) {
    const std::int64_t a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
    const std::int64_t b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
    const std::int64_t lda = a_cols + 1 + static_cast<std::int64_t>(pads() % 9);
    const std::int64_t ldb = b_cols + 1 + static_cast<std::int64_t>(pads() % 9);
    const std::int64_t ldc = t.n + 1 + static_cast<std::int64_t>(pads() % 9);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> a(static_cast<std::size_t>(a_rows * lda), nan), b(static_cast<std::size_t>(b_rows * ldb), nan);
    std::vector<float> c(static_cast<std::size_t>(t.m * ldc + 1), marker);
    for (std::int64_t r = 0; r < a_rows; ++r) std::copy_n(&t.a[r * a_cols], a_cols, &a[r * lda]);
    for (std::int64_t r = 0; r < b_rows; ++r) std::copy_n(&t.b[r * b_cols], b_cols, &b[r * ldb]);
    for (std::int64_t i = 0; i < t.m; ++i) std::copy_n(&t.c0[i * t.n], t.n, &c[i * ldc]);
    gemm_f32(GemmShape{t.ta, t.tb, t.m, t.n, t.k, lda, ldb, ldc, t.accumulate}, a.data(), b.data(), c.data(), op);
    std::int64_t wrong = 0, touched = 0;
    for (std::int64_t i = 0; i < t.m; ++i) {
      for (std::int64_t j = 0; j < ldc; ++j) {
        const float got = c[i * ldc + j];
        if (j >= t.n) {
          touched += got != marker;
          continue;
        }
        const float want = reference_chain(t, i, j, op);
        wrong += std::memcmp(&want, &got, sizeof(float)) != 0;
      }
    }
    touched += c.back() != marker;
    CHECK(wrong == 0);
    CHECK(touched == 0);
  });
}

TEST_CASE("gemm agrees with a double-precision product within a K-derived bound", "[gemm]") {
  for_each_case(12, 30, {1, 120, 1, 90, 1, 700},
                [](const Case& t, GemmOperands op) { CHECK(worst_against_double(t, op, run(t, op)) <= 1.0); });
}

TEST_CASE("gemm rows are bitwise independent of the batch they are computed in", "[gemm]") {
  for_each_case(13, 12, {1, 300, 1, 100, 1, 300}, check_rows_independent_of_batch);
}

TEST_CASE("gemm results are bitwise independent of the thread count (1..4)", "[gemm][threads]") {
  // Every case is big enough that two threads split it (kGemmMinParallelWork per part): few rows
  // split C by columns, many rows by rows (the cut-over depends on the kernel's tile height).
  const Sizes few_rows{76, 95, 560, 600, 400, 420}, many_rows{256, 600, 256, 600, 256, 400};
  for (const Sizes& sizes : {few_rows, many_rows}) {
    for_each_case(15, 4, sizes, check_independent_of_threads);
  }
}

TEST_CASE("every instruction-set level gives the same bits", "[gemm][isa]") {
  const CpuFeatures best = detected_cpu_features();
  const CpuFeatures saved = cpu_features();
  const std::vector<CpuFeatures> levels = cpu_levels();
  for_each_case(14, 10, {1, 80, 1, 80, 1, 400}, [&](const Case& t, GemmOperands op) {
    std::vector<std::vector<float>> results;
    for (const CpuFeatures& f : levels) {
      use_cpu_features(f);
      results.push_back(run(t, op));
    }
    use_cpu_features(saved);
    for (std::size_t l = 1; l < results.size(); ++l) {
      INFO("level " << kernel_description(levels[l]) << " vs portable");
      CHECK(same_bits(results[l], results[0]));
    }
  });
  WARN("levels compared on this CPU: " << levels.size() << " (best: " << kernel_description(best) << ")");
}

#if defined(__x86_64__)  // the emulated route's rule is MXCSR's DAZ and FTZ
TEST_CASE("bf16 operands: denormal inputs and results count as zero at every level, and fp32 keeps them",
          "[gemm][isa][threads]") {
  // Powers of two (bf16-exact) whose products and sums near FLT_MIN are exact: 2^-130 is denormal
  // (as an input: zero in bf16), 2^-70 * 2^-60 = 2^-130 a denormal product (a zero result in bf16),
  // 2^-64 * 2^-62 = FLT_MIN; 1 and -1 keep most elements normal.
  const float values[] = {0.0f, 1.0f, -1.0f, std::ldexp(1.0f, -130), -std::ldexp(1.0f, -129), std::ldexp(1.0f, -70),
                          std::ldexp(1.0f, -60), std::ldexp(1.0f, -64), -std::ldexp(1.0f, -62)};
  std::mt19937 rng(21);
  auto pick = [&] { return values[rng() % std::size(values)]; };
  const CpuFeatures saved = cpu_features();
  const unsigned csr = _mm_getcsr();
  // Small cases (edges, accumulation, transposes) on this thread; one split over pool threads.
  struct Shape {
    std::int64_t m, n, k;
    int threads;
  };
  std::vector<Shape> shapes;
  for (int trial = 0; trial < 6; ++trial) shapes.push_back({13, 37, 5 + trial, 1});
  shapes.push_back({256, 256, 256, 3});
  for (std::size_t trial = 0; trial < shapes.size(); ++trial) {
    const Shape& z = shapes[trial];
    Case t;
    t.ta = trial & 1;
    t.tb = (trial >> 1) & 1;
    t.accumulate = trial % 3 != 0;
    t.m = z.m;
    t.n = z.n;
    t.k = z.k;
    for (auto* v : {&t.a, &t.b, &t.c0}) v->clear();
    for (std::int64_t x = 0; x < t.m * t.k; ++x) t.a.push_back(pick());
    for (std::int64_t x = 0; x < t.k * t.n; ++x) t.b.push_back(pick());
    for (std::int64_t x = 0; x < t.m * t.n; ++x) t.c0.push_back(pick());
    if (z.threads > 1) REQUIRE(t.m * t.n * t.k >= 2 * kGemmMinParallelWork);
    ComputePool pool(z.threads);
    ComputePoolScope scope(z.threads > 1 ? &pool : nullptr);
    // The scalar chains, once per case: bf16 with the rule, without it, and fp32.
    std::vector<float> want_bf16, want_fp32;
    std::int64_t flush_matters = 0, fp32_denormals = 0;
    for (std::int64_t i = 0; i < t.m; ++i)
      for (std::int64_t j = 0; j < t.n; ++j) {
        want_bf16.push_back(reference_chain(t, i, j, GemmOperands::bf16));
        want_fp32.push_back(reference_chain(t, i, j, GemmOperands::f32));
        const float unflushed = reference_chain(t, i, j, GemmOperands::bf16, false);
        if (std::memcmp(&want_bf16.back(), &unflushed, sizeof(float)) != 0) ++flush_matters;
        const float plain = want_fp32.back();
        if (plain != 0.0f && std::fabs(plain) < std::numeric_limits<float>::min()) ++fp32_denormals;
      }
    CHECK(flush_matters > 0);   // the case meets the rule
    CHECK(fp32_denormals > 0);  // and fp32 keeps what bf16 flushes
    for (const CpuFeatures& f : cpu_levels()) {
      use_cpu_features(f);
      INFO("level " << kernel_description(f) << " m=" << t.m << " n=" << t.n << " k=" << t.k << " threads=" << z.threads);
      CHECK(same_bits(run(t, GemmOperands::bf16), want_bf16));
      CHECK(same_bits(run(t, GemmOperands::f32), want_fp32));
    }
    use_cpu_features(saved);
    CHECK((pool.shared_runs() > 0) == (z.threads > 1));  // split into parts offered to the workers
  }
  constexpr unsigned kControl = ~0x3Fu;  // not the sticky exception flags, which any arithmetic sets
  CHECK((_mm_getcsr() & kControl) == (csr & kControl));  // the rule does not leak into the caller's thread
}
#endif

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

// The packing helpers of every level this CPU runs: portable first (the reference the others
// must equal), then AVX2 and AVX-512 where present.
std::vector<cpu::gemm_detail::PackKernels> pack_levels() {
  using namespace cpu::gemm_detail;
  std::vector<PackKernels> levels = {pack_kernels_portable()};
#if defined(__x86_64__)
  const cpu::Isa isa = cpu::detected_cpu_features().isa;
  if (isa >= cpu::Isa::avx2) levels.push_back(pack_kernels_avx2());
  if (isa == cpu::Isa::avx512) levels.push_back(pack_kernels_avx512());
#endif
  return levels;
}

// A 64 x 64 source with NaNs, infinities, rounding ties (a denormal's too) and values that round up.
std::vector<float> pack_source(float scale, int period) {
  std::vector<float> src(64 * 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = scale * static_cast<float>(static_cast<int>(i) % period) - 7.0f;
  src[5] = std::bit_cast<float>(0x7f800123u);   // signalling NaN: quieted, not rounded
  src[66] = std::bit_cast<float>(0xff800000u);  // -inf
  src[131] = std::bit_cast<float>(0x3f808000u); // a tie: rounds to even (down)
  src[196] = std::bit_cast<float>(0x3f818000u); // a tie: rounds to even (up)
  src[261] = std::bit_cast<float>(0x7f7fffffu); // FLT_MAX rounds to +inf
  src[326] = std::bit_cast<float>(0xffc12345u); // a negative quiet NaN with a payload: its high half
  src[391] = std::bit_cast<float>(0x00018000u); // a denormal tie: rounds to even (up), bits only
  return src;
}

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// The 16 guard words past a panel are all untouched.
template <class T>
bool guards_intact(const std::vector<T>& v, T guard) {
  return std::all_of(v.end() - 16, v.end(), [&](T x) { return x == guard; });
}

// bf16_pairs and swapped_rows pack a whole block of lines into consecutive panels in one call:
// each panel equals the panel packed alone from its own lines, the last one zero-padded, nothing
// written past it; with a deeper panel pitch, the same panels spaced out.
TEST_CASE("gemm packing: bf16 pairs of many panels equal the panels packed one by one", "[gemm]") {
  using namespace cpu::gemm_detail;
  const std::vector<float> src = pack_source(0.37f, 89);
  for (const PackKernels& pk : pack_levels()) {
    for (const std::int64_t width : {6, 12, 16, 32}) {
      for (const std::int64_t count : {13, 29, 64}) {
        for (const std::int64_t kc : {1, 7, 10, 27}) {
          INFO("width " << width << " count " << count << " kc " << kc);
          const std::int64_t pairs = (kc + 1) / 2, panels = (count + width - 1) / width;
          std::vector<std::uint32_t> all(static_cast<std::size_t>(panels * pairs * width + 16), 0xdeadbeefu);
          std::vector<float> swapped(static_cast<std::size_t>(panels * 2 * pairs * width + 16), -1.0f);
          pk.bf16_pairs(src.data(), 64, kc, count, all.data(), width, pairs);
          pk.swapped_rows(src.data(), 64, kc, count, swapped.data(), width);
          // With a deeper panel pitch (AMX's whole chunks) the same panels land further apart and
          // the rows between them are left alone.
          const std::int64_t pitch = pairs + 3;
          std::vector<std::uint32_t> spaced(static_cast<std::size_t>(panels * pitch * width), 0xdeadbeefu);
          pk.bf16_pairs(src.data(), 64, kc, count, spaced.data(), width, pitch);
          for (std::int64_t p = 0; p < panels; ++p) {
            const auto at = spaced.begin() + p * pitch * width;
            CHECK(std::equal(at, at + pairs * width, all.begin() + p * pairs * width));
            CHECK(std::all_of(at + pairs * width, at + pitch * width, [](std::uint32_t x) { return x == 0xdeadbeefu; }));
          }
          CHECK(guards_intact(all, 0xdeadbeefu));
          CHECK(guards_intact(swapped, -1.0f));
          for (std::int64_t p = 0; p < panels; ++p) {
            const std::int64_t lines = std::min(width, count - p * width);
            std::vector<std::uint32_t> one(static_cast<std::size_t>(pairs * width + 16), 0xdeadbeefu);
            std::vector<float> one_swapped(static_cast<std::size_t>(2 * pairs * width + 16), -1.0f);
            pk.bf16_pairs(src.data() + p * width, 64, kc, lines, one.data(), width, pairs);
            pk.swapped_rows(src.data() + p * width, 64, kc, lines, one_swapped.data(), width);
            CHECK(guards_intact(one, 0xdeadbeefu));
            CHECK(guards_intact(one_swapped, -1.0f));
            CHECK(std::equal(one.begin(), one.end() - 16, all.begin() + p * pairs * width));
            CHECK(std::equal(one_swapped.begin(), one_swapped.end() - 16, swapped.begin() + p * 2 * pairs * width,
                             [](float x, float y) { return bits_of(x) == bits_of(y); }));
          }
        }
      }
    }
  }
}

// The packing helpers fill exactly the panel: each value is the documented one (rounded to bf16
// where the route rounds), lines past `lines` are zero (never read from past the source), and every
// level's helpers agree with the portable ones bit for bit.
namespace {

// n floats that end where an unreadable page begins: a read past the last one faults.
class GuardedFloats {
 public:
  explicit GuardedFloats(std::size_t n) {
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = (n * sizeof(float) + page_ - 1) / page_ * page_;
    base_ = mmap(nullptr, bytes_ + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base_ != MAP_FAILED);
    REQUIRE(mprotect(static_cast<char*>(base_) + bytes_, page_, PROT_NONE) == 0);
    data_ = reinterpret_cast<float*>(static_cast<char*>(base_) + bytes_) - n;
  }
  ~GuardedFloats() { munmap(base_, bytes_ + page_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() { return data_; }

 private:
  std::size_t page_ = 0, bytes_ = 0;
  void* base_ = nullptr;
  float* data_ = nullptr;
};

}  // namespace

// Loads may be wider than a panel (a whole vector where the rows go on), never wider than the
// source: every packer reads a source that ends at an unreadable page, lines and k tight (a read
// past the last line or k faults), and packs what it packs from an ordinary copy.
TEST_CASE("gemm packing reads nothing past its source's last line or k", "[gemm]") {
  using namespace cpu::gemm_detail;
  const std::vector<float> values = pack_source(0.5f, 89);
  for (const PackKernels& pk : pack_levels()) {
    for (const std::int64_t width : {6, 12, 16, 32}) {
      for (const std::int64_t lines : {1, 5, 7, 13, 29}) {
        for (const std::int64_t kc : {1, 6, 9, 27}) {
          INFO("width " << width << " lines " << lines << " kc " << kc);
          const auto n = static_cast<std::size_t>(lines * kc);
          GuardedFloats guarded(n);
          std::copy_n(values.begin(), n, guarded.data());
          const std::vector<float> copy(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n));
          const std::int64_t pairs = (kc + 1) / 2, panels = (lines + width - 1) / width;
          const auto panel_floats = static_cast<std::size_t>(panels * 2 * pairs * width);
          const auto pair_words = static_cast<std::size_t>(panels * pairs * width);
          // Lines contiguous (line l, k at src[k * lines + l]): the packers that read rows.
          std::vector<float> rows_g(panel_floats), rows_c(panel_floats);
          pk.swapped_rows(guarded.data(), lines, kc, lines, rows_g.data(), width);
          pk.swapped_rows(copy.data(), lines, kc, lines, rows_c.data(), width);
          CHECK(std::memcmp(rows_g.data(), rows_c.data(), panel_floats * sizeof(float)) == 0);
          std::vector<std::uint32_t> pairs_g(pair_words), pairs_c(pair_words);
          pk.bf16_pairs(guarded.data(), lines, kc, lines, pairs_g.data(), width, (kc + 1) / 2);
          pk.bf16_pairs(copy.data(), lines, kc, lines, pairs_c.data(), width, (kc + 1) / 2);
          CHECK(pairs_g == pairs_c);
          // k contiguous (line l, k at src[l * kc + k]), one panel of at most `width` lines.
          if (lines > width) continue;
          std::vector<float> lines_g(static_cast<std::size_t>(2 * pairs * width)), lines_c = lines_g;
          pk.swapped_lines(guarded.data(), kc, lines, kc, lines_g.data(), width);
          pk.swapped_lines(copy.data(), kc, lines, kc, lines_c.data(), width);
          CHECK(std::memcmp(lines_g.data(), lines_c.data(), lines_g.size() * sizeof(float)) == 0);
          std::vector<std::uint32_t> t_g(static_cast<std::size_t>(kc * width)), t_c = t_g;
          pk.transpose(reinterpret_cast<const std::uint32_t*>(guarded.data()), kc, lines, kc, t_g.data(), width);
          pk.transpose(reinterpret_cast<const std::uint32_t*>(copy.data()), kc, lines, kc, t_c.data(), width);
          CHECK(t_g == t_c);
          std::vector<std::uint32_t> pl_g(static_cast<std::size_t>(pairs * width)), pl_c = pl_g;
          pk.pair_lines(guarded.data(), kc, lines, kc, pl_g.data(), width);
          pk.pair_lines(copy.data(), kc, lines, kc, pl_c.data(), width);
          CHECK(pl_g == pl_c);
        }
      }
    }
  }
}

TEST_CASE("gemm packing: panels are zero past the real lines and equal at every level", "[gemm]") {
  using namespace cpu::gemm_detail;
  const std::vector<float> src = pack_source(0.25f, 97);
  const std::vector<PackKernels> levels = pack_levels();
  auto rounded = [](float x) { return bits_of(round_to_bf16(x)); };
  for (const std::int64_t width : {6, 12, 16, 32}) {
    for (const std::int64_t lines : {1, 5, 12}) {
      if (lines > width) continue;
      for (const std::int64_t kc : {1, 6, 9, 27}) {
        INFO("width " << width << " lines " << lines << " kc " << kc);
        const std::int64_t pairs = (kc + 1) / 2;
        std::vector<std::vector<std::uint32_t>> pairs_from_columns, pairs_from_rows, transposed;
        std::vector<std::vector<float>> swapped_from_columns, swapped_from_rows;
        for (const PackKernels& pk : levels) {
          // Guard words after the panel catch stores past its end.
          std::vector<std::uint32_t> a(static_cast<std::size_t>(pairs * width + 16), 0xdeadbeefu);
          std::vector<std::uint32_t> b = a, t(static_cast<std::size_t>(kc * width + 16), 0xdeadbeefu);
          std::vector<float> sr(static_cast<std::size_t>(2 * pairs * width + 16), -1.0f), sl = sr;
          pk.bf16_pairs(src.data(), 64, kc, lines, a.data(), width, (kc + 1) / 2);  // lines contiguous
          pk.pair_lines(src.data(), 64, lines, kc, b.data(), width);      // k contiguous
          pk.transpose(reinterpret_cast<const std::uint32_t*>(src.data()), 64, lines, kc, t.data(), width);
          pk.swapped_rows(src.data(), 64, kc, lines, sr.data(), width);   // lines contiguous
          pk.swapped_lines(src.data(), 64, lines, kc, sl.data(), width);  // k contiguous
          // Line l, k: x(k * 64 + l) when lines are contiguous, x(l * 64 + k) when k is.
          const auto x = [&](std::int64_t i) { return src[static_cast<std::size_t>(i)]; };
          const auto bf16 = [&](std::int64_t i) { return std::uint32_t{float_to_bf16_bits(x(i))}; };
          for (std::int64_t l = 0; l < width; ++l) {
            const bool real = l < lines;
            for (std::int64_t k = 0; k < kc; ++k) {
              CHECK(t[static_cast<std::size_t>(k * width + l)] == (real ? bits_of(x(l * 64 + k)) : 0u));
            }
            for (std::int64_t q = 0; q < pairs; ++q) {
              const std::int64_t even = 2 * q, odd = 2 * q + 1;
              const bool has_odd = real && odd < kc;
              const auto at = [&](std::int64_t row) { return static_cast<std::size_t>(row * width + l); };
              CHECK(a[at(q)] == (real ? bf16(even * 64 + l) | (has_odd ? bf16(odd * 64 + l) << 16 : 0u) : 0u));
              CHECK(b[at(q)] == (real ? bf16(l * 64 + even) | (has_odd ? bf16(l * 64 + odd) << 16 : 0u) : 0u));
              CHECK(bits_of(sr[at(even)]) == (has_odd ? rounded(x(odd * 64 + l)) : 0u));
              CHECK(bits_of(sr[at(odd)]) == (real ? rounded(x(even * 64 + l)) : 0u));
              CHECK(bits_of(sl[at(even)]) == (has_odd ? rounded(x(l * 64 + odd)) : 0u));
              CHECK(bits_of(sl[at(odd)]) == (real ? rounded(x(l * 64 + even)) : 0u));
            }
          }
          CHECK(guards_intact(a, 0xdeadbeefu));
          CHECK(guards_intact(b, 0xdeadbeefu));
          CHECK(guards_intact(t, 0xdeadbeefu));
          CHECK(guards_intact(sr, -1.0f));
          CHECK(guards_intact(sl, -1.0f));
          pairs_from_columns.push_back(a);
          pairs_from_rows.push_back(b);
          transposed.push_back(t);
          swapped_from_columns.push_back(sr);
          swapped_from_rows.push_back(sl);
        }
        for (std::size_t i = 1; i < levels.size(); ++i) {
          INFO("level " << i);
          CHECK(pairs_from_columns[i] == pairs_from_columns[0]);
          CHECK(pairs_from_rows[i] == pairs_from_rows[0]);
          CHECK(transposed[i] == transposed[0]);
          CHECK(same_bits(swapped_from_columns[i], swapped_from_columns[0]));
          CHECK(same_bits(swapped_from_rows[i], swapped_from_rows[0]));
        }
      }
    }
  }
}

namespace {

// The opt-in AMX route for bf16 operands while in scope (cpu_features.hpp: use_bf16_amx).
class AmxRoute {
 public:
  AmxRoute() { use_bf16_amx(true); }
  ~AmxRoute() { use_bf16_amx(false); }
  AmxRoute(const AmxRoute&) = delete;
  AmxRoute& operator=(const AmxRoute&) = delete;
};

}  // namespace

TEST_CASE("round_bf16 gives the product's bits rounded afterwards, on every route, block path and thread count",
          "[gemm]") {
  // k past a K block (256 fp32, 512 bf16) so only the last block rounds; n past a column block
  // (512), which takes the whole-A path; accumulating cases round C + product.
  const auto check = [](const Case& t, GemmOperands op) {
    std::vector<float> expected = run(t, op);
    for (float& x : expected) x = round_to_bf16(x);
    CHECK(same_bits(run(t, op, 0, -1, true), expected));
    if (t.m * t.n * t.k >= 2 * kGemmMinParallelWork) {
      ComputePool pool(3);
      ComputePoolScope scope(&pool);
      CHECK(same_bits(run(t, op, 0, -1, true), expected));
    }
  };
  // Drawn shapes, then fixed ones that surely reach each path: k = 0 accumulating (C itself
  // rounded), several K blocks on the BLIS path (n <= 512) and on the whole-A path (n > 512).
  for_each_case(31, 10, {1, 200, 1, 700, 1, 1100}, check);
  const auto fixed = [](unsigned seed, bool ta, bool accumulate, std::int64_t m, std::int64_t n, std::int64_t k) {
    std::mt19937 rng(seed);
    Case t = random_case(rng, {m, m, n, n, k, k});
    t.ta = ta;  // set after the draw: the operands' sizes do not depend on the flags
    t.tb = false;
    t.accumulate = accumulate;
    return t;
  };
  for (const Case& t : {fixed(32, false, true, 5, 40, 0), fixed(35, false, true, 40, 300, 1100),
                        fixed(36, true, false, 40, 300, 1100), fixed(37, true, true, 40, 600, 1100)}) {
    for (GemmOperands op : {GemmOperands::f32, GemmOperands::bf16}) {
      INFO("m=" << t.m << " n=" << t.n << " k=" << t.k << " ta=" << t.ta << " acc=" << t.accumulate);
      check(t, op);
    }
  }
  // The double kernel (finite-difference references) rounds through float.
  for_each_case(34, 3, {1, 20, 1, 20, 1, 40}, [](const Case& t, GemmOperands op) {
    if (op != GemmOperands::f32) return;
    const std::vector<double> a(t.a.begin(), t.a.end()), b(t.b.begin(), t.b.end());
    std::vector<double> plain(t.c0.begin(), t.c0.end()), rounded = plain;
    GemmShape s{t.ta, t.tb, t.m, t.n, t.k, t.ta ? t.m : t.k, t.tb ? t.k : t.n, t.n, t.accumulate};
    gemm_f64(s, a.data(), b.data(), plain.data());
    s.round_bf16 = true;
    gemm_f64(s, a.data(), b.data(), rounded.data());
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(rounded[i] == round_to_bf16(static_cast<float>(plain[i])));
  });
  if (amx_available()) {
    const AmxRoute amx;
    for_each_case(33, 6, {1, 200, 1, 700, 1, 1100}, [&](const Case& t, GemmOperands op) {
      if (op == GemmOperands::bf16) check(t, op);
    });
  } else {
    WARN("no AMX here: round_bf16 on the AMX route is not checked");
  }
}


TEST_CASE("the AMX route is refused where it cannot run: no AMX, or a kernel level below avx512", "[gemm][amx]") {
  const CpuFeatures saved = cpu_features();
  if (amx_available()) {
    use_cpu_features({Isa::avx2, false});  // its packers are AVX-512 code: ATOLL_CPU_ISA=avx2 rules it out
    CHECK_THROWS_AS(use_bf16_amx(true), CpuIsaError);
    use_cpu_features({Isa::avx2, false, false, true});
    CHECK_FALSE(cpu_features().bf16_amx);
  } else {
    WARN("no AMX here: only the refusal without AMX is checked, not the avx512-level rule");
    CHECK_THROWS_AS(use_bf16_amx(true), CpuIsaError);
  }
  CHECK_FALSE(cpu_features().bf16_amx);
  use_cpu_features(saved);
}

TEST_CASE("the AMX route keeps rows independent of their batch and of the thread count", "[gemm][amx]") {
  if (!amx_available()) {
    WARN("no AMX here: the AMX route is not checked");
    return;
  }
  const AmxRoute amx;
  // m, n and k off every tile size (32) and chunk (32 k), k past one K block (512).
  for_each_case(21, 12, {1, 300, 1, 100, 1, 700}, [](const Case& t, GemmOperands op) {
    if (op == GemmOperands::bf16) check_rows_independent_of_batch(t, op);
  });
  for_each_case(22, 4, {256, 600, 256, 600, 256, 700}, [](const Case& t, GemmOperands op) {
    if (op == GemmOperands::bf16) check_independent_of_threads(t, op);
  });
}

TEST_CASE("the AMX route agrees with a double-precision product, and is not the FMA chain", "[gemm][amx]") {
  if (!amx_available()) {
    WARN("no AMX here: the AMX route is not checked");
    return;
  }
  const AmxRoute amx;
  std::int64_t differs = 0, elements = 0;
  for_each_case(23, 30, {1, 120, 1, 90, 1, 700}, [&](const Case& t, GemmOperands op) {
    if (op != GemmOperands::bf16) return;
    const std::vector<float> c = run(t, op);
    // Per chunk of 32 k one aligned sum whose dropped low bits and rounding stay below 2^-23 of
    // each term: the FMA chain's bound holds (measured worst 0.25 of it).
    CHECK(worst_against_double(t, op, c) <= 1.0);
    for (std::int64_t i = 0; i < t.m; ++i)
      for (std::int64_t j = 0; j < t.n; ++j) {
        const float chain = reference_chain(t, i, j, op);
        differs += std::memcmp(&chain, &c[i * t.n + j], sizeof(float)) != 0;
        ++elements;
      }
  });
  // K of whole 32-k chunks (B read across k is packed straight into its panels) and not: the
  // same B stored either way gives the same bits (its two packers build the same panels).
  for (const std::int64_t k : {32, 64, 256, 77}) {
    for_each_case(24 + static_cast<unsigned>(k), 6, {1, 80, 1, 80, k, k}, [&](const Case& t, GemmOperands op) {
      if (op != GemmOperands::bf16) return;
      const std::vector<float> c = run(t, op);
      CHECK(worst_against_double(t, op, c) <= 1.0);
      Case flipped = t;
      flipped.tb = !t.tb;
      for (std::int64_t kk = 0; kk < t.k; ++kk)
        for (std::int64_t j = 0; j < t.n; ++j)
          (flipped.tb ? flipped.b[j * t.k + kk] : flipped.b[kk * t.n + j]) = b_at(t, kk, j);
      CHECK(same_bits(run(flipped, op), c));
    });
  }
  // Not the chain gemm.hpp defines (so the route is opt-in): here many elements differ.
  CHECK(differs > elements / 10);
  // One k chunk of 1, -1 and 2^-30 (c = 0): the chain ends at 2^-30, AMX's aligned sum drops it.
  Case t;
  t.m = t.n = 1;
  t.k = 3;
  t.a = {1.0f, -1.0f, 0x1p-30f};
  t.b = {1.0f, 1.0f, 1.0f};
  t.c0 = {0.0f};
  CHECK(reference_chain(t, 0, 0, GemmOperands::bf16) == 0x1p-30f);
  CHECK(run(t, GemmOperands::bf16)[0] == 0.0f);
}

TEST_CASE("the AMX packers give the pair packers' bits, with denormals as zeros of their sign", "[gemm][amx]") {
  using namespace cpu::gemm_detail;
  if (!amx_available()) {
    WARN("no AMX here: its packers are not checked");
    return;
  }
  const std::vector<float> src = pack_source(0.25f, 97);
  std::vector<float> flushed_src = src;  // what vcvtne2ps2bf16 sees a denormal as
  for (float& v : flushed_src) v = flushed(v);
  REQUIRE(flushed_src != src);  // pack_source holds a denormal
  const PackKernels amx = pack_kernels_amx(), avx512 = pack_kernels_avx512();
  constexpr std::int64_t width = 32, chunk = 16;
  for (const std::int64_t lines : {1, 13, 32}) {
    for (const std::int64_t kc : {1, 6, 27, 33, 64}) {
      INFO("lines " << lines << " kc " << kc);
      const std::int64_t pairs = (kc + 1) / 2, padded = (pairs + chunk - 1) / chunk * chunk;
      // The A panels: chunk by chunk, a pair packer's [pair][line] panel as [line][16 pairs], zero
      // past kc.
      const auto check_rows = [&](const std::vector<std::uint32_t>& rows, const std::vector<std::uint32_t>& pair_major) {
        CHECK(guards_intact(rows, 0xdeadbeefu));
        std::int64_t wrong = 0;
        for (std::int64_t q = 0; q < padded; ++q) {
          for (std::int64_t l = 0; l < width; ++l) {
            const std::uint32_t expected = q < pairs ? pair_major[static_cast<std::size_t>(q * width + l)] : 0u;
            wrong += rows[static_cast<std::size_t>((q / chunk) * chunk * width + l * chunk + q % chunk)] != expected;
          }
        }
        CHECK(wrong == 0);
      };
      std::vector<std::uint32_t> got(static_cast<std::size_t>(padded * width + 16), 0xdeadbeefu), want = got;
      std::vector<std::uint32_t> rows = got;
      amx.bf16_pairs(src.data(), 64, kc, lines, got.data(), width, (kc + 1) / 2);  // lines contiguous
      avx512.bf16_pairs(flushed_src.data(), 64, kc, lines, want.data(), width, (kc + 1) / 2);
      CHECK(got == want);
      amx.amx_rows_across_k(src.data(), 64, lines, kc, rows.data(), width, padded);
      check_rows(rows, want);
      amx.pair_lines(src.data(), 64, lines, kc, got.data(), width);  // k contiguous
      avx512.pair_lines(flushed_src.data(), 64, lines, kc, want.data(), width);
      CHECK(got == want);
      amx.amx_rows(src.data(), 64, lines, kc, rows.data(), width, padded);
      check_rows(rows, want);
    }
  }
}

// tree_sum_arrays against PairwiseTreeSum over the same values: the same bits for every member
// count (powers of two and not), lengths that are not multiples of the block, and an output that
// aliases a part. A left-to-right sum differs from both on these values (the test can fail).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "kernels/rng.hpp"
#include "kernels/tree_sum.hpp"
#include "kernels/tree_sum_arrays.hpp"

using namespace atl;

namespace {

// Values of very different magnitudes, so the order of the additions shows in the bits.
std::vector<std::vector<float>> random_parts(int count, std::int64_t n) {
  std::vector<std::vector<float>> parts(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    CounterRng rng(static_cast<std::uint64_t>(i) + 1, "tree");
    for (std::int64_t k = 0; k < n; ++k) {
      const double scale = (k + i) % 3 == 0 ? 1e4 : 1e-2;
      parts[static_cast<std::size_t>(i)].push_back(static_cast<float>(scale * (rng.uniform(static_cast<std::uint64_t>(k)) - 0.5)));
    }
  }
  return parts;
}

std::vector<float> reference(const std::vector<std::vector<float>>& parts) {
  auto tree = make_tree_sum<std::vector<float>>([](std::vector<float>& a, const std::vector<float>& b) {
    for (std::size_t k = 0; k < a.size(); ++k) a[k] += b[k];
  });
  for (const auto& p : parts) tree.push(p);
  return tree.finish();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("tree_sum_arrays: the bits of PairwiseTreeSum for any member count and length", "[kernels][tree_sum]") {
  for (int count : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16}) {
    for (std::int64_t n : {1, 1023, 1024, 3000}) {
      INFO("count " << count << ", n " << n);
      const auto parts = random_parts(count, n);
      std::vector<const float*> pointers;
      for (const auto& p : parts) pointers.push_back(p.data());
      std::vector<float> out(static_cast<std::size_t>(n));
      tree_sum_arrays(pointers.data(), count, n, out.data());
      const auto expected = reference(parts);
      CHECK(same_bits(out, expected));

      // In place: the output is the last part.
      auto aliased = parts;
      std::vector<const float*> aliased_pointers;
      for (const auto& p : aliased) aliased_pointers.push_back(p.data());
      tree_sum_arrays(aliased_pointers.data(), count, n, aliased.back().data());
      CHECK(same_bits(aliased.back(), expected));

      if (count >= 4 && n == 3000) {  // the order matters on these values (3: the tree is left to right)
        std::vector<float> sequential(static_cast<std::size_t>(n), 0.0f);
        for (const auto& p : parts) {
          for (std::int64_t k = 0; k < n; ++k) sequential[static_cast<std::size_t>(k)] += p[static_cast<std::size_t>(k)];
        }
        CHECK_FALSE(same_bits(sequential, expected));
      }
    }
  }
}

// The fixed pairwise summation tree over micro-batch indices 0..n-1 (issue 3's numerics note):
// tree(lo, n) = tree(lo, p) + tree(lo + p, n - p) with p the largest power of two below n
// (n/2 for powers of two). Values are pushed in index order and combined as soon as two
// subtrees of one size meet, so at most log2(n) partial sums are alive. A rank that owns an
// aligned power-of-two block of micro-batches reproduces a subtree of the same tree.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace atl {

template <class T, class Add>  // Add(T& left, const T& right): left += right
class PairwiseTreeSum {
 public:
  explicit PairwiseTreeSum(Add add) : add_(std::move(add)) {}

  void push(T value) {
    stack_.push_back({0, std::move(value)});
    while (stack_.size() >= 2 && stack_[stack_.size() - 1].first == stack_[stack_.size() - 2].first) {
      merge_top();
      stack_.back().first += 1;
    }
  }

  // Combines the remaining subtrees from the right: tree(lo, p) + (rest).
  T finish() {
    if (stack_.empty()) throw std::logic_error("PairwiseTreeSum: nothing was pushed");
    while (stack_.size() > 1) merge_top();
    T out = std::move(stack_.back().second);
    stack_.clear();
    return out;
  }

 private:
  void merge_top() {
    auto right = std::move(stack_.back());
    stack_.pop_back();
    add_(stack_.back().second, right.second);
  }

  Add add_;
  std::vector<std::pair<int, T>> stack_;
};

template <class T, class Add>
PairwiseTreeSum<T, Add> make_tree_sum(Add add) {
  return PairwiseTreeSum<T, Add>(std::move(add));
}

}  // namespace atl

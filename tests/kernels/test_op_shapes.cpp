// Degenerate shapes reach the ops only through a bad config or a bug upstream: each is refused
// with a message naming the op and the argument, never a trap (a division by a zero width) or a
// write outside a buffer (a rank-0 tensor's missing first dimension).
#include <catch2/catch.hpp>

#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/ops/l2_clip.hpp"
#include "kernels/ops/matmul.hpp"
#include "kernels/ops/norm.hpp"

using namespace atl;

TEST_CASE("ops refuse an empty last dimension by name instead of dividing by it", "[ops]") {
  const Tensor x = Tensor::zeros({4, 0}), none;
  const std::string empty = "must have a last dimension of at least 1, got f32[4, 0]";
  CHECK_THROWS_WITH(linear_forward(x, Tensor::zeros({3, 0})), Catch::Contains("linear_forward: x " + empty));
  CHECK_THROWS_WITH(linear_backward(x, Tensor::zeros({3, 0}), Tensor::zeros({4, 3}), nullptr, Precision::fp32),
                    Catch::Contains("linear_backward: x " + empty));
  CHECK_THROWS_WITH(rmsnorm_forward(x, none, 1e-6f, Precision::fp32), Catch::Contains("rmsnorm_forward: x " + empty));
  CHECK_THROWS_WITH(rmsnorm_backward(x, x, none, Tensor::zeros({4}), nullptr), Catch::Contains("rmsnorm_backward: x " + empty));
  CHECK_THROWS_WITH(l2_clip_forward(x, none, 1.0f, Precision::fp32), Catch::Contains("l2_clip_forward: x " + empty));
  CHECK_THROWS_WITH(l2_clip_backward(x, x, none, 1.0f, Tensor::zeros({4}), nullptr),
                    Catch::Contains("l2_clip_backward: x " + empty));
  // No rows at all is fine: nothing to compute.
  CHECK(linear_forward(Tensor::zeros({0, 2}), Tensor::zeros({3, 2})).shape() == Shape{0, 3});
}

TEST_CASE("linear backward refuses x and w that do not match, as the forward does", "[ops][matmul]") {
  // x[5] against w[2, 3] would leave 2 of dx's 5 elements unwritten (stale allocator memory).
  CHECK_THROWS_WITH(linear_backward(Tensor::zeros({5}), Tensor::zeros({2, 3}), Tensor::zeros({2}), nullptr, Precision::fp32),
                    Catch::Contains("linear_backward: x f32[5] and w f32[2, 3] do not match"));
}

TEST_CASE("row ops refuse a rank-0 tensor, which has no rows", "[ops]") {
  CHECK_THROWS_WITH(concat_rows({Tensor::zeros({})}), Catch::Contains("concat_rows: part f32[] does not stack"));
  ExpertDispatch dispatch;
  CHECK_THROWS_WITH(gather_rows_from_slots(Tensor::zeros({}), dispatch, 0, 0),
                    Catch::Contains("gather_rows_from_slots: slots must be [slots, ...], got f32[]"));
  // (rows.size(0) of a rank-0 tensor threw std::out_of_range, not the op's own message)
  CHECK_THROWS_WITH(scatter_rows_to_slots(Tensor::zeros({}), dispatch, 0, Tensor::zeros({})),
                    Catch::Contains("scatter_rows_to_slots: rows f32[] and slots f32[] must be f32"));
}

TEST_CASE("rmsnorm backward refuses a weight gradient to fill without a weight", "[ops]") {
  Tensor dweight = Tensor::zeros({3});
  CHECK_THROWS_WITH(rmsnorm_backward(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}), Tensor(), Tensor::zeros({2}), &dweight),
                    Catch::Contains("rmsnorm_backward: dweight without a weight"));
}

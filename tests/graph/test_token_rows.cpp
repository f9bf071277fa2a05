// read_token_rows: the --tokens file of atoll-eval --dump-logits, and its refusals.
#include <catch2/catch.hpp>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/eval/evaluate.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

namespace atl {
namespace {

using checkpoint_testing::TempDir;

Tensor i64_rows(const std::vector<std::vector<std::int64_t>>& rows) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(rows[0].size())},
                           DType::i64);
  auto out = t.span<std::int64_t>();
  std::size_t i = 0;
  for (const auto& row : rows) {
    for (std::int64_t v : row) out[i++] = v;
  }
  return t;
}

Tensor all_valid(std::int64_t rows, std::int64_t cols) {
  Tensor t = Tensor::empty({rows, cols}, DType::boolean);
  for (bool& v : t.span<bool>()) v = true;
  return t;
}

// The three tensors of a --tokens file; those not given are two good rows of three tokens.
struct Rows {
  Tensor input_ids = i64_rows({{5, 6, 7}, {8, 9, 10}});
  Tensor positions = i64_rows({{0, 1, 0}, {3, 4, 5}});
  Tensor valid = all_valid(2, 3);
  bool with_valid = true;
};

std::string error_reading(const std::filesystem::path& file, const Rows& rows) {
  TensorMap tensors;
  tensors.insert("input_ids", rows.input_ids);
  tensors.insert("positions", rows.positions);
  if (rows.with_valid) tensors.insert("valid", rows.valid);
  write_safetensors(file, tensors);
  try {
    (void)read_token_rows(file, 250);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

}  // namespace

TEST_CASE("read_token_rows reads rows and names the file, the tensor and the cell it refuses", "[eval]") {
  TempDir tmp;
  const auto file = tmp.path / "rows.safetensors";
  CHECK(error_reading(file, Rows{}) == "(no CheckpointError)");
  const Batch batch = read_token_rows(file, 250);
  const auto ids = batch.input_ids.span<std::int64_t>();
  CHECK(std::vector<std::int64_t>(ids.begin(), ids.end()) == std::vector<std::int64_t>{5, 6, 7, 8, 9, 10});
  for (std::int64_t t : batch.targets.span<std::int64_t>()) CHECK(t == kIgnoreTarget);

  Rows out_of_vocab;  // row 1, column 2: the flat index 5 would not say where
  out_of_vocab.input_ids = i64_rows({{5, 6, 7}, {8, 9, 250}});
  CHECK(error_reading(file, out_of_vocab) ==
        file.string() + ": input_ids[1, 2] = 250 is outside the usable vocabulary [0, 250)");
  out_of_vocab.input_ids = i64_rows({{5, -1, 7}, {8, 9, 10}});
  CHECK_THAT(error_reading(file, out_of_vocab), Catch::Contains("input_ids[0, 1] = -1 is outside"));

  Rows bad_positions;
  bad_positions.positions = i64_rows({{0, 1, 0}, {3, 5, 6}});
  CHECK_THAT(error_reading(file, bad_positions),
             Catch::StartsWith(file.string() + ": positions: ") && Catch::Contains("at row 1, col 1 position 5 follows 3"));

  Rows missing;
  missing.with_valid = false;
  CHECK(error_reading(file, missing) == file.string() + ": no tensor 'valid'");

  Rows wrong_dtype;
  wrong_dtype.positions = Tensor::zeros({2, 3}, DType::f32);
  CHECK(error_reading(file, wrong_dtype) == file.string() + ": tensor 'positions' is f32[2, 3], expected i64[batch, seq]");

  Rows wrong_shape;
  wrong_shape.valid = all_valid(2, 2);
  CHECK(error_reading(file, wrong_shape) == file.string() + ": input_ids, positions and valid must share one shape");

  // No token at all, whatever the other dimension claims (a model run on [0, 2^62] crashed).
  for (const Shape& empty : {Shape{0, std::int64_t{1} << 62}, Shape{std::int64_t{1} << 40, 0}}) {
    Rows none;
    none.input_ids = Tensor::empty(empty, DType::i64);
    none.positions = Tensor::empty(empty, DType::i64);
    none.valid = Tensor::empty(empty, DType::boolean);
    CHECK(error_reading(file, none) == file.string() + ": input_ids is " + none.input_ids.describe() +
                                           "; expected at least one row of at least one token");
  }
}

}  // namespace atl

// The wire form of a starting point (node 0 hands it to the other nodes, issue 11): the header
// carries every field and each tensor's name and shape, the tensors then travel one by one into
// the receiver's, in the same order on both sides; node 0's failure arrives as StartFailed with
// its message; malformed bytes are rejected, not misread.
#include <catch2/catch.hpp>

#include <cstring>

#include "graph/training/starting_point.hpp"

using namespace atl;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

StartingPoint example() {
  StartingPoint s;
  s.state.step = 40;
  s.tokens = 81920;
  s.description = "resumed from run/checkpoints/step-00000040 at step 40";
  s.data_cursor = nlohmann::json{{"epoch", 1}, {"row", 17}};
  // Every tensor distinct, so one handed over in another's place is seen.
  const float w[] = {1.5f, -0.0f, 3e-39f, 7.25f, -2.0f, 0.125f};
  const float m[] = {-1.5f, 0.0f, -3e-39f, 6.25f, 2.0f, -0.125f};
  s.state.master.insert("model.embed.weight", Tensor::from_floats({2, 3}, w));
  s.state.master.insert("model.norm.weight", Tensor::from_floats({2}, std::span<const float>(w + 3, 2)));
  s.state.exp_avg.insert("model.embed.weight", Tensor::from_floats({2, 3}, m));
  s.state.exp_avg_sq.insert("model.embed.weight", Tensor::full({2, 3}, 0.5f));
  return s;
}

}  // namespace

TEST_CASE("starting point: the header and the tensors in order round-trip every field and bit", "[graph][launch]") {
  const StartingPoint s = example();
  StartingPoint back = decode_start_header(encode_start_header(s));
  CHECK(back.state.step == 40);
  CHECK(back.tokens == 81920);
  CHECK(back.description == s.description);
  REQUIRE(back.data_cursor);
  CHECK(*back.data_cursor == *s.data_cursor);
  CHECK(back.state.master.names() == s.state.master.names());
  // What the hand-over does: each of node 0's tensors into the receiver's, pairwise in order.
  const std::vector<Tensor> sent = start_tensors(s), received = start_tensors(back);
  REQUIRE(sent.size() == 4);
  REQUIRE(received.size() == 4);
  for (std::size_t i = 0; i < sent.size(); ++i) {
    REQUIRE(received[i].shape() == sent[i].shape());
    std::memcpy(received[i].raw(), sent[i].raw(), sent[i].bytes());
  }
  for (const auto& name : s.state.master.names()) CHECK(same_bits(back.state.master.at(name), s.state.master.at(name)));
  CHECK(same_bits(back.state.exp_avg.at("model.embed.weight"), s.state.exp_avg.at("model.embed.weight")));
  CHECK(same_bits(back.state.exp_avg_sq.at("model.embed.weight"), s.state.exp_avg_sq.at("model.embed.weight")));

  const StartingPoint fresh = decode_start_header(encode_start_header(StartingPoint{}));
  CHECK(fresh.state.step == 0);
  CHECK(fresh.state.master.names().empty());
  CHECK(start_tensors(fresh).empty());
  CHECK_FALSE(fresh.data_cursor);
  CHECK(fresh.description == "fresh initialisation");
}

TEST_CASE("starting point: node 0's failure and malformed bytes", "[graph][launch]") {
  CHECK_THROWS_MATCHES(decode_start_header(encode_start_failure("checkpoint.dir: no checkpoint", 2)), StartFailed,
                       Catch::Message("node 0 did not start: checkpoint.dir: no checkpoint"));
  for (int code : {0, 1, 2}) {
    try {
      decode_start_header(encode_start_failure("why", code));
      FAIL("no StartFailed");
    } catch (const StartFailed& e) {
      CHECK(e.exit_code() == code);
    }
  }
  auto bytes = encode_start_header(example());
  auto truncated = bytes;
  truncated.resize(bytes.size() - 1);
  CHECK_THROWS_WITH(decode_start_header(truncated), Catch::Contains("bytes follow"));
  auto longer = bytes;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH(decode_start_header(longer), Catch::Contains("bytes follow"));
  CHECK_THROWS_AS(decode_start_header(std::vector<std::byte>(4)), std::invalid_argument);
  CHECK(is_start_failure(encode_start_failure("why", 1)));
  CHECK_FALSE(is_start_failure(bytes));
  CHECK_FALSE(is_start_failure(std::vector<std::byte>(4)));
  // A header without its fields: invalid_argument, not a JSON library error.
  const std::string header = R"({"step":1})";
  std::vector<std::byte> partial(8 + header.size());
  const std::uint64_t length = header.size();
  std::memcpy(partial.data(), &length, 8);
  std::memcpy(partial.data() + 8, header.data(), header.size());
  CHECK_THROWS_AS(decode_start_header(partial), std::invalid_argument);
}

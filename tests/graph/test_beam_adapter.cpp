#include <catch2/catch.hpp>

#include <cstring>

#include "graph/models/beam/model.hpp"
#include "graph/models/hf_layout.hpp"

using namespace atl;

namespace {
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}
}  // namespace

TEST_CASE("Beam HF -> native -> HF is bitwise, fp32 and bf16 tensors alike", "[beam][adapter]") {
  BeamModel model(beam_preset("beam-tiny-moe"));
  TensorMap native = TensorMap::initialized(model.specs(), 3, 0.02f);
  // Store the bulk in bf16 (as a bf16 export would) and keep the router island fp32.
  TensorMap mixed;
  for (const auto& s : model.specs()) mixed.insert(s.name, s.island ? native.at(s.name) : native.at(s.name).to(DType::bf16));
  TensorMap hf = model.to_hf(mixed);
  CHECK(hf.contains("model.layers.0.mlp.experts.7.down_proj.weight"));
  CHECK_FALSE(hf.contains("model.layers.0.mlp.experts.gate_and_up_projs"));
  CHECK(hf.at("model.layers.2.mlp.gate.weight").dtype() == DType::f32);
  CHECK(hf.at("model.layers.2.mlp.experts.3.up_proj.weight").dtype() == DType::bf16);
  TensorMap back = model.from_hf(hf);
  REQUIRE(back.names() == mixed.names());
  for (const auto& name : mixed.names()) CHECK(same_bits(back.at(name), mixed.at(name)));
  TensorMap hf_again = model.to_hf(back);
  for (const auto& name : hf.names()) CHECK(same_bits(hf_again.at(name), hf.at(name)));
}

TEST_CASE("Beam experts: native gate_and_up[e] = concat(gate^T, up^T), gate first, down = down^T", "[beam][adapter]") {
  // One expert, H = 2, I = 3, hand-built.
  TensorMap hf;
  hf.insert("p.0.gate_proj.weight", Tensor::from_floats({3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6}));
  hf.insert("p.0.up_proj.weight", Tensor::from_floats({3, 2}, std::vector<float>{10, 20, 30, 40, 50, 60}));
  hf.insert("p.0.down_proj.weight", Tensor::from_floats({2, 3}, std::vector<float>{7, 8, 9, 70, 80, 90}));
  auto [gate_up, down] = per_expert_from_hf("p", {1, 2, 6}, hf);
  REQUIRE(gate_up.shape() == Shape{1, 2, 6});
  // Row h of gate_and_up = [gate[:, h] | up[:, h]].
  const std::vector<float> expect_gu = {1, 3, 5, 10, 30, 50, 2, 4, 6, 20, 40, 60};
  CHECK(std::vector<float>(gate_up.span<float>().begin(), gate_up.span<float>().end()) == expect_gu);
  const std::vector<float> expect_down = {7, 70, 8, 80, 9, 90};  // [I, H]
  CHECK(std::vector<float>(down.span<float>().begin(), down.span<float>().end()) == expect_down);

  // Each tensor is checked against its own shape and named.
  auto with = [&](const std::string& name, Tensor t) {
    TensorMap out;
    for (const auto& n : hf.names()) out.insert(n, n == name ? t : hf.at(n));
    return out;
  };
  CHECK_THROWS_WITH(per_expert_from_hf("p", {1, 2, 6}, with("p.0.gate_proj.weight", Tensor::zeros({1, 3, 2}))),
                    "HF state dict: tensor 'p.0.gate_proj.weight' is f32[1, 3, 2], expected shape [3, 2]");
  CHECK_THROWS_WITH(per_expert_from_hf("p", {1, 2, 6}, with("p.0.down_proj.weight", Tensor::zeros({3, 2}))),
                    "HF state dict: tensor 'p.0.down_proj.weight' is f32[3, 2], expected shape [2, 3]");
}

TEST_CASE("Beam from_hf names the missing or misshapen tensor", "[beam][adapter]") {
  BeamModel model(beam_preset("beam-tiny-dense"));
  TensorMap hf = model.to_hf(TensorMap::initialized(model.specs(), 1, 0.02f));
  TensorMap missing;
  for (const auto& n : hf.names()) {
    if (n != "model.norm.weight") missing.insert(n, hf.at(n));
  }
  CHECK_THROWS_WITH(model.from_hf(missing), Catch::Contains("model.norm.weight"));
  TensorMap extra = hf.clone();
  extra.insert("model.layers.9.bogus", Tensor::zeros({1}));
  CHECK_THROWS_WITH(model.from_hf(extra), Catch::Contains("model.layers.9.bogus"));
}

TEST_CASE("config.json: float fields print as the shortest decimal of the float", "[beam][adapter]") {
  const nlohmann::json j = with_short_floats({{"eps", static_cast<double>(1e-6f)},
                                              {"list", {static_cast<double>(0.1f), 3}},
                                              {"wide", 0.1},  // a double that is no float: as it was
                                              {"flag", true}});
  CHECK(j.dump() == R"({"eps":1e-06,"flag":true,"list":[0.1,3],"wide":0.1})");
  CHECK(static_cast<float>(j.at("eps").get<double>()) == 1e-6f);  // reads back as the same float
  const BeamModel model(beam_preset("beam-tiny-moe"));
  CHECK(model.hf_config().at("initializer_range").dump() == "0.02");
  CHECK(model.hf_config().at("rms_norm_eps").dump() == "1e-06");
}

// Flint (MODELS.md §2, §4, §10.3): parameters and islands, whole-model gradients, the planner's
// units, masks and windows, HF adapters, and bf16 precision rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/graph/gradient_check.hpp"
#include "tests/graph/model_test_support.hpp"
#include "graph/config.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/hf_layout.hpp"
#include "graph/plan/plan.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/ops/optim.hpp"
#include "kernels/rng.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;

namespace {

// The whole-model gradient check (tests/graph/gradient_check.hpp, its default directions); shifts
// that flip a router choice are not used (Flint's router weights are small, ~1/E each, so a flip
// dominates a difference quotient). Stated tolerance: testing::kGradientTolerance.
double worst_directional_error(const FlintConfig& config, std::string* worst_name) {
  FlintModel model(config);
  TensorMap w = TensorMap::initialized(model.specs(), 11, 0.02f);
  // Non-trivial norm gammas and sinks (zero at init) so their gradients are generic; router
  // weights 10x init_std so the softmax over E is far from uniform (fewer near-ties to flip).
  for (const auto& s : model.specs()) {
    if (s.name.ends_with("mlp.gate.weight")) scale_inplace(w.at(s.name), 10.0f);
    if (s.init != Init::normal) {
      CounterRng rng(5, s.name);
      float* p = w.at(s.name).data<float>();
      for (std::int64_t i = 0; i < s.numel(); ++i) p[i] += static_cast<float>(0.1 * rng.normal(i));
    }
  }
  const testing::GradientCheck check =
      testing::check_whole_model_gradient(model, w, testing::synthetic_batch(2, 32, 3));
  if (worst_name) *worst_name = check.worst_name;
  return check.worst;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

std::vector<float> values(const Tensor& t) { return {t.span<float>().begin(), t.span<float>().end()}; }

}  // namespace

TEST_CASE("Flint presets declare the parameters MODELS.md lists, with fp32 sinks and lm_head", "[flint]") {
  FlintModel model(flint_preset("flint-tiny"));
  const auto& c = model.config();
  CHECK(c.num_hidden_layers == 6);
  CHECK(c.sliding_window == 5);
  CHECK((c.mlp_only_layers == std::vector<std::int64_t>{0, 1}));
  for (std::int64_t l = 0; l < 6; ++l) CHECK(c.is_sliding(l) == (l >= 2 && l <= 4));  // full (NoPE) = {0, 1, 5}
  int islands = 0;
  for (const auto& s : model.specs()) {
    INFO(s.name);
    if (s.island) {
      ++islands;
      CHECK((s.name.ends_with("self_attn._fp32_params.sinks") || s.name == "lm_head.weight"));
      CHECK(s.compute_dtype(Precision::bf16) == DType::f32);
    } else {
      CHECK(s.compute_dtype(Precision::bf16) == DType::bf16);  // the router weight included (bulk)
    }
    CHECK(s.compute_dtype(Precision::fp32) == DType::f32);
  }
  CHECK(islands == 6 + 1);  // one sink holder per layer, the head
  auto shape = [&](const std::string& n) {
    for (const auto& s : model.specs()) {
      if (s.name == n) return s.shape;
    }
    return Shape{};
  };
  CHECK(shape("model.layers.0.self_attn._fp32_params.sinks") == Shape{4});
  CHECK(shape("model.layers.0.mlp.gate_proj.weight") == Shape{128, 64});  // dense layers, §10.3.5
  CHECK(shape("model.layers.1.mlp.down_proj.weight") == Shape{64, 128});
  CHECK(shape("model.layers.1.mlp.gate.weight").empty());
  CHECK(shape("model.layers.2.mlp.gate.weight") == Shape{8, 64});
  CHECK(shape("model.layers.2.mlp.experts.gate_and_up_projs") == Shape{8, 64, 64});
  CHECK(shape("model.layers.2.mlp.experts.down_projs") == Shape{8, 32, 64});
  CHECK(shape("model.layers.5.mlp.shared_experts.gate_proj.weight") == Shape{32, 64});
  CHECK(shape("model.layers.5.mlp.shared_experts.down_proj.weight") == Shape{64, 32});
  CHECK(shape("lm_head.weight") == Shape{256, 64});
  CHECK(model.parameter_count() == 379'928);

  FlintModel real(flint_preset("flint"));
  std::int64_t full = 0;
  for (std::int64_t l = 0; l < 49; ++l) full += !real.config().is_sliding(l);
  CHECK(full == 14);
  CHECK(real.config().sliding_window == 513);  // the current token + 512 preceding
  CHECK_THROWS_WITH(flint_preset("flint-huge"), Catch::Contains("flint-tiny"));
}

TEST_CASE("Whole-model gradient check: flint-tiny", "[flint][grad]") {
  std::string worst;
  double err = worst_directional_error(flint_preset("flint-tiny"), &worst);
  INFO("worst tensor: " << worst);
  CHECK(err < testing::kGradientTolerance);
}

TEST_CASE("Flint sharding: per layer one sink island and one bulk block, the head is an fp32 island unit",
          "[flint][plan]") {
  FlintModel model(flint_preset("flint-tiny"));
  MeshConfig mc;
  mc.dp_shard = 2;
  const Plan plan = make_plan(model.specs(), model.sharding_rules(), Mesh(mc, "test.yaml"), Precision::bf16);
  REQUIRE(plan.units.size() == 1 + 6 * 2 + 1 + 1);  // embedding, (sinks, block) per layer, root, head
  CHECK(plan.units.front().name == "model.embed_tokens");
  for (std::int64_t l = 0; l < 6; ++l) {
    INFO("layer " << l);
    std::vector<const UnitPlan*> units;
    for (const auto& u : plan.units) {
      if (u.layer == l) units.push_back(&u);
    }
    REQUIRE(units.size() == 2);
    const std::string p = "model.layers." + std::to_string(l);
    CHECK(units[0]->name == p + ".self_attn._fp32_params");
    CHECK(units[0]->role == UnitRole::island);
    CHECK(units[0]->island);
    CHECK(units[0]->policy == island_policy());
    REQUIRE(units[0]->params.size() == 1);
    CHECK(units[0]->params[0].name == p + ".self_attn._fp32_params.sinks");
    CHECK(units[1]->name == p);
    CHECK(units[1]->role == UnitRole::block);
    CHECK(units[1]->policy == bulk_policy(Precision::bf16));
    CHECK(units[1]->policy.param_dtype == DType::bf16);
  }
  CHECK(plan.unit_of_param("model.layers.3.mlp.gate.weight").name == "model.layers.3");  // router is bulk
  const UnitPlan& head = plan.unit("lm_head");
  CHECK(head.role == UnitRole::head);
  CHECK(head.island);
  CHECK(head.policy == island_policy());
  CHECK(head.policy.param_dtype == DType::f32);
  CHECK(plan.units.back().name == "lm_head");
  CHECK(plan.unit("model").role == UnitRole::root);
  CHECK(plan.unit_of_param("model.norm.weight").name == "model");
  CHECK(plan.unit("model").policy == bulk_policy(Precision::bf16));
  int island_units = 0;
  for (const auto& u : plan.units) island_units += u.island;
  CHECK(island_units == 7);
}

TEST_CASE("Flint logits: fp32, no softcap, columns >= Vu are -inf", "[flint]") {
  FlintModel model(flint_preset("flint-tiny"));
  TensorMap w = TensorMap::initialized(model.specs(), 1, 3.0f);  // large init: logits far beyond any cap
  Batch batch = testing::synthetic_batch(2, 32, 4);
  Tensor logits;
  model.forward(w, batch, Precision::fp32, &logits);
  REQUIRE(logits.shape() == Shape{2, 32, 256});
  float max_abs = 0;
  for (std::int64_t t = 0; t < 64; ++t) {
    for (std::int64_t v = 0; v < 256; ++v) {
      const float x = logits.data<float>()[t * 256 + v];
      if (v >= 250) {
        CHECK(x == -std::numeric_limits<float>::infinity());
      } else {
        REQUIRE(std::isfinite(x));
        max_abs = atl::testing::worst_of(max_abs, std::abs(x));
      }
    }
  }
  CHECK(max_abs > 50.0f);  // no softcap (Beam's would stop at 30)
}

TEST_CASE("Flint keeps documents isolated inside a packed row", "[flint]") {
  FlintModel model(flint_preset("flint-tiny"));
  TensorMap w = TensorMap::initialized(model.specs(), 2, 0.1f);
  Batch a = testing::synthetic_batch(1, 32, 5);
  testing::check_document_isolation(model, w, a);
}

TEST_CASE("Flint sliding window 5 sees 0 <= q-k <= 4 (MODELS.md §10.3.5)", "[flint]") {
  // One sliding MoE layer: attention is the only place tokens mix.
  FlintConfig c = flint_preset("flint-tiny");
  c.num_hidden_layers = 1;
  c.layer_types = {"sliding_attention"};
  c.mlp_only_layers = {};
  FlintModel model(c);
  TensorMap w = TensorMap::initialized(model.specs(), 4, 0.1f);
  Batch a = Batch::zeros(1, 16);
  for (std::int64_t t = 0; t < 16; ++t) {
    a.input_ids.data<std::int64_t>()[t] = (7 * t + 3) % 250;
    a.positions.data<std::int64_t>()[t] = t;  // one document
    a.valid.data<bool>()[t] = true;
    a.targets.data<std::int64_t>()[t] = kIgnoreTarget;
  }
  auto logits_after_change = [&](std::int64_t changed) {
    Batch b{a.input_ids.clone(), a.positions, a.valid, a.targets};
    b.input_ids.data<std::int64_t>()[changed] = (a.input_ids.data<std::int64_t>()[changed] + 11) % 250;
    Tensor l;
    model.forward(w, b, Precision::fp32, &l);
    return l;
  };
  Tensor base;
  model.forward(w, a, Precision::fp32, &base);
  const std::int64_t q = 12;
  auto row_equal = [&](const Tensor& l) {
    return std::memcmp(l.data<float>() + q * 256, base.data<float>() + q * 256, 250 * sizeof(float)) == 0;
  };
  CHECK(row_equal(logits_after_change(q - 5)));        // outside the window
  CHECK_FALSE(row_equal(logits_after_change(q - 4)));  // the oldest visible key
  CHECK_FALSE(row_equal(logits_after_change(q)));
}

TEST_CASE("Flint HF -> native -> HF is bitwise, fp32 islands stay fp32, renames per §10.3", "[flint][adapter]") {
  FlintModel model(flint_preset("flint-tiny"));
  TensorMap native = TensorMap::initialized(model.specs(), 3, 0.02f);
  TensorMap mixed;  // bulk exported in bf16, islands kept fp32 (§10.5.2)
  for (const auto& s : model.specs()) mixed.insert(s.name, s.island ? native.at(s.name) : native.at(s.name).to(DType::bf16));
  TensorMap hf = model.to_hf(mixed);
  for (const auto& n : hf.names()) {
    INFO(n);
    CHECK(n.find("_fp32_params") == std::string::npos);
    CHECK(n.find("shared_experts") == std::string::npos);
    CHECK(n.find("gate_and_up_projs") == std::string::npos);
  }
  CHECK(hf.at("model.layers.0.self_attn.softmax_offset").dtype() == DType::f32);
  CHECK(hf.at("model.layers.5.self_attn.softmax_offset").shape() == Shape{4});
  CHECK(hf.at("lm_head.weight").dtype() == DType::f32);
  CHECK(hf.at("model.layers.2.mlp.shared_expert.gate_proj.weight").shape() == Shape{32, 64});
  CHECK(hf.at("model.layers.2.mlp.shared_expert.down_proj.weight").dtype() == DType::bf16);
  CHECK(hf.at("model.layers.3.mlp.experts.7.down_proj.weight").shape() == Shape{64, 32});
  CHECK(hf.at("model.layers.0.mlp.gate_proj.weight").shape() == Shape{128, 64});  // dense layers keep names
  CHECK(hf.at("model.layers.2.mlp.gate.weight").dtype() == DType::bf16);           // router is bulk
  CHECK(hf.names().size() == model.specs().size() - 4 * 2 + 4 * 3 * 8);
  TensorMap back = model.from_hf(hf);
  REQUIRE(back.names() == mixed.names());
  for (const auto& name : mixed.names()) CHECK(same_bits(back.at(name), mixed.at(name)));
  TensorMap hf_again = model.to_hf(back);
  REQUIRE(hf_again.names() == hf.names());
  for (const auto& name : hf.names()) CHECK(same_bits(hf_again.at(name), hf.at(name)));

  const nlohmann::json cfg = model.hf_config();
  CHECK(cfg["model_type"] == "flint");
  CHECK(cfg["num_experts"] == 8);
  CHECK(cfg["shared_expert_intermediate_size"] == 32);
  CHECK(cfg["mlp_only_layers"] == nlohmann::json::array({0, 1}));
  CHECK(cfg["sliding_window"] == 5);
  CHECK(cfg["norm_topk_prob"] == false);
  CHECK(cfg["tie_word_embeddings"] == false);

  TensorMap extra = hf.clone();
  extra.insert("model.layers.0.self_attn._fp32_params.sinks", Tensor::zeros({4}));  // a native name is not HF
  CHECK_THROWS_WITH(model.from_hf(extra), Catch::Contains("model.layers.0.self_attn._fp32_params.sinks"));
}

TEST_CASE("Flint adapter on hand-built tensors: gate first in gate_and_up, sinks and shared-expert renames",
          "[flint][adapter]") {
  // One MoE layer, H = 2, one head of D = 2, E = 2 experts of I = 3, shared width 3.
  FlintConfig c;
  c.preset = "hand";
  c.vocab_size = 4;
  c.unpadded_vocab_size = 4;
  c.hidden_size = 2;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.num_experts = 2;
  c.num_experts_per_tok = 1;
  c.moe_intermediate_size = 3;
  c.shared_expert_intermediate_size = 3;
  c.mlp_only_layers = {};
  c.layer_types = {"full_attention"};
  FlintModel model(c);
  TensorMap hf = model.to_hf(TensorMap::zeros_like(model.specs()));
  auto set = [&](const std::string& name, std::vector<float> v) {
    const Tensor& t = hf.at(name);
    REQUIRE(static_cast<std::int64_t>(v.size()) == t.numel());
    std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  };
  const std::string p = "model.layers.0.";
  set(p + "mlp.experts.1.gate_proj.weight", {1, 2, 3, 4, 5, 6});        // [I=3, H=2]
  set(p + "mlp.experts.1.up_proj.weight", {10, 20, 30, 40, 50, 60});    // [3, 2]
  set(p + "mlp.experts.1.down_proj.weight", {7, 8, 9, 70, 80, 90});     // [H=2, I=3]
  set(p + "self_attn.softmax_offset", {-2.5f});
  set(p + "mlp.shared_expert.gate_proj.weight", {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f});
  set(p + "mlp.shared_expert.down_proj.weight", {-1, -2, -3, -4, -5, -6});
  TensorMap native = model.from_hf(hf);
  const Tensor gu = native.at(p + "mlp.experts.gate_and_up_projs");
  REQUIRE(gu.shape() == Shape{2, 2, 6});
  // Expert 1, row h = [gate[:, h] | up[:, h]]: the gate half first. Expert 0 stays zero.
  const std::vector<float> all = values(gu);
  CHECK(std::vector<float>(all.begin(), all.begin() + 12) == std::vector<float>(12, 0.0f));
  CHECK(std::vector<float>(all.begin() + 12, all.end()) ==
        std::vector<float>{1, 3, 5, 10, 30, 50, 2, 4, 6, 20, 40, 60});
  const std::vector<float> down = values(native.at(p + "mlp.experts.down_projs"));  // [E, I, H]
  CHECK(std::vector<float>(down.begin() + 6, down.end()) == std::vector<float>{7, 70, 8, 80, 9, 90});
  CHECK(values(native.at(p + "self_attn._fp32_params.sinks")) == std::vector<float>{-2.5f});
  CHECK(values(native.at(p + "mlp.shared_experts.gate_proj.weight")) ==
        std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f});
  CHECK(values(native.at(p + "mlp.shared_experts.down_proj.weight")) == std::vector<float>{-1, -2, -3, -4, -5, -6});
}

TEST_CASE("Flint in bf16 tracks fp32: the loss within 5% of what the model adds to a uniform guess, the same "
          "experts, every gradient aligned", "[flint][bf16]") {
  // Measured: loss 1.2% of the excess, experts 97.5% the same, worst cosine 0.98.
  testing::check_bf16_tracks_fp32(FlintModel(flint_preset("flint-tiny")), 0.95);
}

TEST_CASE("Flint config from a run config: family flint, overrides checked by name", "[flint][config]") {
  const std::string base = "model: {family: flint, preset: flint-tiny";
  auto model_of = [](const std::string& yaml) {
    const RunConfig rc = parse_run_config(yaml + "}\ntrain: {steps: 1, global_batch: 2, micro_batch: 1, seq_len: 32, lr: 1.0e-3}\n",
                                          "flint.yaml");
    return make_model(rc.model, rc.source_file);
  };
  auto m = model_of(base + ", num_experts_per_tok: 1, norm_topk_prob: true");
  CHECK(m->family() == "flint");
  CHECK(m->preset() == "flint-tiny");
  CHECK(dynamic_cast<const FlintModel&>(*m).config().num_experts_per_tok == 1);
  CHECK(dynamic_cast<const FlintModel&>(*m).config().norm_topk_prob);
  CHECK_THROWS_WITH(model_of(base + ", mlp_only_layers: [0, 6]"), Catch::Contains("model.mlp_only_layers"));
  CHECK_THROWS_WITH(model_of(base + ", n_routed_experts: 4"), Catch::Contains("model.n_routed_experts"));
  CHECK_THROWS_WITH(model_of(base + ", layer_types: [full_attention]"), Catch::Contains("model.layer_types"));
  CHECK_THROWS_WITH(model_of("model: {family: flint, preset: beam-tiny-moe"), Catch::Contains("model.preset"));
}

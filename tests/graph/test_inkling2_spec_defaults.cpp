// MODELS.md §10.2.5 for Inkling2, read from the model make_model builds for the inkling2-tiny
// preset and from Inkling2Config: "L2 clip: fp32 over each head vector, then rounded; scales are per
// channel and shared by heads (`[D]`, `[dr]`); radii `√D`, `√D`, `√dr`; `k_l2_clip` has no scale."
// (q and k clip to √D, r to √dr; inkling2-tiny has D = 16, dr = 8, §4.)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "graph/config.hpp"
#include "graph/models/inkling2/config.hpp"
#include "graph/models/inkling2/model.hpp"
#include "graph/models/model.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using checkpoint_testing::same_bits;

namespace {

ModelSection tiny_section(const YAML::Node& overrides = YAML::Node(YAML::NodeType::Map)) {
  ModelSection s;
  s.family = "inkling2";
  s.preset = "inkling2-tiny";
  s.overrides = overrides;
  return s;
}

const Inkling2Config& config_of(const Model& model) { return dynamic_cast<const Inkling2Model&>(model).config(); }

const ParamSpec* find_spec(const Model& model, const std::string& name) {
  for (const ParamSpec& s : model.specs())
    if (s.name == name) return &s;
  return nullptr;
}

// The fp32 logits of `model` on a fixed batch, with weights whose q, k and r projections are
// 1000x their init: ‖q‖, ‖k‖ and ‖r‖ are then in the hundreds, so all three clips are active
// (radius < norm) whatever the radius within [1, 16], and the logits depend on the radii.
Tensor clipped_logits(const Model& model) {
  const Inkling2Config& c = config_of(model);
  TensorMap w = TensorMap::initialized(model.specs(), 31, c.init_std);
  const std::int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim, H = c.hidden_size;
  const std::int64_t q0 = 0, k0 = Hq * D, r0 = Hq * D + 2 * Hkv * D;  // §10.2.2 row blocks q | k | v | r | taps
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    float* qkvr = w.at(Inkling2Model::layer_prefix(l) + "self_attn.qkvr.weight").data<float>();
    auto scale_rows = [&](std::int64_t first, std::int64_t count) {
      for (std::int64_t i = first * H; i < (first + count) * H; ++i) qkvr[i] *= 1000.0f;
    };
    scale_rows(q0, Hq * D);
    scale_rows(k0, Hkv * D);
    scale_rows(r0, Hq * c.d_rel);
  }
  Tensor logits;
  model.forward(w, testing::synthetic_batch(2, 24, 5), Precision::fp32, &logits);
  return logits;
}

}  // namespace

TEST_CASE("Inkling2 10.2.5: the default L2-clip radii are sqrt(D) for q and k and sqrt(dr) for r",
          "[inkling2][spec][l2_clip]") {
  const std::shared_ptr<const Model> model = make_model(tiny_section(), "spec.yaml");
  const Inkling2Config& c = config_of(*model);
  REQUIRE(c.head_dim == 16);  // §4 inkling2-tiny: 4/2 heads x 16
  REQUIRE(c.d_rel == 8);      // §4 inkling2-tiny: dr = 8
  const float sqrt_d = std::sqrt(16.0f), sqrt_dr = std::sqrt(8.0f);

  SECTION("the config the model was built from") {
    // §10.2.5 radius √D for q. Catches a default of √dr, D, 1 or any other constant.
    CHECK(c.radius_q() == sqrt_d);
    // §10.2.5 radius √D for k (not √dr: the k clip acts on D-wide head vectors).
    CHECK(c.radius_k() == sqrt_d);
    // §10.2.5 radius √dr for r. Catches √D (= 4 here, != 2.83) or dr.
    CHECK(c.radius_r() == sqrt_dr);
    // The struct's own defaults (inkling2-tiny is the default-constructed config).
    const Inkling2Config plain;
    CHECK(plain.radius_q() == std::sqrt(static_cast<float>(plain.head_dim)));
    CHECK(plain.radius_k() == std::sqrt(static_cast<float>(plain.head_dim)));
    CHECK(plain.radius_r() == std::sqrt(static_cast<float>(plain.d_rel)));
    // The defaults follow D and dr rather than being inkling2-tiny's numbers: catches hard-coded 4 / 2.83,
    // and √dr and √D swapped (D = 32 and dr = 5 give different radii from the tiny ones and each other).
    Inkling2Config wide = c;
    wide.head_dim = 32;
    wide.d_rel = 5;
    CHECK(wide.radius_q() == std::sqrt(32.0f));
    CHECK(wide.radius_k() == std::sqrt(32.0f));
    CHECK(wide.radius_r() == std::sqrt(5.0f));
    // Every preset (inkling2-tiny-deep, inkling2-mini) has the same rule.
    for (const std::string& name : inkling2_preset_names()) {
      INFO(name);
      const Inkling2Config p = inkling2_preset(name);
      CHECK(p.radius_q() == std::sqrt(static_cast<float>(p.head_dim)));
      CHECK(p.radius_k() == std::sqrt(static_cast<float>(p.head_dim)));
      CHECK(p.radius_r() == std::sqrt(static_cast<float>(p.d_rel)));
    }
  }

  SECTION("the radii the model exports in config.json") {
    // §10.2.5 radii as the HF config records them. Catches exporting the raw 0 ("use the default")
    // field, or a radius other than √D / √D / √dr.
    const nlohmann::json hf = model->hf_config();
    CHECK(hf.at("l2_clip_radius_q").get<float>() == sqrt_d);
    CHECK(hf.at("l2_clip_radius_k").get<float>() == sqrt_d);
    CHECK(hf.at("l2_clip_radius_r").get<float>() == sqrt_dr);
  }

  SECTION("the radii the model's forward pass clips to") {
    // The default model's logits equal, bit for bit, those of a model told the spec radii
    // explicitly, while a model told another radius for any one clip gives other logits (so the
    // clips are active and each radius is wired to its clip). Catches the forward pass using a
    // radius other than √D for q or k or √dr for r (e.g. radius_r() passed to the k clip, a
    // default of √dr for q), and a configured radius the forward pass ignores.
    const Tensor by_default = clipped_logits(*model);
    auto with_radius = [&](const char* key, float radius) {
      YAML::Node overrides(YAML::NodeType::Map);
      overrides[key] = radius;
      const std::shared_ptr<const Model> m = make_model(tiny_section(overrides), "spec.yaml");
      return m;
    };
    const std::shared_ptr<const Model> explicit_q = with_radius("l2_clip_radius_q", sqrt_d);
    const std::shared_ptr<const Model> explicit_k = with_radius("l2_clip_radius_k", sqrt_d);
    const std::shared_ptr<const Model> explicit_r = with_radius("l2_clip_radius_r", sqrt_dr);
    REQUIRE(config_of(*explicit_q).l2_clip_radius_q == sqrt_d);  // the override arrived unrounded
    REQUIRE(config_of(*explicit_k).l2_clip_radius_k == sqrt_d);
    REQUIRE(config_of(*explicit_r).l2_clip_radius_r == sqrt_dr);
    CHECK(same_bits(by_default, clipped_logits(*explicit_q)));  // q clips to √D by default
    CHECK(same_bits(by_default, clipped_logits(*explicit_k)));  // k clips to √D by default
    CHECK(same_bits(by_default, clipped_logits(*explicit_r)));  // r clips to √dr by default
    CHECK_FALSE(same_bits(by_default, clipped_logits(*with_radius("l2_clip_radius_q", 4.5f))));
    CHECK_FALSE(same_bits(by_default, clipped_logits(*with_radius("l2_clip_radius_k", 4.5f))));
    CHECK_FALSE(same_bits(by_default, clipped_logits(*with_radius("l2_clip_radius_r", 3.0f))));
  }
}

TEST_CASE("Inkling2 10.2.5: clip scales are per channel and shared by heads, q [D] and r [dr], k has none",
          "[inkling2][spec][l2_clip]") {
  const std::shared_ptr<const Model> model = make_model(tiny_section(), "spec.yaml");
  const Inkling2Config& c = config_of(*model);
  REQUIRE(c.num_hidden_layers == 4);  // local layers 0..2 and full layer 3 (§4): both kinds checked
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = Inkling2Model::layer_prefix(l) + "self_attn.";
    INFO("layer " << l << (c.is_local(l) ? " (local)" : " (full)"));
    const ParamSpec* q_scale = find_spec(*model, p + "q_l2_clip.scale");
    const ParamSpec* r_scale = find_spec(*model, p + "rel_l2_clip.scale");
    REQUIRE(q_scale != nullptr);
    REQUIRE(r_scale != nullptr);
    // §10.2.5 q scale [D] (= [16]): one per channel, shared by the heads. Catches [Hq*D] (= [64],
    // per head), [Hq, D], [dr] or a scalar.
    CHECK(q_scale->shape == Shape{c.head_dim});
    // §10.2.5 r scale [dr] (= [8]). Catches [Hq*dr] (= [32]), [D] or a scalar.
    CHECK(r_scale->shape == Shape{c.d_rel});
    // §10.1.13 "ones for ... clip scales" and §1.2/§1.6 (fp32 islands). Catches normal/zeros init or
    // a bulk (bf16) scale.
    CHECK(q_scale->init == Init::ones);
    CHECK(r_scale->init == Init::ones);
    CHECK(q_scale->island);
    CHECK(r_scale->island);
    // §10.2.5 "`k_l2_clip` has no scale" (§1.2: k_l2_clip has no parameters). Catches a
    // k_l2_clip.scale in this layer.
    CHECK(find_spec(*model, p + "k_l2_clip.scale") == nullptr);
  }
  // Nor any other k_l2_clip tensor anywhere (a differently named scale or weight).
  for (const ParamSpec& s : model->specs()) {
    INFO(s.name);
    CHECK(s.name.find("k_l2_clip") == std::string::npos);
  }
}

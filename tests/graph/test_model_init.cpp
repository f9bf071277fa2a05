// MODELS.md §10.1.13 (binding): the initial weights of a fresh run, for every family.
//   N(0, init_std): embeddings, every projection, relative tables, conv taps, router weights, experts, heads;
//   ones:           norm gammas and clip scales;
//   zeros:          depth queries, router bias, sinks and output-gate biases.
// Weights are generated as the trainer generates them (graph/training/run.cpp, make_reference_engine):
// TensorMap::initialized(specs, train.seed, model->init_std()).
//
// Open point, not tested either way: Inkling2's sink is the last column of self_attn.relative_table
// (§10.2.4), so it is drawn with the table (N(0, init_std)); §10.1.13's "zeros for ... sinks" is read
// here as Flint's sink parameters (self_attn._fp32_params.sinks, §10.3.1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "graph/config.hpp"
#include "graph/models/model.hpp"
#include "graph/param.hpp"

using namespace atl;

namespace {

constexpr std::uint64_t kSeed = 0;  // train.seed's default

// The kinds §10.1.13 names, told by the parameter name.
enum class Kind {
  embedding, projection, relative_table, conv_taps, router_weight, experts, head,  // N(0, init_std)
  norm_gamma, clip_scale,                                                          // ones
  depth_query, router_bias, sink, gate_bias,                                       // zeros
  unknown
};
constexpr const char* kKindNames[] = {"embedding",  "projection", "relative_table", "conv_taps", "router_weight",
                                      "experts",    "head",       "norm_gamma",     "clip_scale", "depth_query",
                                      "router_bias", "sink",      "gate_bias",      "unknown"};
const char* kind_name(Kind k) { return kKindNames[static_cast<int>(k)]; }

Kind kind_of(const std::string& n) {
  auto ends = [&n](const char* suffix) { return n.ends_with(suffix); };
  if (ends("embed_tokens.weight")) return Kind::embedding;
  if (ends("lm_head.weight")) return Kind::head;
  if (ends("mlp.gate.weight")) return Kind::router_weight;
  if (ends("mlp.gate.e_score_correction_bias")) return Kind::router_bias;
  if (ends("mlp.experts.gate_and_up_projs") || ends("mlp.experts.down_projs")) return Kind::experts;
  if (ends("self_attn.relative_table")) return Kind::relative_table;
  if (ends("sconv.weight")) return Kind::conv_taps;  // k_sconv, v_sconv (static), attn_sconv, mlp_sconv
  // q/k/v/o, output_gate_proj, dense and shared-expert MLPs; qkvr includes Inkling2's dynamic-tap rows.
  if (ends("_proj.weight") || ends("self_attn.qkvr.weight") || ends("self_attn.wo_ud.weight") ||
      ends("self_attn.gate.weight")) {
    return Kind::projection;
  }
  if (ends("norm.weight") || n.find(".attn_norms.") != std::string::npos) return Kind::norm_gamma;
  if (ends("_l2_clip.scale")) return Kind::clip_scale;
  if (ends("_query.weight")) return Kind::depth_query;  // attn_query, mlp_query, output_query
  if (ends("self_attn._fp32_params.sinks")) return Kind::sink;
  if (ends("self_attn.output_gate_bias")) return Kind::gate_bias;
  return Kind::unknown;
}

// §10.1.13 for a kind.
Init rule(Kind k) {
  switch (k) {
    case Kind::norm_gamma:
    case Kind::clip_scale: return Init::ones;
    case Kind::depth_query:
    case Kind::router_bias:
    case Kind::sink:
    case Kind::gate_bias: return Init::zeros;
    default: return Init::normal;
  }
}

struct Case {
  const char* family;
  const char* preset;
  const char* extra;          // further model overrides, "key: value, ..." ("" for none)
  std::vector<Kind> must_have;  // kinds the model declares (so no rule is checked vacuously)
  const char* declares = "";      // a name part the extra overrides add (so an ignored override shows)
};

// Every tiny preset, plus the optional parameters the presets leave off (Beam's shared expert,
// Inkling2's attention gate), so every name a family can declare goes through the rules.
const std::vector<Case> kCases = {
    {"beam", "beam-tiny-moe", "",
     {Kind::embedding, Kind::projection, Kind::router_weight, Kind::experts, Kind::head, Kind::norm_gamma,
      Kind::router_bias, Kind::gate_bias}},
    {"beam", "beam-tiny-moe", "n_shared_experts: 1",
     {Kind::embedding, Kind::projection, Kind::router_weight, Kind::experts, Kind::head, Kind::norm_gamma,
      Kind::router_bias, Kind::gate_bias},
     "mlp.shared_experts."},
    {"beam", "beam-tiny-dense", "",
     {Kind::embedding, Kind::projection, Kind::head, Kind::norm_gamma, Kind::gate_bias}},
    {"flint", "flint-tiny", "",
     {Kind::embedding, Kind::projection, Kind::router_weight, Kind::experts, Kind::head, Kind::norm_gamma,
      Kind::sink}},
    {"inkling2", "inkling2-tiny", "",
     {Kind::embedding, Kind::projection, Kind::relative_table, Kind::conv_taps, Kind::router_weight, Kind::experts,
      Kind::head, Kind::norm_gamma, Kind::clip_scale, Kind::depth_query, Kind::router_bias}},
    {"inkling2", "inkling2-tiny-deep", "",
     {Kind::embedding, Kind::projection, Kind::relative_table, Kind::conv_taps, Kind::router_weight, Kind::experts,
      Kind::head, Kind::norm_gamma, Kind::clip_scale, Kind::depth_query, Kind::router_bias}},
    {"inkling2", "inkling2-tiny", "use_attention_gate: true",
     {Kind::embedding, Kind::projection, Kind::relative_table, Kind::conv_taps, Kind::router_weight, Kind::experts,
      Kind::head, Kind::norm_gamma, Kind::clip_scale, Kind::depth_query, Kind::router_bias},
     "self_attn.gate.weight"},
};

// The model a run config's `model:` section would give; init_std (YAML text) overrides the preset's.
std::shared_ptr<const Model> build(const Case& c, const std::string& init_std = "") {
  std::string text = c.extra;
  if (!init_std.empty()) text += (text.empty() ? "" : ", ") + std::string("init_std: ") + init_std;
  ModelSection section;
  section.family = c.family;
  section.preset = c.preset;
  section.overrides = YAML::Load("{" + text + "}");
  return make_model(section, "test_model_init.yaml");
}

std::string label(const Case& c) { return std::string(c.preset) + " {" + c.extra + "}"; }

struct Moments {
  double mean = 0, std = 0, max_abs = 0;
  bool finite = true;
};

Moments moments_of(const float* x, std::int64_t n) {
  Moments m;
  double sum = 0, squares = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    m.finite = m.finite && std::isfinite(x[i]);
    sum += x[i];
    m.max_abs = std::max(m.max_abs, std::fabs(static_cast<double>(x[i])));
  }
  m.mean = sum / static_cast<double>(n);
  for (std::int64_t i = 0; i < n; ++i) squares += (x[i] - m.mean) * (x[i] - m.mean);
  m.std = std::sqrt(squares / static_cast<double>(n));
  return m;
}

}  // namespace

// Catches: a spec declaring the wrong init (e.g. output_gate_bias or sinks normal, a norm gamma
// zeros, depth queries normal as in Kimi-K3, a router weight ones), and a new parameter name that no
// §10.1.13 rule covers (Kind::unknown), and a family without a case here.
TEST_CASE("Init: every parameter's spec declares the init MODELS.md 10.1.13 gives its kind", "[init]") {
  std::set<std::string> families;
  for (const Case& c : kCases) {
    INFO(label(c));
    const auto model = build(c);
    families.insert(c.family);
    std::set<Kind> kinds;
    bool declared = false;
    for (const ParamSpec& s : model->specs()) {
      declared = declared || s.name.find(c.declares) != std::string::npos;
      const Kind k = kind_of(s.name);
      INFO(s.name << " (" << kind_name(k) << ")");
      CHECK(k != Kind::unknown);
      CHECK(s.init == rule(k));
      kinds.insert(k);
    }
    for (Kind k : c.must_have) {
      INFO("declares a " << kind_name(k));
      CHECK(kinds.count(k) == 1);
    }
    INFO("declares " << c.declares);
    CHECK(declared);
  }
  for (const std::string& family : model_families()) {
    INFO(family);
    CHECK(families.count(family) == 1);
  }
}

// Catches: the generator ignoring a spec's init (ones and zeros swapped, a constant drawn at
// random, a constant filled with init_std), or a tensor of the wrong shape.
TEST_CASE("Init: generated ones and zeros tensors are exactly 1 and exactly 0, as the spec says", "[init]") {
  for (const Case& c : kCases) {
    INFO(label(c));
    const auto model = build(c);
    const TensorMap w = TensorMap::initialized(model->specs(), kSeed, model->init_std());
    REQUIRE(w.names().size() == model->specs().size());
    int ones = 0, zeros = 0;
    for (const ParamSpec& s : model->specs()) {
      INFO(s.name);
      const Tensor& t = w.at(s.name);
      CHECK(t.shape() == s.shape);
      if (s.init == Init::normal) continue;
      const float want = s.init == Init::ones ? 1.0f : 0.0f;
      const float* x = t.data<float>();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < s.numel(); ++i) wrong += x[i] != want ? 1 : 0;
      CHECK(wrong == 0);
      ++(s.init == Init::ones ? ones : zeros);
    }
    CHECK(ones > 0);   // norm gammas
    CHECK(zeros > 0);  // gate biases, router biases, sinks or depth queries
  }
}

// Statistics, and why they are safe. For n i.i.d. N(0, σ) values the sample std has a relative
// standard error of about 1/sqrt(2n) and the sample mean a standard error of σ/sqrt(n).
//  - Tensors with n >= 4096 (not 2000): a 5% std band is >= 4.5 standard errors (two-sided
//    p ~ 7e-6 per tensor, ~1e-3 over the ~150 tensors below); |mean| <= 0.1σ is >= 6.4 errors.
//    At n = 2048 the 5% band is only 3.2 errors (p ~ 1.4e-3 per tensor): too tight for ~150 tensors.
//  - The smaller normal tensors of a model, pooled (n >= 2000): std within 10% (>= 6 errors), so
//    the small tensors (routers, tables, conv taps) follow init_std too.
//  - Every normal tensor: finite, |x| <= 7σ (p ~ 2.6e-12 per element) and std >= 0.1σ (the
//    smallest, 8 taps, falls below that with p ~ 1e-6).
// Catches: init_std not taken from the config (the 0.05 run would show std 0.02), a fixed or
// wrong scale (std 1, std² instead of std), a biased or non-centred draw (uniform [0, σ]), a
// normal tensor left zero or filled with ones.
TEST_CASE("Init: normal tensors are N(0, init_std) with init_std taken from the model config", "[init]") {
  constexpr std::int64_t kLarge = 4096;
  struct StdCase {
    const char* override_text;  // "" = the preset's
    double sigma;
  };
  // 0.02: the tiny presets' init_std (MODELS.md §4); 0.05 set through the model overrides.
  for (const StdCase& sc : {StdCase{"", 0.02}, StdCase{"0.05", 0.05}}) {
    for (const Case& c : kCases) {
      INFO(label(c) << ", init_std " << sc.sigma);
      const auto model = build(c, sc.override_text);
      const double sigma = sc.sigma;
      CHECK(model->init_std() == Approx(sigma));
      const TensorMap w = TensorMap::initialized(model->specs(), kSeed, model->init_std());
      std::vector<float> pool;
      int large = 0;
      for (const ParamSpec& s : model->specs()) {
        if (s.init != Init::normal) continue;
        INFO(s.name);
        const float* x = w.at(s.name).data<float>();
        const Moments m = moments_of(x, s.numel());
        CHECK(m.finite);
        CHECK(m.max_abs <= 7 * sigma);
        CHECK(m.std >= 0.1 * sigma);
        if (s.numel() >= kLarge) {
          ++large;
          CHECK(std::fabs(m.mean) <= 0.1 * sigma);
          CHECK(std::fabs(m.std / sigma - 1) <= 0.05);
        } else {
          pool.insert(pool.end(), x, x + s.numel());
        }
      }
      CHECK(large >= 3);
      REQUIRE(pool.size() >= 2000u);
      const Moments p = moments_of(pool.data(), static_cast<std::int64_t>(pool.size()));
      CHECK(std::fabs(p.mean) <= 0.1 * sigma);
      CHECK(std::fabs(p.std / sigma - 1) <= 0.10);
    }
  }
}

// "N(0, init_std)" per tensor means independent draws: two layers' projections must not be the
// same values, and a run's seed decides them (graph/param.hpp: a pure function of seed, name, index).
// Catches: a stream keyed by the seed only (every same-shaped tensor identical, which the
// statistics above would not see), a seed that is ignored, or a generator that is not deterministic.
TEST_CASE("Init: each normal tensor is its own draw, fixed by the seed", "[init]") {
  for (const Case& c : kCases) {
    INFO(label(c));
    const auto model = build(c);
    const auto& specs = model->specs();
    const TensorMap a = TensorMap::initialized(specs, kSeed, model->init_std());
    const TensorMap again = TensorMap::initialized(specs, kSeed, model->init_std());
    const TensorMap other = TensorMap::initialized(specs, kSeed + 1, model->init_std());
    std::set<std::vector<float>> starts;  // the first values of each normal tensor
    for (const ParamSpec& s : specs) {
      if (s.init != Init::normal) continue;
      INFO(s.name);
      const float* x = a.at(s.name).data<float>();
      CHECK(std::equal(x, x + s.numel(), again.at(s.name).data<float>()));
      CHECK_FALSE(std::equal(x, x + s.numel(), other.at(s.name).data<float>()));
      CHECK(starts.insert(std::vector<float>(x, x + std::min<std::int64_t>(4, s.numel()))).second);
    }
  }
}

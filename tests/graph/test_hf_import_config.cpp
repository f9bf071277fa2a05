// The HF import reads back every model setting an export writes (config.json alone rebuilds the
// model that wrote it, for each family, non-preset settings included), and takes weights as HF
// files hold them: F32 and BF16 mixed, even among one layer's experts.
#include <cmath>

#include <catch2/catch.hpp>
#include <yaml-cpp/yaml.h>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/hf_export.hpp"
#include "graph/checkpoint/hf_import_config.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/models/model.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using checkpoint_testing::TempDir;
using checkpoint_testing::write_bytes;

namespace {

std::shared_ptr<const Model> model_with(const std::string& family, const std::string& overrides) {
  ModelSection section;
  section.family = family;
  section.overrides = YAML::Load("{family: " + family + (overrides.empty() ? "" : ", " + overrides) + "}");
  return make_model(section, "run.yaml");
}

}  // namespace

TEST_CASE("hf import config: config.json alone rebuilds the exporting model, non-preset settings included",
          "[checkpoint]") {
  for (const std::string& family : model_families()) {
    INFO(family);
    const nlohmann::json written = model_with(family, "init_std: 0.013, rms_norm_eps: 2.0e-6")->hf_config();
    REQUIRE(written.at("initializer_range").dump() == "0.013");
    REQUIRE(written.at("rms_norm_eps") != model_with(family, "")->hf_config().at("rms_norm_eps"));
    TempDir dir;
    write_bytes(dir.path / "config.json", written.dump(2));

    std::vector<std::string> ignored;
    const RunConfig imported = hf_import_config(dir.path, std::nullopt, &ignored);
    CHECK(make_model(imported.model, imported.source_file)->hf_config() == written);
    CHECK(ignored.empty());
  }
}

TEST_CASE("hf import config: a bad initializer_range is named as config.json writes it", "[checkpoint]") {
  nlohmann::json written = model_with("beam", "")->hf_config();
  written["initializer_range"] = -1.0;
  TempDir dir;
  write_bytes(dir.path / "config.json", written.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, std::nullopt, nullptr),
                    Catch::Contains("init_std") && Catch::Contains("config.json's initializer_range"));
}

TEST_CASE("hf import config: a field of the wrong JSON type says what type was expected", "[checkpoint]") {
  nlohmann::json written = model_with("beam", "")->hf_config();
  written["hidden_size"] = "64";
  TempDir dir;
  write_bytes(dir.path / "config.json", written.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, std::nullopt, nullptr),
                    Catch::Contains("config.json: hidden_size: expected a JSON number, got the string \"64\""));
  written["hidden_size"] = 64;
  written["norm_topk_prob"] = "true";
  write_bytes(dir.path / "config.json", written.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, std::nullopt, nullptr),
                    Catch::Contains("config.json: norm_topk_prob: expected a JSON boolean, got the string \"true\""));
  nlohmann::json flint = model_with("flint", "")->hf_config();  // a list element, named as in the file
  flint["mlp_only_layers"] = {0, "1"};
  write_bytes(dir.path / "config.json", flint.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, std::nullopt, nullptr),
                    Catch::Contains("config.json: mlp_only_layers[1]: expected a JSON number, got the string \"1\""));
  flint["mlp_only_layers"] = {0, 1};
  flint["layer_types"] = "x";  // a list expected: said so, not "a JSON number"
  write_bytes(dir.path / "config.json", flint.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, std::nullopt, nullptr),
                    Catch::Contains("layer_types: expected a list") && !Catch::Contains("JSON number"));
}

namespace {

// config.json `fields` in a fresh folder, read back by the import (no --config).
RunConfig import_fields(const nlohmann::json& fields) {
  TempDir dir;
  write_bytes(dir.path / "config.json", fields.dump(2));
  return hf_import_config(dir.path, std::nullopt, nullptr);
}
nlohmann::json imported_hf(const nlohmann::json& fields) {
  const RunConfig c = import_fields(fields);
  return make_model(c.model, c.source_file)->hf_config();
}
std::string import_error(const nlohmann::json& fields) {
  try {
    import_fields(fields);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(imported)";
}

}  // namespace

// Without atoll_preset, a field the file leaves out would be the family's default preset's (tiny
// sizes and choices), silently: refused, except those with an HF meaning when absent.
TEST_CASE("hf import config: without atoll_preset, fields left out are refused or take their HF meaning",
          "[checkpoint]") {
  for (const std::string& family : model_families()) {
    INFO(family);
    nlohmann::json foreign = model_with(family, "")->hf_config();
    foreign.erase("atoll_preset");
    foreign.erase("initializer_range");  // init only: may be left out
    REQUIRE(import_error(foreign) == "(imported)");
    nlohmann::json lacking = foreign;
    lacking.erase("rms_norm_eps");
    lacking.erase("num_experts_per_tok");
    CHECK_THAT(import_error(lacking), Catch::Contains("config.json: ") &&
                                          Catch::Contains("num_experts_per_tok, rms_norm_eps: missing") &&
                                          Catch::Contains("--config"));
    // The usable vocabulary is the whole vocabulary (HF configs do not write one), and no softcap.
    nlohmann::json plain = foreign;
    plain.erase("unpadded_vocab_size");
    const bool softcapped = family != "flint";
    if (softcapped) plain.erase("final_logit_softcapping");
    const nlohmann::json got = imported_hf(plain);
    CHECK(got.at("unpadded_vocab_size") == got.at("vocab_size"));
    if (softcapped) CHECK(got.at("final_logit_softcapping").is_null());
    // With the preset named, the preset fills them in.
    CHECK(imported_hf(model_with(family, "")->hf_config()).at("unpadded_vocab_size") == 250);
  }
}

TEST_CASE("hf import config: a softcap of null or 0 is none, written as null", "[checkpoint]") {
  for (const std::string family : {"beam", "inkling2"}) {
    INFO(family);
    const nlohmann::json none = model_with(family, "final_logit_softcapping: 0")->hf_config();
    CHECK(none.at("final_logit_softcapping").is_null());  // HF code divides by any non-None cap
    CHECK(model_with(family, "")->hf_config().at("final_logit_softcapping") == 30.0);
    CHECK(imported_hf(none) == none);  // null read back as no softcap, the preset named or not
    nlohmann::json foreign = none;
    foreign.erase("atoll_preset");
    foreign.erase("initializer_range");
    CHECK(imported_hf(foreign).at("final_logit_softcapping").is_null());
    nlohmann::json zero = none;
    zero["final_logit_softcapping"] = 0;
    CHECK(imported_hf(zero).at("final_logit_softcapping").is_null());
  }
}

TEST_CASE("hf import config: rope_parameters is read as rope_theta, or refused when it is another RoPE",
          "[checkpoint]") {
  for (const std::string family : {"beam", "flint"}) {
    INFO(family);
    nlohmann::json base = model_with(family, "")->hf_config();
    base.erase("rope_theta");
    nlohmann::json plain = base;
    plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    CHECK(imported_hf(plain).at("rope_theta") == 500000.0);
    nlohmann::json yarn = base;
    yarn["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 500000.0}, {"factor", 4.0}};
    // (Keys in order: "factor" is the first refused.)
    CHECK_THAT(import_error(yarn), Catch::Contains("config.json: rope_parameters: \"factor\": 4.0 in the file"));
    nlohmann::json both = plain;
    both["rope_theta"] = 10000.0;
    CHECK_THAT(import_error(both), Catch::Contains("rope_theta 10000.0 and rope_parameters' 500000.0 differ"));
  }
  nlohmann::json beam = model_with("beam", "")->hf_config();
  beam.erase("rope_theta");
  beam["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20000.0}}},
                             {"full_attention", nullptr}};
  CHECK(imported_hf(beam).at("rope_theta") == 20000.0);
  beam["rope_parameters"]["full_attention"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
  CHECK_THAT(import_error(beam), Catch::Contains("RoPE on full_attention layers") &&
                                     Catch::Contains("Beam's full layers have no RoPE"));
}

// Inkling2's clip radii default to sqrt(head_dim), sqrt(head_dim), sqrt(d_rel) (MODELS.md §1.1):
// null or absent in config.json means that default; against a run config with other radii it is
// refused.
TEST_CASE("hf import config: Inkling2's null or absent clip radii are the square-root defaults", "[checkpoint]") {
  const nlohmann::json written = model_with("inkling2", "")->hf_config();
  const double head_dim = written.at("head_dim").get<double>(), d_rel = written.at("d_rel").get<double>();
  REQUIRE(written.at("l2_clip_radius_q").get<float>() == std::sqrt(static_cast<float>(head_dim)));
  REQUIRE(written.at("l2_clip_radius_r").get<float>() == std::sqrt(static_cast<float>(d_rel)));
  nlohmann::json nulls = written;
  for (const char* key : {"l2_clip_radius_q", "l2_clip_radius_k", "l2_clip_radius_r"}) nulls[key] = nullptr;
  CHECK(imported_hf(nulls) == written);
  nlohmann::json foreign = nulls;
  foreign.erase("atoll_preset");
  foreign.erase("initializer_range");
  CHECK(imported_hf(foreign).at("l2_clip_radius_k") == written.at("l2_clip_radius_k"));
  foreign.erase("l2_clip_radius_q");  // absent: the same default
  CHECK(imported_hf(foreign).at("l2_clip_radius_q") == written.at("l2_clip_radius_q"));

  TempDir dir;
  write_bytes(dir.path / "config.json", nulls.dump(2));
  const RunConfig other = parse_run_config(
      "model: {family: inkling2, l2_clip_radius_q: 3.0}\n"
      "train: {steps: 1, global_batch: 1, micro_batch: 1, seq_len: 2, lr: 1.0e-3}\n",
      "run.yaml");
  CHECK_THROWS_WITH(hf_import_config(dir.path, other, nullptr),
                    Catch::Contains("config.json: l2_clip_radius_q: null (the default, sqrt(head_dim) = ") &&
                        Catch::Contains("but the model the run config describes has 3.0"));
  nlohmann::json absent = nulls;  // absent means the same default: refused alike (it imported 3.0)
  absent.erase("l2_clip_radius_q");
  write_bytes(dir.path / "config.json", absent.dump(2));
  CHECK_THROWS_WITH(hf_import_config(dir.path, other, nullptr),
                    Catch::Contains("config.json: l2_clip_radius_q: absent (the default, sqrt(head_dim) = ") &&
                        Catch::Contains("but the model the run config describes has 3.0"));
  // A radius that is not a number or null stays refused by type.
  nlohmann::json text = written;
  text["l2_clip_radius_r"] = "4";
  CHECK_THAT(import_error(text), Catch::Contains("l2_clip_radius_r: expected a JSON number"));
}

TEST_CASE("hf import config: switches that would remove a part atoll builds are refused", "[checkpoint]") {
  for (const char* key : {"ssmax", "attention_output_gate", "use_qk_norm", "use_sliding_window"}) {
    INFO(key);
    nlohmann::json written = model_with("beam", "")->hf_config();
    written[key] = true;
    CHECK(import_error(written) == "(imported)");
    written[key] = false;
    CHECK_THAT(import_error(written), Catch::Contains(std::string("config.json: ") + key + ": false in the file"));
  }
}

TEST_CASE("hf import: F32 and BF16 experts of one layer import as the F32 masters of their values, other dtypes "
          "are refused by their HF names",
          "[checkpoint]") {
  const auto model = model_with("beam", "");
  const TensorMap native = TensorMap::initialized(model->specs(), 5, 0.02f);
  const TensorMap hf = model->to_hf(native);
  const std::string bf16_expert = "model.layers.0.mlp.experts.3.up_proj.weight";
  TempDir dir;
  write_bytes(dir.path / "config.json", model->hf_config().dump(2));
  auto with = [&](const Tensor& changed) {  // the HF tensors, one expert weight changed
    TensorMap files;
    for (const auto& name : hf.names()) files.insert(name, name == bf16_expert ? changed : hf.at(name));
    return files;
  };
  const RunConfig config = hf_import_config(dir.path, std::nullopt, nullptr);

  const Tensor bf16 = hf.at(bf16_expert).to(DType::bf16);
  write_safetensors(dir.path / "model.safetensors", with(bf16));
  const CheckpointContents c = load_checkpoint(import_hf(dir.path, config, dir.path / "imported"));
  // The one BF16 expert holds its BF16 values, widened; every other weight is the file's F32, bit for bit.
  const TensorMap expected = model->from_hf(with(bf16.to(DType::f32)));
  for (const auto& s : model->specs()) {
    INFO(s.name);
    CHECK(c.model.at(s.name).dtype() == DType::f32);
    CHECK(checkpoint_testing::same_bits(c.model.at(s.name), expected.at(s.name)));
  }
  CHECK_FALSE(checkpoint_testing::same_bits(expected.at("model.layers.0.mlp.experts.gate_and_up_projs"),
                                            native.at("model.layers.0.mlp.experts.gate_and_up_projs")));

  write_safetensors(dir.path / "model.safetensors", with(Tensor::zeros(bf16.shape(), DType::i64)));
  CHECK_THROWS_WITH(import_hf(dir.path, config, dir.path / "refused"),
                    Catch::Contains("tensor '" + bf16_expert + "' is i64[") &&
                        Catch::Contains("weights must be F32 or BF16"));
}

// The HF import reads back every model setting an export writes (config.json alone rebuilds the
// model that wrote it, for each family, non-preset settings included), and takes weights as HF
// files hold them: F32 and BF16 mixed, even among one layer's experts.
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
                    Catch::Contains("config.json: hidden_size: expected a JSON number (the model built from it has 64), "
                                    "got the string \"64\""));
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

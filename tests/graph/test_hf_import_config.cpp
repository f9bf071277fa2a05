// The HF import reads back every model setting an export writes: config.json alone rebuilds the
// model that wrote it, for each family, including settings that are not the preset's.
#include <fstream>

#include <catch2/catch.hpp>
#include <yaml-cpp/yaml.h>

#include "graph/checkpoint/hf_import_config.hpp"
#include "graph/models/model.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using checkpoint_testing::TempDir;

TEST_CASE("hf import config: config.json alone rebuilds the exporting model, non-preset settings included",
          "[checkpoint]") {
  for (const std::string& family : model_families()) {
    INFO(family);
    ModelSection section;
    section.family = family;
    section.overrides = YAML::Load("{family: " + family + ", init_std: 0.013, rms_norm_eps: 2.0e-6}");
    const nlohmann::json written = make_model(section, "run.yaml")->hf_config();
    REQUIRE(written.at("initializer_range").dump() == "0.013");
    TempDir dir;
    std::ofstream(dir.path / "config.json") << written.dump(2);

    std::vector<std::string> ignored;
    const RunConfig imported = hf_import_config(dir.path, std::nullopt, &ignored);
    CHECK(make_model(imported.model, imported.source_file)->hf_config() == written);
    CHECK(ignored.empty());
  }
}

TEST_CASE("hf import config: a bad initializer_range is named as config.json writes it", "[checkpoint]") {
  ModelSection section;
  section.family = "beam";
  section.overrides = YAML::Load("{family: beam}");
  nlohmann::json written = make_model(section, "run.yaml")->hf_config();
  written["initializer_range"] = -1.0;
  TempDir dir;
  std::ofstream(dir.path / "config.json") << written.dump(2);
  try {
    hf_import_config(dir.path, std::nullopt, nullptr);
    FAIL("a negative initializer_range was imported");
  } catch (const std::exception& e) {
    CHECK_THAT(e.what(), Catch::Contains("init_std") && Catch::Contains("config.json's initializer_range"));
  }
}

// model_config_changes: how a checkpoint's config.json differs from a model in settings that keep
// the shapes (atoll-eval refuses them, checkpoint.load names them).
#include <catch2/catch.hpp>

#include "graph/checkpoint/model_weights.hpp"
#include "graph/models/beam/model.hpp"

namespace atl {

TEST_CASE("model_config_changes names changed settings, not numbers written another way", "[checkpoint]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  CheckpointContents checkpoint;
  checkpoint.model_config = model.hf_config();
  CHECK(model_config_changes(model, checkpoint).empty());
  // As builds before 2026-12 wrote floats (1e-6f widened to double), and HF writes integers as floats.
  checkpoint.model_config["rms_norm_eps"] = static_cast<double>(1e-6f);
  checkpoint.model_config["rope_theta"] = 10000;
  checkpoint.model_config["initializer_range"] = 0.5;     // the init scale: nothing loaded depends on it
  checkpoint.model_config["atoll_preset"] = "renamed";    // another name for the same model
  checkpoint.model_config["torch_dtype"] = "bfloat16";    // a key the model does not write
  checkpoint.model_config.erase("sliding_window");        // an older file without the key
  CHECK(model_config_changes(model, checkpoint).empty());
  checkpoint.model_config["rope_theta"] = 500000.0;
  checkpoint.model_config["num_experts_per_tok"] = 1;
  CHECK(model_config_changes(model, checkpoint) == "num_experts_per_tok 1 -> 2, rope_theta 500000.0 -> 10000.0");
}

}  // namespace atl

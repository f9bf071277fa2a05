// The `model:` section of a run config -> a validated BeamConfig (preset + overrides).
#pragma once
#include <string>

#include "graph/config.hpp"
#include "graph/models/beam/config.hpp"

namespace atl {

// Throws ConfigError naming `file` and the model.* key for an unknown family, preset or key,
// a wrong type, or an inconsistent result.
BeamConfig beam_config_from(const ModelSection& section, const std::string& file);

}  // namespace atl

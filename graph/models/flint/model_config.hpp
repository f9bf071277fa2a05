// The `model:` section of a run config -> a validated FlintConfig (preset + overrides).
#pragma once
#include <string>

#include "graph/config.hpp"
#include "graph/models/flint/config.hpp"

namespace atl {

// Throws ConfigError naming `file` and the model.* key for a wrong family, an unknown preset or
// key, a wrong type, or an inconsistent result.
FlintConfig flint_config_from(const ModelSection& section, const std::string& file);

}  // namespace atl

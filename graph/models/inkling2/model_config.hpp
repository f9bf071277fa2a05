// The `model:` section of a run config -> a validated Inkling2Config (preset + overrides).
#pragma once
#include <string>

#include "graph/config.hpp"
#include "graph/models/inkling2/config.hpp"

namespace atl {

// Throws ConfigError naming `file` and the model.* key for an unknown preset or key, a wrong type,
// or an inconsistent result (e.g. n_shared_experts > 0).
Inkling2Config inkling2_config_from(const ModelSection& section, const std::string& file);

}  // namespace atl

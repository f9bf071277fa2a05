// How two config.json values compare: the model's settings as the ecosystem and older atoll builds
// write them.
#pragma once
#include <nlohmann/json.hpp>

namespace atl {

// Numbers compare by value (HF writes 1e-06 where atoll writes 1e-6, or 10000 for 10000.0), and
// at float precision, as the model holds them: atoll before 2026-12 wrote 0.02f widened to double
// (0.019999999552965164), now the shortest form (0.02). Anything else compares exactly.
bool same_config_value(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace atl

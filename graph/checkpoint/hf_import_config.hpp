// Which model an HF directory holds, read from its config.json as the ecosystem writes it:
// model_type names the family, atoll_preset (when present) the preset, and every field that is
// also a model config key of the family (hidden_size, num_hidden_layers, ...) overrides it. Then
// every field the model itself would write to config.json must agree with the file; the first
// that does not is refused, named. A run config (atoll-convert import --config) may state the
// model instead; config.json must agree with it the same way.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "graph/config.hpp"

namespace atl {

// The run config to import `hf_dir` with: `given` (checked against config.json), or one built
// from config.json. Throws CheckpointError naming config.json and the field; a field the model
// does not write is refused too when it would change the model (rope_scaling, biases, dropout,
// hidden_act other than silu, ...). `ignored`: the other fields atoll does not use, less pure
// metadata (torch_dtype, token ids, transformers_version, ...), for the caller to name.
RunConfig hf_import_config(const std::filesystem::path& hf_dir, const std::optional<RunConfig>& given,
                           std::vector<std::string>* ignored = nullptr);

}  // namespace atl

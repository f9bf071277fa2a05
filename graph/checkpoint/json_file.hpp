// Reading the small text and JSON files of checkpoints and HF folders, with CheckpointError
// messages that name the file ("<file>: missing", "<file>: invalid JSON: ...").
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace atl {

std::string read_text_file(const std::filesystem::path& file);
nlohmann::json read_json_file(const std::filesystem::path& file);

}  // namespace atl

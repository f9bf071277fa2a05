#include "graph/checkpoint/json_file.hpp"

#include <fstream>
#include <sstream>

#include "graph/checkpoint/checkpoint_error.hpp"

namespace atl {

std::string read_text_file(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw CheckpointError(file.string() + ": missing");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError(file.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw CheckpointError(file.string() + ": read failed");
  return text.str();
}

nlohmann::json read_json_file(const std::filesystem::path& file) {
  const std::string text = read_text_file(file);
  try {
    return parse_json(text);
  } catch (const nlohmann::json::exception& e) {  // malformed or nested too deep
    throw CheckpointError(file.string() + ": invalid JSON: " + e.what());
  }
}

std::optional<nlohmann::json> json_if_readable(const std::filesystem::path& file) {
  try {
    return read_json_file(file);
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
}

nlohmann::json parse_json(std::string_view text, const JsonParseEvent& also) {
  return nlohmann::json::parse(text, [&also](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) throw JsonTooDeep();
    return also ? also(depth, event, parsed) : true;
  });
}

}  // namespace atl

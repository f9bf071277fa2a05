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
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(file.string() + ": invalid JSON: " + e.what());
  }
}

}  // namespace atl

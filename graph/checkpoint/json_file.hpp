// Reading the small text and JSON files of checkpoints and HF folders, with CheckpointError
// messages that name the file ("<file>: missing", "<file>: invalid JSON: ...").
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace atl {

std::string read_text_file(const std::filesystem::path& file);
nlohmann::json read_json_file(const std::filesystem::path& file);
// The file's JSON, or nullopt when it is missing, unreadable, malformed or nested too deep.
std::optional<nlohmann::json> json_if_readable(const std::filesystem::path& file);

// JSON input nests at most this deep. nlohmann parses and frees any depth without recursion, but
// dump(), comparisons and conversions recurse once per level: a 400 KB file nested 200,000 deep
// overflowed the stack when an error message quoted it.
inline constexpr int kMaxJsonDepth = 100;

// One of nlohmann's exceptions, so every handler of malformed JSON handles it too.
// (Its message is copied in: the temporary may go.)
struct JsonTooDeep : nlohmann::json::exception {
  JsonTooDeep() : exception(0, ("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels").c_str()) {}
};

// nlohmann::json::parse(text) that throws JsonTooDeep past kMaxJsonDepth; `also` (optional) sees
// every parse event as a parser callback would (its result decides whether the value is kept).
// Malformed text throws nlohmann's parse_error, as parse does: both are json::exception.
using JsonParseEvent = std::function<bool(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed)>;
nlohmann::json parse_json(std::string_view text, const JsonParseEvent& also = {});

}  // namespace atl

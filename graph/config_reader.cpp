#include "graph/config_reader.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace atl {

namespace {
std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}
}  // namespace

ConfigError::ConfigError(const std::string& file, const std::string& key, const std::string& problem)
    : std::runtime_error(key.empty() ? file + ": " + problem : file + ": " + key + ": " + problem),
      file_(file),
      key_(key),
      problem_(problem) {}

// ---------------------------------------------------------------------------------------------
// Scalars

std::optional<std::int64_t> parse_config_integer(const std::string& text) {
  std::string_view s = text;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t value = 0;
  auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (!s.empty() && error == std::errc() && end == s.data() + s.size()) return value;
  // Integral values written as numbers (1e6, 100.0) are fine while they are exact.
  if (auto number = parse_config_number(text); number && std::floor(*number) == *number && std::fabs(*number) <= 9007199254740992.0) {
    return static_cast<std::int64_t>(*number);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> parse_config_unsigned(const std::string& text) {
  std::string_view s = text;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::uint64_t value = 0;
  auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (!s.empty() && error == std::errc() && end == s.data() + s.size()) return value;
  if (auto v = parse_config_integer(text); v && *v >= 0) return static_cast<std::uint64_t>(*v);
  return std::nullopt;
}

std::optional<double> parse_config_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  // strtod also reads hex floats, "inf" and "nan"; only decimal finite numbers are config numbers.
  for (char c : text) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E')) {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> parse_config_bool(const std::string& text) {
  static const std::vector<std::string> truthy = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::vector<std::string> falsy = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (std::find(truthy.begin(), truthy.end(), text) != truthy.end()) return true;
  if (std::find(falsy.begin(), falsy.end(), text) != falsy.end()) return false;
  return std::nullopt;
}

bool is_explicit_string(const YAML::Node& scalar) {
  return scalar.Tag() == "!" || scalar.Tag() == "tag:yaml.org,2002:str";
}

nlohmann::json yaml_to_json(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return nullptr;
  if (node.IsMap()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& entry : node) out[entry.first.Scalar()] = yaml_to_json(entry.second);
    return out;
  }
  if (node.IsSequence()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : node) out.push_back(yaml_to_json(item));
    return out;
  }
  const std::string& text = node.Scalar();
  if (is_explicit_string(node)) return text;
  std::int64_t integer = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (!text.empty() && error == std::errc() && end == text.data() + text.size()) return integer;
  if (auto number = parse_config_number(text)) return *number;
  if (auto boolean = parse_config_bool(text)) return *boolean;
  return text;
}

// ---------------------------------------------------------------------------------------------
// ConfigReader

ConfigReader::ConfigReader(YAML::Node node, std::string file, std::string prefix)
    : node_(std::move(node)), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!node_.IsDefined() || node_.IsNull()) {
    node_ = YAML::Node(YAML::NodeType::Map);
  } else if (!node_.IsMap()) {
    throw ConfigError(file_, prefix_, "expected a mapping of keys, got " + describe_value(node_));
  }
}

std::string ConfigReader::path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

YAML::Node ConfigReader::lookup(const std::string& key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
  // Read through a const node: the non-const operator[] may insert the key.
  const YAML::Node& map = node_;
  YAML::Node value = map[key];
  if (!value.IsDefined() || value.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
  return value;
}

bool ConfigReader::has(const std::string& key) { return lookup(key).IsDefined(); }

void ConfigReader::allow(const std::string& key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
}

YAML::Node ConfigReader::node(const std::string& key) { return lookup(key); }

ConfigReader ConfigReader::section(const std::string& key) { return ConfigReader(lookup(key), file_, path(key)); }

std::vector<std::string> ConfigReader::keys() const {
  std::vector<std::string> out;
  for (const auto& entry : node_) out.push_back(entry.first.Scalar());
  return out;
}

std::int64_t ConfigReader::get_positive(const std::string& key, std::int64_t fallback) {
  std::optional<std::int64_t> value = optional<std::int64_t>(key);
  if (!value) return fallback;
  check(*value >= 1, key, "a positive integer");
  return *value;
}

std::int64_t ConfigReader::get_non_negative(const std::string& key, std::int64_t fallback) {
  std::optional<std::int64_t> value = optional<std::int64_t>(key);
  if (!value) return fallback;
  check(*value >= 0, key, "a non-negative integer");
  return *value;
}

std::string ConfigReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& choices) {
  std::optional<std::string> value = optional<std::string>(key);
  if (!value) return fallback;
  check(std::find(choices.begin(), choices.end(), *value) != choices.end(), key, "one of " + join(choices, ", "));
  return *value;
}

void ConfigReader::check(bool ok, const std::string& key, const std::string& expected) const {
  if (!ok) fail_expected(key, expected);
}

void ConfigReader::fail(const std::string& key, const std::string& problem) const {
  throw ConfigError(file_, path(key), problem);
}

void ConfigReader::fail_expected(const std::string& key, const std::string& expected) const {
  // The key may be an element ("layers[2]"): find its node by walking the path's list indices.
  const YAML::Node& map = node_;
  std::string base = key.substr(0, key.find('['));
  YAML::Node value = map[base];
  for (std::size_t open = key.find('['); open != std::string::npos && value.IsDefined(); open = key.find('[', open + 1)) {
    std::size_t index = std::strtoull(key.c_str() + open + 1, nullptr, 10);
    const YAML::Node& list = value;
    value.reset(list.IsSequence() && index < list.size() ? list[index] : YAML::Node(YAML::NodeType::Undefined));
  }
  fail(key, "expected " + expected + ", got " + describe_value(value));
}

void ConfigReader::finish() const {
  for (const auto& entry : node_) {
    const std::string key = entry.first.Scalar();
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
      throw UnknownKeyError(file_, path(key),
                            known_.empty() ? "unknown key (this section takes no keys)"
                                           : "unknown key (expected one of: " + join(known_, ", ") + ")");
    }
  }
}

std::string ConfigReader::describe_value(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsMap()) {
    // One 'key: value' pair is often a string with a space after its colon ('text: corpus.txt').
    if (node.size() == 1 && node.begin()->first.IsScalar() && node.begin()->second.IsScalar()) {
      return "a mapping {" + describe_value(node.begin()->first) + ": " + describe_value(node.begin()->second) +
             "} (YAML reads 'a: b' as a mapping: drop the space after the colon, or quote the value)";
    }
    return "a mapping";
  }
  if (node.IsSequence()) return "a list";
  const std::string& text = node.Scalar();
  if (!is_explicit_string(node) && (parse_config_number(text) || parse_config_bool(text))) return text;
  // Quoted, at most 60 characters, anything unprintable as \xNN: an error message never echoes
  // a whole (possibly binary) input.
  constexpr std::size_t kShown = 60;
  std::string shown;
  for (std::size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    shown += c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  if (text.size() > kShown) shown += fmt::format("... ({} characters)", text.size());
  return "'" + shown + "'";
}

void check_config_text(const std::string& text, const std::string& file) {
  std::size_t line = 1;
  int depth = 0, deepest = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') ++line;
    if (c == 0 || (c < 0x20 && c != '\n' && c != '\r' && c != '\t')) {
      throw ConfigError(file, "", fmt::format("not a text file (byte {} on line {} is 0x{:02x}); expected a YAML config",
                                              i, line, c));
    }
    // Flow collections ([..], {..}) nest. Every bracket counts, quoted or commented ones too: the
    // bound is far above any real config, so only input that is not a config reaches it.
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    if ((c == ']' || c == '}') && depth > 0) --depth;
    if (deepest > kMaxConfigDepth) {
      throw ConfigError(file, "", fmt::format("line {}: nested more than {} levels deep; a config is a few levels of "
                                              "mappings",
                                              line, kMaxConfigDepth));
    }
  }
}

void check_single_document(const std::string& text, const std::string& file) {
  int documents = 0;  // documents with content so far
  bool open = false;  // the current document has content
  std::size_t line_number = 0;
  for (std::size_t begin = 0; begin <= text.size(); ++line_number) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    // A document marker: '---' (starts one) or '...' (ends one) at column 0, alone or before a space.
    const bool start = line.starts_with("---"), stop = line.starts_with("...");
    if ((start || stop) && (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r')) {
      open = false;
      line.remove_prefix(3);
    } else if (line.starts_with("%")) {
      continue;  // a directive
    }
    const std::size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#' || open) continue;
    open = true;
    if (++documents == 2) {
      throw ConfigError(file, "", fmt::format("line {}: a second YAML document (after '---' or '...'); expected one "
                                              "document: a config is one mapping of keys",
                                              line_number + 1));
    }
  }
}

namespace {
void check_duplicates(const YAML::Node& node, const std::string& file, const std::string& prefix, int depth,
                      std::int64_t& values) {
  if (depth > kMaxConfigDepth) {
    throw ConfigError(file, prefix, fmt::format("nested more than {} levels deep", kMaxConfigDepth));
  }
  if (++values > kMaxConfigValues) {
    throw ConfigError(file, prefix, fmt::format("more than {} values once its YAML aliases are expanded; expected a "
                                                "config of a few keys", kMaxConfigValues));
  }
  if (node.IsMap()) {
    std::vector<std::string> seen;
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string("?");
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        throw ConfigError(file, path, fmt::format("duplicated key (line {}); each key may appear once",
                                                  entry.first.Mark().line + 1));
      }
      seen.push_back(key);
      check_duplicates(entry.second, file, path, depth + 1, values);
    }
  } else if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      check_duplicates(node[i], file, prefix + "[" + std::to_string(i) + "]", depth + 1, values);
    }
  }
}
}  // namespace

void check_no_duplicate_keys(const YAML::Node& root, const std::string& file) {
  std::int64_t values = 0;
  check_duplicates(root, file, "", 0, values);
}

}  // namespace atl

// Typed reading of YAML config sections with errors that name the file and the dotted key, and
// detection of unknown keys. The run config (graph/config.cpp) and the model families (to check
// `model:` overrides) both use it:
//
//   ConfigReader train(root_node["train"], "configs/x.yaml", "train");
//   auto steps = train.require<std::int64_t>("steps");
//   double lr = train.get<double>("lr", 3e-4);
//   train.check(lr > 0, "lr", "a positive number");   // "configs/x.yaml: train.lr: expected a positive number, got 0"
//   train.finish();                                    // throws on keys nobody asked for
//
// Every key that is read, tested with has(), or named in allow() counts as known; finish()
// lists the known keys in the order they were first asked for. A key whose value is null
// (`key:` or `key: ~`) reads as absent.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

namespace atl {

// A bad config: the message is "<file>: <dotted.key>: <problem>" (or "<file>: <problem>").
class ConfigError : public std::runtime_error {
 public:
  ConfigError(const std::string& file, const std::string& key, const std::string& problem);
  const std::string& file() const { return file_; }
  const std::string& key() const { return key_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string file_, key_, problem_;
};

// A key nobody reads (ConfigReader::finish): callers that probe which keys a reader takes catch
// this type instead of reading messages.
class UnknownKeyError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// A fault in the config file's own text, found before any --set is applied (a duplicated key, say):
// never attributed to a --set that names the same key.
class FileTextError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

class ConfigReader {
 public:
  // `node` must be a mapping, or null/undefined for an empty section; `prefix` is the node's dotted
  // path ("" for the top level).
  ConfigReader(YAML::Node node, std::string file, std::string prefix = "");

  // The value of `key` converted to T, or `fallback` when absent. T: bool, int, std::int64_t,
  // std::uint64_t, float, double, std::string, or std::vector of those (a YAML list).
  template <class T> T get(const std::string& key, const T& fallback);
  // The value of `key`; throws "<key>: required key is missing" when absent.
  template <class T> T require(const std::string& key);
  template <class T> std::optional<T> optional(const std::string& key);

  // Convenience checks of common ranges (fallback is used when absent and is not checked).
  std::int64_t get_positive(const std::string& key, std::int64_t fallback);      // >= 1
  std::int64_t get_non_negative(const std::string& key, std::int64_t fallback);  // >= 0
  // One of `choices` (a string); the error lists them.
  std::string get_choice(const std::string& key, const std::string& fallback, const std::vector<std::string>& choices);

  bool has(const std::string& key);                   // present and not null; marks the key known
  void allow(const std::string& key);                 // mark known without reading
  ConfigReader section(const std::string& key);       // a sub-mapping (absent: empty); marks known
  YAML::Node node(const std::string& key);            // the raw value (may be undefined); marks known
  std::vector<std::string> keys() const;              // keys present, in file order

  // Throws "<path(key)>: expected <expected>, got <value>" unless ok.
  void check(bool ok, const std::string& key, const std::string& expected) const;
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  [[noreturn]] void fail_expected(const std::string& key, const std::string& expected) const;
  // Throws for the first key that was never asked for: "<path>: unknown key (expected one of: a, b, c)".
  void finish() const;

  std::string path(const std::string& key) const;  // dotted: prefix.key
  const std::string& file() const { return file_; }

  // How a value reads in an error: numbers and booleans as is, other scalars quoted,
  // "a mapping", "a list", "nothing".
  static std::string describe_value(const YAML::Node& node);

 private:
  YAML::Node lookup(const std::string& key);  // marks known; undefined node when absent or null

  YAML::Node node_;
  std::string file_, prefix_;
  std::vector<std::string> known_;
};

// Scalar conversions used by ConfigReader (strict: the whole text must parse). nullopt on failure.
std::optional<std::int64_t> parse_config_integer(const std::string& text);
std::optional<std::uint64_t> parse_config_unsigned(const std::string& text);
std::optional<double> parse_config_number(const std::string& text);  // finite only
std::optional<bool> parse_config_bool(const std::string& text);
// Whether a scalar is a string whatever its text: quoted ('2', "yes") or tagged !!str.
bool is_explicit_string(const YAML::Node& scalar);

// Deepest nesting a config may have (flow brackets or mappings); deeper input is refused.
inline constexpr int kMaxConfigDepth = 64;
// The most values a config may hold once YAML aliases are expanded (each alias is a copy: a few
// lines of nested aliases would be a billion values to walk), and the most bytes a file may have.
inline constexpr std::int64_t kMaxConfigValues = 100000;
inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;
// Before parsing: throws ConfigError for a binary file (NUL or control bytes) or nesting deeper than
// kMaxConfigDepth, naming the line, never echoing the input.
void check_config_text(const std::string& text, const std::string& file);
// A second YAML document (content after a '---' or '...' line) is a ConfigError naming its line:
// the parser reads the first document only, so what the second sets would be ignored silently.
void check_single_document(const std::string& text, const std::string& file);
// After parsing: a key that appears twice in one mapping is a ConfigError naming it and its line
// (YAML parsers keep the first silently).
void check_no_duplicate_keys(const YAML::Node& root, const std::string& file);

// A YAML tree as JSON: scalars become integers, numbers, booleans or null where the config reader
// reads them so (yes/no/on/off included), else strings.
nlohmann::json yaml_to_json(const YAML::Node& node);

// ---------------------------------------------------------------------------------------------
// Implementation of the templates.

namespace config_detail {
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};

template <class T> std::string type_plural() {
  if constexpr (std::is_same_v<T, bool>) return "booleans";
  else if constexpr (std::is_same_v<T, std::string>) return "strings";
  else if constexpr (std::is_floating_point_v<T>) return "numbers";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) return "non-negative integers";
  else if constexpr (std::is_integral_v<T>) return "integers";
  else static_assert(sizeof(T) == 0, "ConfigReader: unsupported element type");
}

template <class T> std::string type_phrase() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) return "a non-negative integer";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (is_vector<T>::value) return "a list of " + type_plural<typename T::value_type>();
  else static_assert(sizeof(T) == 0, "ConfigReader: unsupported type");
}

// Converts `node` (defined, not null) to T or throws through reader.fail_expected(key, ...).
template <class T> T convert(const ConfigReader& reader, const std::string& key, const YAML::Node& node) {
  if constexpr (is_vector<T>::value) {
    if (!node.IsSequence()) reader.fail_expected(key, type_phrase<T>());
    T out;
    for (std::size_t i = 0; i < node.size(); ++i) {
      out.push_back(convert<typename T::value_type>(reader, key + "[" + std::to_string(i) + "]", node[i]));
    }
    return out;
  } else {
    if (!node.IsScalar()) reader.fail_expected(key, type_phrase<T>());
    const std::string& text = node.Scalar();
    if constexpr (std::is_same_v<T, std::string>) {
      return text;
    } else if (is_explicit_string(node)) {
      reader.fail_expected(key, type_phrase<T>());  // a string, as YAML (and run.json) read it
    } else if constexpr (std::is_same_v<T, bool>) {
      if (auto v = parse_config_bool(text)) return *v;
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = parse_config_number(text)) {
        // A float key's value must survive the narrowing: 1e39 would be inf (saved as JSON null),
        // 1e-50 a zero.
        if (std::fabs(*v) <= static_cast<double>(std::numeric_limits<T>::max())) {  // (a cast beyond is undefined)
          const T narrowed = static_cast<T>(*v);
          if (narrowed != 0 || *v == 0) return narrowed;
        }
        reader.fail_expected(key, std::is_same_v<T, float> ? "a number that fp32 represents (|x| <= 3.4e38, 0 or "
                                                             "|x| >= 1.4e-45)"
                                                           : type_phrase<T>());
      }
    } else if constexpr (std::is_unsigned_v<T>) {
      if (auto v = parse_config_unsigned(text); v && *v <= std::numeric_limits<T>::max()) return static_cast<T>(*v);
    } else {
      if (auto v = parse_config_integer(text);
          v && *v >= std::numeric_limits<T>::min() && *v <= std::numeric_limits<T>::max()) {
        return static_cast<T>(*v);
      }
    }
    reader.fail_expected(key, type_phrase<T>());
  }
}
}  // namespace config_detail

template <class T> std::optional<T> ConfigReader::optional(const std::string& key) {
  YAML::Node value = lookup(key);
  if (!value.IsDefined()) return std::nullopt;
  return config_detail::convert<T>(*this, key, value);
}

template <class T> T ConfigReader::get(const std::string& key, const T& fallback) {
  std::optional<T> value = optional<T>(key);
  return value ? *value : fallback;
}

template <class T> T ConfigReader::require(const std::string& key) {
  std::optional<T> value = optional<T>(key);
  if (!value) fail(key, "required key is missing (expected " + config_detail::type_phrase<T>() + ")");
  return *value;
}

}  // namespace atl

// The `data:` section of a run config, as plain values (graph/config.cpp fills it from YAML).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace atl {

enum class DataSourceKind { synthetic, text, tokens };

// The longest synthetic document data.synthetic_max_doc may ask for, in tokens.
inline constexpr std::int64_t kMaxSyntheticDoc = std::int64_t{1} << 24;

struct DataConfig {
  DataSourceKind kind = DataSourceKind::synthetic;
  std::string path;  // text and tokens sources: the file (relative paths are relative to the working directory)
  // Synthetic Markov corpus.
  std::int64_t synthetic_branching = 4;  // successors per token
  std::int64_t synthetic_min_doc = 8;    // document length range, tokens
  std::int64_t synthetic_max_doc = 64;
  // Token files.
  std::optional<std::int64_t> eos_id;  // a document ends after this token; unset: one document per epoch
  std::int64_t token_width = 0;        // bytes per token, 2 or 4; 0 = from the extension (.u16 / .u32)
  // File sources: start the file again after its end (true) or pad forever (false).
  bool loop = true;
};

// "synthetic", "text:<path>", "tokens:<path>" -> (kind, path); nullopt for anything else (or an empty path).
struct DataSourceSpec {
  DataSourceKind kind;
  std::string path;
};
inline std::optional<DataSourceSpec> parse_data_source_spec(const std::string& spec) {
  if (spec == "synthetic") return DataSourceSpec{DataSourceKind::synthetic, ""};
  for (auto [prefix, kind] : {std::pair{"text:", DataSourceKind::text}, std::pair{"tokens:", DataSourceKind::tokens}}) {
    std::string p = prefix;
    if (spec.size() > p.size() && spec.compare(0, p.size(), p) == 0) return DataSourceSpec{kind, spec.substr(p.size())};
  }
  return std::nullopt;
}
// The inverse of parse_data_source_spec.
inline std::string data_source_spec(const DataConfig& c) {
  switch (c.kind) {
    case DataSourceKind::synthetic: return "synthetic";
    case DataSourceKind::text: return "text:" + c.path;
    case DataSourceKind::tokens: return "tokens:" + c.path;
  }
  return "?";
}

}  // namespace atl

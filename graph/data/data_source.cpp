#include "graph/data/data_source.hpp"

#include <limits>

#include <fmt/format.h>

#include "graph/config_reader.hpp"
#include "graph/data/file_sources.hpp"
#include "graph/data/synthetic_source.hpp"

namespace atl {

namespace {
const std::string kDocumentsSource = "DocumentListSource";  // how its errors name it
}  // namespace

void throw_counter_at_limit(const std::string& source, const char* counter) {
  throw DataError(fmt::format("{}: the {} counter is at its limit ({}); only an edited cursor holds such a value",
                              source, counter, std::numeric_limits<std::int64_t>::max()));
}

Batch PackedSource::next(std::int64_t rows, std::int64_t seq) {
  if (rows < 1 || seq < 1) {
    throw std::invalid_argument(fmt::format("DataSource::next: expected rows >= 1 and seq >= 1, got {} and {}", rows, seq));
  }
  Batch batch = Batch::zeros(rows, seq);
  std::int64_t* ids = batch.input_ids.data<std::int64_t>();
  std::int64_t* positions = batch.positions.data<std::int64_t>();
  bool* valid = batch.valid.data<bool>();
  std::int64_t* targets = batch.targets.data<std::int64_t>();

  StreamToken current = peek();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t i = r * seq + t;
      advance();
      // The token after the row's last input is not consumed: it starts the next row.
      const StreamToken following = peek();
      ids[i] = current.valid ? current.id : 0;
      positions[i] = current.position;
      valid[i] = current.valid;
      const bool same_document = following.position != 0;
      targets[i] = current.valid && following.valid && same_document ? following.id : kIgnoreTarget;
      current = following;
    }
  }
  return batch;
}

void PackedSource::skip(std::int64_t rows, std::int64_t seq) {
  if (rows < 0 || seq < 1) {
    throw std::invalid_argument(fmt::format("DataSource::skip: expected rows >= 0 and seq >= 1, got {} and {}", rows, seq));
  }
  for (std::int64_t i = 0; i < rows * seq; ++i) advance();
}

Batch read_rows(DataSource& data, std::int64_t rows, std::int64_t seq, const std::vector<RowRange>& ranges) {
  std::vector<Batch> parts;
  std::int64_t at = 0;
  for (const RowRange& r : ranges) {
    if (r.begin < at || r.end <= r.begin || r.end > rows) {
      throw std::invalid_argument(fmt::format("read_rows: range [{}, {}) of {} rows is empty, out of order or out of "
                                              "range",
                                              r.begin, r.end, rows));
    }
    data.skip(r.begin - at, seq);
    parts.push_back(data.next(r.end - r.begin, seq));
    at = r.end;
  }
  data.skip(rows - at, seq);
  return Batch::concat_rows(parts);
}

// ---------------------------------------------------------------------------------------------

std::int64_t cursor_integer(const nlohmann::json& cursor, const char* field, std::int64_t min, std::int64_t max,
                            const std::string& what) {
  if (!cursor.is_object()) {
    throw DataError(fmt::format("{}: cursor: expected a JSON object, got {}", what, cursor.dump()));
  }
  auto it = cursor.find(field);
  if (it == cursor.end()) throw DataError(fmt::format("{}: cursor field '{}' is missing", what, field));
  if (!it->is_number_integer()) {
    throw DataError(fmt::format("{}: cursor field '{}': expected an integer, got {}", what, field, it->dump()));
  }
  // Unsigned values above int64 max are out of range too.
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(max)) {
    throw DataError(fmt::format("{}: cursor field '{}': expected an integer in [{}, {}], got {}", what, field, min,
                                max, it->dump()));
  }
  std::int64_t value = it->get<std::int64_t>();
  if (value < min || value > max) {
    const std::string expected = min == max ? std::to_string(min) : fmt::format("an integer in [{}, {}]", min, max);
    throw DataError(fmt::format("{}: cursor field '{}': expected {}, got {}", what, field, expected, value));
  }
  return value;
}

void check_cursor_source(const nlohmann::json& cursor, const std::string& expected, const std::string& what) {
  if (!cursor.is_object()) {
    throw DataError(fmt::format("{}: cursor: expected a JSON object, got {}", what, cursor.dump()));
  }
  auto it = cursor.find("source");
  if (it == cursor.end() || !it->is_string() || it->get<std::string>() != expected) {
    throw DataError(fmt::format("{}: cursor field 'source': expected \"{}\", got {}", what, expected,
                                it == cursor.end() ? std::string("nothing") : it->dump()));
  }
}

// ---------------------------------------------------------------------------------------------

DocumentListSource::DocumentListSource(std::vector<std::vector<std::int64_t>> documents, bool loop)
    : documents_(std::move(documents)), loop_(loop) {
  if (documents_.empty()) throw DataError("DocumentListSource: no documents");
  for (std::size_t d = 0; d < documents_.size(); ++d) {
    if (documents_[d].empty()) throw DataError(fmt::format("DocumentListSource: document {} is empty", d));
  }
}

StreamToken DocumentListSource::peek() const {
  if (exhausted()) return {0, pad_position_, false};
  return {documents_[document_][offset_], static_cast<std::int64_t>(offset_), true};
}

void DocumentListSource::advance() {
  if (exhausted()) {
    pad_position_ = next_count(pad_position_, kDocumentsSource, "pad_position");
    return;
  }
  if (++offset_ < documents_[document_].size()) return;
  offset_ = 0;
  if (++document_ == documents_.size() && loop_) {
    document_ = 0;
    epoch_ = next_count(epoch_, kDocumentsSource, "epoch");
  }
}

nlohmann::json DocumentListSource::cursor() const {
  return {{"source", "documents"},
          {"epoch", epoch_},
          {"document", document_},
          {"offset", offset_},
          {"pad_position", pad_position_}};
}

void DocumentListSource::restore(const nlohmann::json& cursor) {
  const std::string& what = kDocumentsSource;
  check_cursor_source(cursor, "documents", what);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const std::int64_t n = static_cast<std::int64_t>(documents_.size());
  std::int64_t epoch = cursor_integer(cursor, "epoch", 0, kMax, what);
  std::int64_t document = cursor_integer(cursor, "document", 0, loop_ ? n - 1 : n, what);
  std::int64_t length = document < n ? static_cast<std::int64_t>(documents_[document].size()) : 1;
  std::int64_t offset = cursor_integer(cursor, "offset", 0, length - 1, what);
  std::int64_t pad_position = cursor_integer(cursor, "pad_position", 0, document < n ? 0 : kMax, what);
  epoch_ = epoch;
  document_ = static_cast<std::size_t>(document);
  offset_ = static_cast<std::size_t>(offset);
  pad_position_ = pad_position;
}

std::string DocumentListSource::describe() const {
  return fmt::format("documents({} documents, {})", documents_.size(), loop_ ? "looping" : "padding after the end");
}

// ---------------------------------------------------------------------------------------------

namespace {
// The config and its key too, as config errors name them.
[[noreturn]] void throw_naming_config(const DataError& e, const std::string& config_file) {
  throw DataError(fmt::format("{}: {}{}", config_file, e.key().empty() ? "data.source: " : "", e.what()), e.key());
}
}  // namespace

std::optional<std::string> data_content_hash(const DataConfig& config, const std::string& config_file) {
  if (config.kind == DataSourceKind::synthetic) return std::nullopt;
  try {
    return MappedFile(config.path).content_hash();
  } catch (const DataError& e) {
    throw_naming_config(e, config_file);
  }
}

std::unique_ptr<DataSource> make_data_source(const DataConfig& config, std::int64_t usable_vocab, std::uint64_t seed) {
  switch (config.kind) {
    case DataSourceKind::synthetic:
      return std::make_unique<SyntheticSource>(
          seed, usable_vocab,
          SyntheticOptions{config.synthetic_branching, config.synthetic_min_doc, config.synthetic_max_doc});
    case DataSourceKind::text:
      return std::make_unique<TextFileSource>(config.path, usable_vocab, config.loop);
    case DataSourceKind::tokens:
      return std::make_unique<TokenFileSource>(config.path, usable_vocab, config.token_width, config.eos_id,
                                               config.loop);
  }
  throw std::logic_error("make_data_source: unknown source kind");
}

void check_data_fits_model(const DataConfig& config, std::int64_t usable_vocab, const std::string& config_file) {
  if (config.kind == DataSourceKind::synthetic && config.synthetic_branching > usable_vocab) {
    throw ConfigError(config_file, "data.synthetic_branching",
                      fmt::format("expected an integer in [1, {}] (the model's usable vocab, unpadded_vocab_size), got {}",
                                  usable_vocab, config.synthetic_branching));
  }
}

std::unique_ptr<DataSource> make_data_source(const DataConfig& config, std::int64_t usable_vocab, std::uint64_t seed,
                                             const std::string& config_file) {
  check_data_fits_model(config, usable_vocab, config_file);
  try {
    return make_data_source(config, usable_vocab, seed);
  } catch (const DataError& e) {
    throw_naming_config(e, config_file);
  }
}

}  // namespace atl

// Data sources: streams of documents packed into causal-LM rows.
//
// Packing (every source): documents are concatenated into one token stream. A row of length S
// takes S+1 consecutive stream tokens; the first S are its inputs and target[t] = token[t+1]
// unless token t+1 starts a new document or either token is padding (then kIgnoreTarget). The
// next row starts at the token that was this row's last target (the usual GPT overlap), so a
// row consumes S stream tokens. positions restart at 0 at every document start and continue
// (pos > 0 at column 0) when a document spans rows. A finite source that runs out pads with
// input 0, valid false, target kIgnoreTarget; the padding counts as one more document whose
// start is the first pad.
//
// The cursor is the stream position of the next row's first token, so restore() followed by
// next() gives exactly the batches that would have followed cursor().
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/data/batch.hpp"
#include "graph/data/data_config.hpp"

namespace atl {

// Bad data or a bad cursor: the message names the file (or source) and the field. An error about a
// config key other than data.source itself (data.eos_id, data.token_width) names that key in its
// message and in key(), so that make_data_source's config prefix does not also blame data.source.
class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& message, std::string key = "")
      : std::runtime_error(message), key_(std::move(key)) {}
  // The data key the message names; empty when the error is about data.source (the file or source).
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// A cursor counter (epoch, pad position) plus one. A counter restored at the int64 limit (only a
// hand-edited cursor holds one) is refused by name instead of wrapping to a negative value the run
// would save and its own load refuse.
[[noreturn]] void throw_counter_at_limit(const std::string& source, const char* counter);
inline std::int64_t next_count(std::int64_t value, const std::string& source, const char* counter) {
  if (value == std::numeric_limits<std::int64_t>::max()) throw_counter_at_limit(source, counter);
  return value + 1;
}

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The next `rows` rows of `seq` tokens each.
  virtual Batch next(std::int64_t rows, std::int64_t seq) = 0;
  // Moves past `rows` rows of `seq` tokens as next() would, without building them (the rows other
  // processes of a job read). Afterwards cursor() is what it would be after next(rows, seq).
  virtual void skip(std::int64_t rows, std::int64_t seq) {
    if (rows > 0) (void)next(rows, seq);
  }
  // Where the next row starts; JSON so that it goes into checkpoints as is.
  virtual nlohmann::json cursor() const = 0;
  // Inverse of cursor(); throws DataError naming the field when the cursor does not fit this source.
  virtual void restore(const nlohmann::json& cursor) = 0;
  // The loss floor in nats per scored target when the source knows it (synthetic only).
  virtual std::optional<double> entropy_nats_per_token() const { return std::nullopt; }
  // True once a finite source has only padding left.
  virtual bool exhausted() const { return false; }
  // True once no row can hold a target: only padding is left, or only tokens without a successor
  // in their document (the last real token, which the row before scored as its target; one-token
  // documents; blank lines). A run ends there (data.loop: false).
  virtual bool used_up() const { return exhausted(); }
  virtual std::string describe() const = 0;
  // Throws DataError naming the file when the file a source reads was modified in place since it
  // was opened (its mapping would mix old and new bytes); replaced by a rename, the source goes
  // on reading the bytes it opened. Nothing for sources without a file.
  virtual void check_unchanged() const {}
};

// The `ranges` (increasing, disjoint) of the next `rows` rows, concatenated; the source moves past
// all `rows` (what a process of a job reads: its ranks' rows; every process's cursor stays the same).
Batch read_rows(DataSource& data, std::int64_t rows, std::int64_t seq, const std::vector<RowRange>& ranges);

// One token of the stream: its id, its offset in its document, and whether it is real.
struct StreamToken {
  std::int64_t id = 0;
  std::int64_t position = 0;
  bool valid = true;
};

// A source defined by a token stream; implements next() with the packing rules above.
class PackedSource : public DataSource {
 public:
  Batch next(std::int64_t rows, std::int64_t seq) final;
  void skip(std::int64_t rows, std::int64_t seq) final;  // a row moves `seq` tokens on

 protected:
  // The token at the stream position, without moving.
  virtual StreamToken peek() const = 0;
  // Move to the following token (past the end of a finite source: the next pad).
  virtual void advance() = 0;
};

// An in-memory list of documents (tests, and callers that tokenize themselves).
// Cursor: {"source": "documents", "epoch", "document", "offset", "pad_position"}.
class DocumentListSource : public PackedSource {
 public:
  // Every document must be non-empty and there must be at least one.
  explicit DocumentListSource(std::vector<std::vector<std::int64_t>> documents, bool loop = true);

  nlohmann::json cursor() const override;
  void restore(const nlohmann::json& cursor) override;
  bool exhausted() const override { return document_ >= documents_.size(); }
  std::string describe() const override;

 protected:
  StreamToken peek() const override;
  void advance() override;

 private:
  std::vector<std::vector<std::int64_t>> documents_;
  bool loop_;
  std::int64_t epoch_ = 0;
  std::size_t document_ = 0;  // == documents_.size() once a non-looping source is exhausted
  std::size_t offset_ = 0;
  std::int64_t pad_position_ = 0;
};

// The source a run config names. usable_vocab bounds the token ids (file sources check every token).
std::unique_ptr<DataSource> make_data_source(const DataConfig& config, std::int64_t usable_vocab, std::uint64_t seed);
// Throws ConfigError naming `config_file` and the key for a `data:` setting that does not fit the
// model (more synthetic successors than usable tokens).
void check_data_fits_model(const DataConfig& config, std::int64_t usable_vocab, const std::string& config_file);
// The same for a run config's `data:` section, checked by check_data_fits_model.
std::unique_ptr<DataSource> make_data_source(const DataConfig& config, std::int64_t usable_vocab, std::uint64_t seed,
                                             const std::string& config_file);

// The content hash (MappedFile::content_hash) of the file a text or tokens source reads; nullopt
// for synthetic data. Throws DataError naming `config_file` as make_data_source does. The nodes of
// a job compare it: each reads its own copy of the file, and copies that differ would mix two data
// streams.
std::optional<std::string> data_content_hash(const DataConfig& config, const std::string& config_file);

// Cursor field helpers shared by the sources: read `field` of `cursor` as an integer in [min, max],
// else throw DataError("<what>: cursor field '<field>': expected ..., got ...").
std::int64_t cursor_integer(const nlohmann::json& cursor, const char* field, std::int64_t min, std::int64_t max,
                            const std::string& what);
// Throws unless cursor["source"] == expected.
void check_cursor_source(const nlohmann::json& cursor, const std::string& expected, const std::string& what);

}  // namespace atl

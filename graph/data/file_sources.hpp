// Data sources backed by files: byte-level text and pre-tokenized uint16/uint32 shards.
// Both read the file through a read-only memory map, check every token against the usable
// vocabulary when opened, and loop over the file in epochs (or pad after its end when loop is
// false). Cursor: {"source", "epoch", "offset", "pad_position", "file_size", "file_hash"};
// file_size and file_hash (of the whole content) guard against restoring into a changed file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "graph/data/data_source.hpp"

namespace atl {

// A read-only memory map of a whole file (empty files map to no bytes).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws DataError naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // A 64-bit hash of the whole content as 16 hex digits, computed when the file is opened (one
  // pass, beside the sources' token check), the same on every machine: a cursor carries it, so an
  // edited file is not mistaken for the one a checkpoint read.
  const std::string& content_hash() const { return hash_; }
  // DataError("<what>: cursor field 'file_size' / 'file_hash': ...") unless `cursor` was taken
  // from this content. A cursor without file_hash (saved before it existed) is checked by size.
  void check_cursor_matches(const nlohmann::json& cursor, const std::string& what) const;
  // DataError unless the file at path() is still the one mapped, unmodified: the same inode with
  // the same size and modification time (a rename put in its place is another inode: the mapping
  // still holds the bytes opened, and is fine).
  void check_unchanged() const;

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  std::string hash_;
  std::uint64_t device_ = 0, inode_ = 0;
  std::int64_t mtime_ns_ = 0;
  int guard_ = -1;  // graph/data/mapped_file_guard.hpp: a SIGBUS in the mapping names this file
};

// What the two file sources share: a walk over the file's token slots (bytes or tokens) in
// epochs, each token's position in its document, padding after the end of a file that does not
// loop, and the cursor. A derived source says what a slot holds, where documents start and which
// slot follows another; its constructor checks the file and then calls set_slots.
class FileStreamSource : public PackedSource {
 public:
  nlohmann::json cursor() const override;
  void restore(const nlohmann::json& cursor) override;
  bool exhausted() const override { return at_ == end_; }
  bool used_up() const override { return !loop_ && (exhausted() || at_ > last_scorable_); }
  void check_unchanged() const override { file_.check_unchanged(); }

 protected:
  // kind: the cursor's "source" ("text", "tokens"); what: how errors name the data ("text data").
  FileStreamSource(const std::string& path, bool loop, const char* kind, const char* what);
  // The token slots are [first, end); last_scorable: the last whose successor is in its document
  // (a target: where a file that does not loop is used up).
  void set_slots(std::size_t first, std::size_t end, std::size_t last_scorable);
  std::size_t first_slot() const { return first_; }

  virtual std::int64_t token_at(std::size_t slot) const = 0;
  virtual std::size_t next_slot(std::size_t slot) const = 0;  // the token slot after `slot`, or end
  virtual bool starts_document(std::size_t slot) const = 0;
  // A restored cursor's slot in [first, end) that holds no token: DataError naming `what`.
  virtual void check_token_slot(std::size_t, const std::string&) const {}

  StreamToken peek() const override;
  void advance() override;

  MappedFile file_;
  bool loop_;

 private:
  std::int64_t document_position(std::size_t slot) const;  // scans back to the document start

  const char* kind_;
  const char* what_;
  std::size_t first_ = 0, end_ = 0, last_scorable_ = 0;
  std::int64_t epoch_ = 0;
  std::size_t at_ = 0;  // always a token slot, or end_ once exhausted
  std::int64_t position_ = 0;
  std::int64_t pad_position_ = 0;
};

// Byte-level text: token id = byte value. Documents are separated by blank lines: a run of two
// or more '\n' ends a document and is dropped; a single '\n' is an ordinary token.
// The cursor's offset is a byte offset in the file.
class TextFileSource final : public FileStreamSource {
 public:
  TextFileSource(const std::string& path, std::int64_t usable_vocab, bool loop = true);
  std::string describe() const override;

 private:
  std::int64_t token_at(std::size_t offset) const override { return file_.data()[offset]; }
  std::size_t next_slot(std::size_t offset) const override { return skip_separators(offset + 1); }
  bool starts_document(std::size_t offset) const override;
  void check_token_slot(std::size_t offset, const std::string& what) const override;

  bool is_separator(std::size_t offset) const;  // byte is part of a run of >= 2 newlines
  std::size_t skip_separators(std::size_t offset) const;
};

// The token width of a tokens file: `width` (2 or 4), or with 0 the one its extension names
// (.u16, .u32). Throws DataError naming the file when neither tells, or they contradict.
std::int64_t resolved_token_width(const std::string& path, std::int64_t width);

// Little-endian uint16 (.u16) or uint32 (.u32) tokens. With eos_id, a document ends after each
// eos token; without, each epoch of the file is one document. The cursor's offset counts tokens.
class TokenFileSource final : public FileStreamSource {
 public:
  // width: 2 or 4 bytes, or 0 to take it from the extension.
  TokenFileSource(const std::string& path, std::int64_t usable_vocab, std::int64_t width = 0,
                  std::optional<std::int64_t> eos_id = std::nullopt, bool loop = true);
  std::string describe() const override;
  std::int64_t width() const { return width_; }
  std::size_t token_count() const { return token_count_; }

 private:
  std::int64_t token_at(std::size_t index) const override;
  std::size_t next_slot(std::size_t index) const override { return index + 1; }
  bool starts_document(std::size_t index) const override;

  std::int64_t width_;
  std::optional<std::int64_t> eos_id_;
  std::size_t token_count_ = 0;
};

}  // namespace atl

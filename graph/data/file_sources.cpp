#include "graph/data/file_sources.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "graph/data/mapped_file_guard.hpp"

namespace atl {

namespace {

constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

std::int64_t mtime_ns(const struct stat& info) {
  return static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
}

// Four lanes, each folding in every fourth little-endian 64-bit word with a multiply and a
// rotation (independent chains: about 6 GB/s on a Zen 3, near memory speed), joined, then the
// words and bytes left, then murmur3's finalizer. Not cryptographic: it guards against mistakes
// (an edited or regenerated file), and any change alters it with overwhelming probability.
static_assert(std::endian::native == std::endian::little, "the hash reads words in the file's byte order");
std::uint64_t hash_bytes(const unsigned char* p, std::size_t n) {
  constexpr std::uint64_t k1 = 0x9E3779B97F4A7C15ull, k2 = 0xC2B2AE3D27D4EB4Full;
  auto word = [p](std::size_t at, std::size_t bytes) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + at, bytes);
    return w;
  };
  auto mix = [](std::uint64_t h, std::uint64_t w) { return std::rotl(h ^ (w * k2), 31) * k1; };
  std::uint64_t a = k1 ^ n, b = k2 ^ n, c = ~k1 ^ n, d = ~k2 ^ n;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = mix(a, word(i, 8));
    b = mix(b, word(i + 8, 8));
    c = mix(c, word(i + 16, 8));
    d = mix(d, word(i + 24, 8));
  }
  std::uint64_t h = mix(mix(mix(a, b), c), d);
  for (; i + 8 <= n; i += 8) h = mix(h, word(i, 8));
  if (i < n) h = mix(h, word(i, n - i));
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO would wait for a writer; it is refused below as not a regular file
  // (the flag changes nothing for a regular file's reads or mapping).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open data file: {}", path, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    throw DataError(fmt::format("{}: cannot stat data file: {}", path, std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("{}: data file is not a regular file", path));
  }
  size_ = static_cast<std::size_t>(info.st_size);
  device_ = static_cast<std::uint64_t>(info.st_dev);
  inode_ = static_cast<std::uint64_t>(info.st_ino);
  mtime_ns_ = mtime_ns(info);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: cannot memory-map data file: {}", path, std::strerror(error)));
    }
    data_ = static_cast<const unsigned char*>(mapped);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  guard_ = guard_mapping(data_, size_, path_);
  hash_ = fmt::format("{:016x}", hash_bytes(data_, size_));
}

void MappedFile::check_unchanged() const {
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0) return;  // gone or renamed away: the mapping still holds the bytes
  if (static_cast<std::uint64_t>(now.st_dev) != device_ || static_cast<std::uint64_t>(now.st_ino) != inode_) return;
  if (static_cast<std::size_t>(now.st_size) == size_ && mtime_ns(now) == mtime_ns_) return;
  throw DataError(fmt::format("{}: the data file was modified in place while the run read it ({} bytes, modified "
                              "after it was opened): rows read since may mix old and new bytes; restore it and "
                              "--resume from a checkpoint saved before (to change data, write a new file and rename "
                              "it into place)",
                              path_, static_cast<std::int64_t>(now.st_size)));
}

MappedFile::~MappedFile() {
  unguard_mapping(guard_);
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}


void MappedFile::check_cursor_matches(const nlohmann::json& cursor, const std::string& what) const {
  const auto size = static_cast<std::int64_t>(size_);
  cursor_integer(cursor, "file_size", size, size, what);
  if (!cursor.contains("file_hash")) return;
  const nlohmann::json& saved = cursor.at("file_hash");
  if (!saved.is_string() || saved.get<std::string>() != content_hash()) {
    throw DataError(fmt::format("{}: cursor field 'file_hash': the checkpoint read a file whose content hash is {}, "
                                "this file's is {}: the file changed since", what,
                                saved.is_string() ? saved.get<std::string>() : saved.dump(), content_hash()));
  }
}

// ---------------------------------------------------------------------------------------------
// The walk both file sources share

FileStreamSource::FileStreamSource(const std::string& path, bool loop, const char* kind, const char* what)
    : file_(path), loop_(loop), kind_(kind), what_(what) {}

void FileStreamSource::set_slots(std::size_t first, std::size_t end, std::size_t last_scorable) {
  first_ = first;
  end_ = end;
  last_scorable_ = last_scorable;
  at_ = first;
}

std::int64_t FileStreamSource::document_position(std::size_t slot) const {
  // A document's tokens are consecutive slots.
  std::size_t start = slot;
  while (!starts_document(start)) --start;
  return static_cast<std::int64_t>(slot - start);
}

StreamToken FileStreamSource::peek() const {
  if (exhausted()) return {0, pad_position_, false};
  return {token_at(at_), position_, true};
}

void FileStreamSource::advance() {
  if (exhausted()) {
    pad_position_ = next_count(pad_position_, file_.path(), "pad_position");
    return;
  }
  std::size_t next = next_slot(at_);
  if (next == end_) {
    if (!loop_) {
      at_ = next;
      pad_position_ = 0;
      return;
    }
    epoch_ = next_count(epoch_, file_.path(), "epoch");
    next = first_;
  }
  position_ = starts_document(next) ? 0 : position_ + 1;
  at_ = next;
}

nlohmann::json FileStreamSource::cursor() const {
  return {{"source", kind_},   {"epoch", epoch_},       {"offset", at_},
          {"pad_position", pad_position_}, {"file_size", file_.size()}, {"file_hash", file_.content_hash()}};
}

void FileStreamSource::restore(const nlohmann::json& cursor) {
  const std::string what = std::string(what_) + " " + file_.path();
  check_cursor_source(cursor, kind_, what);
  file_.check_cursor_matches(cursor, what);
  const auto first = static_cast<std::int64_t>(first_), end = static_cast<std::int64_t>(end_);
  const std::int64_t epoch = cursor_integer(cursor, "epoch", 0, kMaxInt, what);
  const std::int64_t offset = cursor_integer(cursor, "offset", first, loop_ ? end - 1 : end, what);
  if (offset < end) check_token_slot(static_cast<std::size_t>(offset), what);
  const std::int64_t pad_position = cursor_integer(cursor, "pad_position", 0, offset == end ? kMaxInt : 0, what);
  epoch_ = epoch;
  at_ = static_cast<std::size_t>(offset);
  pad_position_ = pad_position;
  position_ = offset < end ? document_position(at_) : 0;
}

// ---------------------------------------------------------------------------------------------
// Text

TextFileSource::TextFileSource(const std::string& path, std::int64_t usable_vocab, bool loop)
    : FileStreamSource(path, loop, "text", "text data") {
  const unsigned char* bytes = file_.data();
  for (std::size_t i = 0; i < file_.size(); ++i) {
    if (bytes[i] >= usable_vocab) {
      throw DataError(fmt::format("{}: byte offset {} has value {}, which is not below the usable vocabulary size {}",
                                  path, i, bytes[i], usable_vocab));
    }
  }
  const std::size_t first_token = skip_separators(0);
  if (first_token == file_.size()) {
    throw DataError(fmt::format("{}: no text (the file is empty or only blank lines)", path));
  }
  // A target is a token's successor in its document: some document must hold two bytes. The last
  // such byte is where a non-looping file is used up (blank lines or one-byte documents may follow).
  std::optional<std::size_t> last_scorable;
  for (std::size_t i = file_.size() - 1; !last_scorable && i-- > first_token;) {
    if (!is_separator(i) && !is_separator(i + 1)) last_scorable = i;
  }
  if (!last_scorable) {
    throw DataError(fmt::format("{}: nothing to train on: every document is one byte long, so no token has a "
                                "successor to predict", path));
  }
  set_slots(first_token, file_.size(), *last_scorable);
}

bool TextFileSource::is_separator(std::size_t offset) const {
  const unsigned char* b = file_.data();
  if (b[offset] != '\n') return false;
  return (offset > 0 && b[offset - 1] == '\n') || (offset + 1 < file_.size() && b[offset + 1] == '\n');
}

std::size_t TextFileSource::skip_separators(std::size_t offset) const {
  while (offset < file_.size() && is_separator(offset)) ++offset;
  return offset;
}

bool TextFileSource::starts_document(std::size_t offset) const {
  const unsigned char* b = file_.data();
  return offset == first_slot() || (offset >= 2 && b[offset - 1] == '\n' && b[offset - 2] == '\n');
}

void TextFileSource::check_token_slot(std::size_t offset, const std::string& what) const {
  if (is_separator(offset)) {
    throw DataError(fmt::format("{}: cursor field 'offset': byte {} lies inside a blank-line separator, not on a token",
                                what, offset));
  }
}

std::string TextFileSource::describe() const {
  return fmt::format("text({}, {} bytes, {})", file_.path(), file_.size(), loop_ ? "looping" : "padding after the end");
}

// ---------------------------------------------------------------------------------------------
// Tokens

std::int64_t resolved_token_width(const std::string& path, std::int64_t width) {
  const std::string extension = std::filesystem::path(path).extension().string();
  const std::int64_t from_extension = extension == ".u16" ? 2 : extension == ".u32" ? 4 : 0;
  if (width == 0) {
    if (from_extension == 0) {
      throw DataError(fmt::format("{}: cannot tell the token width: expected a .u16 or .u32 extension, or data.token_width 2 or 4",
                                  path));
    }
    return from_extension;
  }
  if (width != 2 && width != 4) {
    throw DataError(fmt::format("{}: data.token_width: expected 2 or 4 bytes, got {}", path, width), "data.token_width");
  }
  if (from_extension != 0 && from_extension != width) {
    throw DataError(fmt::format("{}: data.token_width {} contradicts the {} extension", path, width, extension), "data.token_width");
  }
  return width;
}

TokenFileSource::TokenFileSource(const std::string& path, std::int64_t usable_vocab, std::int64_t width,
                                 std::optional<std::int64_t> eos_id, bool loop)
    : FileStreamSource(path, loop, "tokens", "token data"), width_(resolved_token_width(path, width)),
      eos_id_(eos_id) {
  if (file_.size() % static_cast<std::size_t>(width_) != 0) {
    throw DataError(fmt::format("{}: file size {} bytes is not a multiple of the token width {}", path, file_.size(),
                                width_));
  }
  token_count_ = file_.size() / static_cast<std::size_t>(width_);
  if (token_count_ == 0) throw DataError(fmt::format("{}: no tokens (the file is empty)", path));
  if (eos_id_ && (*eos_id_ < 0 || *eos_id_ >= usable_vocab)) {
    throw DataError(fmt::format("{}: data.eos_id: expected an integer in [0, {}) (the usable vocabulary), got {}", path,
                                usable_vocab, *eos_id_), "data.eos_id");
  }
  // Some token must have a successor in its document (a target); the last one is where a
  // non-looping file is used up (one-token documents may follow).
  std::optional<std::size_t> last_scorable;
  for (std::size_t i = 0; i < token_count_; ++i) {
    const std::int64_t t = token_at(i);
    if (t >= usable_vocab) {
      throw DataError(fmt::format("{}: token index {} (byte offset {}) is {}, which is not below the usable vocabulary size {}",
                                  path, i, i * static_cast<std::size_t>(width_), t, usable_vocab));
    }
    if (i + 1 < token_count_ && !(eos_id_ && t == *eos_id_)) last_scorable = i;
  }
  if (!last_scorable) {
    throw DataError(fmt::format("{}: nothing to train on: {}, so no token has a successor to predict", path,
                                token_count_ == 1 ? "the file holds one token" : "every document is one token long"));
  }
  set_slots(0, token_count_, *last_scorable);
}

std::int64_t TokenFileSource::token_at(std::size_t index) const {
  // Assemble little-endian bytes explicitly: correct on any host byte order.
  const unsigned char* p = file_.data() + index * static_cast<std::size_t>(width_);
  std::uint32_t value = 0;
  for (std::int64_t k = width_ - 1; k >= 0; --k) value = (value << 8) | p[k];
  return value;
}

bool TokenFileSource::starts_document(std::size_t index) const {
  return index == 0 || (eos_id_ && token_at(index - 1) == *eos_id_);
}

std::string TokenFileSource::describe() const {
  return fmt::format("tokens({}, {} x uint{}, eos {}, {})", file_.path(), token_count_, width_ * 8,
                     eos_id_ ? std::to_string(*eos_id_) : std::string("none"),
                     loop_ ? "looping" : "padding after the end");
}

}  // namespace atl

#include "graph/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "graph/checkpoint/durable_file.hpp"
#include "graph/checkpoint/json_file.hpp"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; tensors are written from memory as they are");

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
// The Hugging Face reader refuses headers above 100 MB; so do we (a corrupt length reads as huge).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void fail(const fs::path& file, const std::string& fault) {
  throw CheckpointError(fmt::format("{}: {}", file.string(), fault));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    if (safetensors_dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

// Indices of the map's tensors in file order: element size descending, then name.
std::vector<std::size_t> file_order(const TensorMap& tensors) {
  const auto& names = tensors.names();
  std::vector<std::size_t> order(names.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    std::size_t sa = element_size(tensors.at(names[a]).dtype());
    std::size_t sb = element_size(tensors.at(names[b]).dtype());
    if (sa != sb) return sa > sb;
    return names[a] < names[b];
  });
  return order;
}

void write_le64(DurableFileWriter& out, std::uint64_t value) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(value >> (8 * i));
  out.write(bytes, 8);
}

// A read-only file with positioned reads; errors name the file.
class InputFile {
 public:
  explicit InputFile(fs::path path) : path_(std::move(path)) {
    // O_NONBLOCK: opening a FIFO would wait for a writer; it is refused below as not a regular
    // file (the flag changes nothing for a regular file's reads).
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) fail(path_, fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int saved = errno;
      ::close(fd_);
      fail(path_, fmt::format("cannot stat: {}", std::strerror(saved)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path_, "not a regular file");
    }
    // Blocking again for the reads: some network and FUSE file systems answer EAGAIN otherwise.
    if (const int flags = ::fcntl(fd_, F_GETFL); flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::uint64_t size() const { return size_; }

  void read_at(std::uint64_t offset, void* destination, std::uint64_t count) const {
    char* p = static_cast<char*>(destination);
    while (count > 0) {
      std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(count, std::uint64_t{1} << 30));
      ssize_t n = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(path_, fmt::format("read failed: {}", std::strerror(errno)));
      }
      if (n == 0) fail(path_, "truncated: the file ended while reading (was it changed underneath?)");
      p += n;
      offset += static_cast<std::uint64_t>(n);
      count -= static_cast<std::uint64_t>(n);
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

std::optional<std::uint64_t> as_non_negative_integer(const json& j) {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(j.get<std::int64_t>());
  return std::nullopt;
}

// One tensor as its header entry describes it.
struct HeaderEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

HeaderEntry parse_entry(const fs::path& file, const std::string& name, const json& value,
                        std::uint64_t data_bytes) {
  HeaderEntry e;
  e.name = name;
  if (!value.is_object()) fail(file, fmt::format("tensor '{}': header entry is not an object", name));

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    fail(file, fmt::format("tensor '{}': missing string \"dtype\"", name));
  }
  auto dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype) {
    fail(file, fmt::format("tensor '{}': unknown dtype '{}' (atoll reads F32, BF16, I32, I64, BOOL)", name,
                           dtype_it->get<std::string>()));
  }
  e.dtype = *dtype;

  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    fail(file, fmt::format("tensor '{}': bad shape: missing array \"shape\"", name));
  }
  // Element count with overflow checks: a corrupt shape must not wrap around to a plausible size.
  std::uint64_t numel = 1;
  for (const auto& dim : *shape_it) {
    auto d = as_non_negative_integer(dim);
    if (!d || *d > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(file, fmt::format("tensor '{}': bad shape {}: dimensions must be non-negative integers", name,
                             shape_it->dump()));
    }
    e.shape.push_back(static_cast<std::int64_t>(*d));
    if (__builtin_mul_overflow(numel, *d, &numel)) {
      fail(file, fmt::format("tensor '{}': bad shape {}: element count overflows", name, shape_it->dump()));
    }
  }

  auto offsets_it = value.find("data_offsets");
  std::optional<std::uint64_t> begin, end;
  if (offsets_it != value.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = as_non_negative_integer((*offsets_it)[0]);
    end = as_non_negative_integer((*offsets_it)[1]);
  }
  if (!begin || !end || *begin > *end) {
    fail(file, fmt::format("tensor '{}': data_offsets {} is not [begin, end] with 0 <= begin <= end", name,
                           offsets_it == value.end() ? std::string("(missing)") : offsets_it->dump()));
  }
  e.begin = *begin;
  e.end = *end;
  if (e.end > data_bytes) {
    fail(file, fmt::format("truncated data: tensor '{}' ends at byte {} of the data buffer, which has only {} bytes",
                           name, e.end, data_bytes));
  }
  std::uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, element_size(e.dtype), &expected_bytes) || expected_bytes != e.end - e.begin) {
    fail(file, fmt::format("tensor '{}': shape mismatch: data_offsets [{}, {}] hold {} bytes but {}{} needs {} x {} bytes",
                           name, e.begin, e.end, e.end - e.begin, safetensors_dtype_name(e.dtype),
                           shape_string(e.shape), numel, element_size(e.dtype)));
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const fs::path& file, const json& value) {
  if (!value.is_object()) fail(file, "__metadata__ is not an object mapping strings to strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) fail(file, fmt::format("__metadata__ value of '{}' is not a string", key));
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// The header as a JSON object; a key given twice at the top level is an error (JSON parsers
// otherwise keep one silently, leaving the other tensor's bytes unaccounted for).
json parse_header(const fs::path& file, const std::string& text) {
  std::set<std::string> seen;
  std::optional<std::string> duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = parse_json(text, on_event);
  } catch (const json::exception& e) {
    fail(file, fmt::format("invalid JSON header: {}", e.what()));
  }
  if (!header.is_object()) fail(file, fmt::format("header is not a JSON object (it is {})", header.type_name()));
  if (duplicate) fail(file, fmt::format("header names '{}' twice", *duplicate));
  return header;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

void write_safetensors(const fs::path& file, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& name : tensors.names()) {
    const Tensor& t = tensors.at(name);
    if (name == kMetadataKey) fail(file, "a tensor may not be called __metadata__");
    if (!t.defined()) fail(file, fmt::format("tensor '{}' is undefined", name));
    if (t.device() != Device::cpu) fail(file, fmt::format("tensor '{}' is not on the CPU", name));
  }
  std::vector<std::size_t> order = file_order(tensors);

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[std::string(kMetadataKey)] = std::move(m);
  }
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const std::string& name = tensors.names()[i];
    const Tensor& t = tensors.at(name);
    std::uint64_t end = offset + t.bytes();
    header[name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))}, {"shape", t.shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(file, fmt::format("cannot encode the header: {}", e.what()));
  }
  // Padding keeps the data buffer 8-aligned, so the ordering above aligns every tensor.
  text.append((8 - text.size() % 8) % 8, ' ');

  DurableFileWriter out(file);
  write_le64(out, text.size());
  out.write(text.data(), text.size());
  std::vector<unsigned char> normalised;
  for (std::size_t i : order) {
    const Tensor& t = tensors.at(tensors.names()[i]);
    if (t.dtype() == DType::boolean) {
      // Storage is bytes; anything non-zero is true and is written as 1.
      const unsigned char* p = static_cast<const unsigned char*>(t.raw());
      normalised.assign(p, p + t.bytes());
      for (auto& b : normalised) b = b != 0 ? 1 : 0;
      out.write(normalised.data(), normalised.size());
    } else {
      out.write(t.raw(), t.bytes());
    }
  }
  out.commit();
}

SafetensorsContents read_safetensors(const fs::path& file) {
  InputFile in(file);
  if (in.size() < 8) {
    fail(file, fmt::format("truncated: the file has {} bytes, fewer than the 8-byte header length", in.size()));
  }
  unsigned char length_bytes[8];
  in.read_at(0, length_bytes, 8);
  std::uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
  if (header_bytes > kMaxHeaderBytes) {
    fail(file, fmt::format("header length {} is absurd (the file has {} bytes; the limit is {})", header_bytes,
                           in.size(), kMaxHeaderBytes));
  }
  if (header_bytes > in.size() - 8) {
    fail(file, fmt::format("truncated (or corrupt header length): the header length says {} bytes but only {} follow",
                           header_bytes, in.size() - 8));
  }
  std::string text(header_bytes, '\0');
  in.read_at(8, text.data(), header_bytes);
  json header = parse_header(file, text);

  const std::uint64_t data_start = 8 + header_bytes;
  const std::uint64_t data_bytes = in.size() - data_start;
  SafetensorsContents contents;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      contents.metadata = parse_metadata(file, value);
    } else {
      entries.push_back(parse_entry(file, key, value, data_bytes));
    }
  }

  // The spec requires the data buffer to be fully indexed: tensors tile it without overlap or gap.
  std::vector<const HeaderEntry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  const HeaderEntry* previous = nullptr;
  for (const HeaderEntry* e : by_offset) {
    if (e->begin < covered) {
      fail(file, fmt::format("overlapping tensors: '{}' [{}, {}] overlaps '{}' [{}, {}]", e->name, e->begin, e->end,
                             previous->name, previous->begin, previous->end));
    }
    if (e->begin > covered) {
      fail(file, fmt::format("hole in the data buffer: bytes [{}, {}) before tensor '{}' belong to no tensor", covered,
                             e->begin, e->name));
    }
    covered = e->end;
    previous = e;
  }
  if (covered != data_bytes) {
    fail(file, fmt::format("hole in the data buffer: bytes [{}, {}) at its end belong to no tensor", covered,
                           data_bytes));
  }

  // Sorted by name (entries come from a std::map-backed object, already in key order).
  for (const auto& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.read_at(data_start + e.begin, t.raw(), e.end - e.begin);
    if (e.dtype == DType::boolean) {
      const unsigned char* p = static_cast<const unsigned char*>(t.raw());
      for (std::size_t i = 0; i < t.bytes(); ++i) {
        if (p[i] > 1) {
          fail(file, fmt::format("tensor '{}': BOOL element {} has byte value {} (must be 0 or 1)", e.name, i,
                                 static_cast<int>(p[i])));
        }
      }
    }
    contents.tensors.insert(e.name, t);
  }
  return contents;
}

std::string shard_file_name(int index_from_one, int count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index_from_one, count);
}

namespace {

bool is_shard_file_name(const std::string& name) {
  // model-DDDDD-of-DDDDD.safetensors
  if (name.size() != 32 || name.rfind("model-", 0) != 0 || name.substr(11, 4) != "-of-" ||
      name.substr(20) != ".safetensors") {
    return false;
  }
  for (std::size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19}) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

// Removes files of the other layout (or of an older sharding) so that readers see one layout.
void remove_stale_model_files(const fs::path& dir, const std::set<std::string>& keep) {
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    bool model_file = name == kSingleFile || name == kIndexFile || is_shard_file_name(name);
    if (model_file && !keep.count(name)) stale.push_back(entry.path());
  }
  for (const auto& p : stale) fs::remove(p);
  if (!stale.empty()) fsync_directory(dir);
}

std::string read_whole_file(const fs::path& file) {
  InputFile in(file);
  std::string text(in.size(), '\0');
  in.read_at(0, text.data(), in.size());
  return text;
}

}  // namespace

void write_sharded_safetensors(const fs::path& dir, const TensorMap& tensors, std::int64_t max_shard_bytes,
                               const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes <= 0) fail(dir, fmt::format("max_shard_bytes must be positive, got {}", max_shard_bytes));
  fs::create_directories(dir);

  std::vector<TensorMap> shards(1);
  std::uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& name : tensors.names()) {
    const Tensor& t = tensors.at(name);
    if (shard_bytes > 0 && shard_bytes + t.bytes() > static_cast<std::uint64_t>(max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().insert(name, t);
    shard_bytes += t.bytes();
    total_bytes += t.bytes();
  }

  if (shards.size() == 1) {
    write_safetensors(dir / kSingleFile, tensors, metadata);
    remove_stale_model_files(dir, {std::string(kSingleFile)});
    return;
  }

  const int count = static_cast<int>(shards.size());
  std::set<std::string> written{std::string(kIndexFile)};
  json weight_map = json::object();
  for (int i = 0; i < count; ++i) {
    std::string file_name = shard_file_name(i + 1, count);
    write_safetensors(dir / file_name, shards[static_cast<std::size_t>(i)], metadata);
    for (const auto& name : shards[static_cast<std::size_t>(i)].names()) weight_map[name] = file_name;
    written.insert(file_name);
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  write_file_durably(dir / kIndexFile, index.dump(2) + "\n");
  remove_stale_model_files(dir, written);
}

SafetensorsContents read_model_files(const fs::path& dir) {
  const fs::path index_path = dir / kIndexFile;
  if (fs::exists(index_path) && fs::exists(dir / kSingleFile)) {
    fail(dir, "holds both model.safetensors and model.safetensors.index.json; expected one (which is the model?)");
  }
  if (!fs::exists(index_path)) {
    if (!fs::exists(dir / kSingleFile)) fail(dir, "no model.safetensors or model.safetensors.index.json");
    return read_safetensors(dir / kSingleFile);
  }

  json index;
  try {
    index = parse_json(read_whole_file(index_path));
  } catch (const json::exception& e) {
    fail(index_path, fmt::format("invalid JSON: {}", e.what()));
  }
  if (!index.is_object()) fail(index_path, "not a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) fail(index_path, "missing object \"weight_map\"");
  std::optional<std::uint64_t> declared_total;
  if (auto meta = index.find("metadata"); meta != index.end() && meta->is_object()) {
    if (auto total = meta->find("total_size"); total != meta->end()) declared_total = as_non_negative_integer(*total);
  }
  if (!declared_total) fail(index_path, "missing non-negative integer \"metadata.total_size\"");

  std::map<std::string, std::string> weight_map;  // tensor -> shard file
  std::set<std::string> shard_files;
  for (const auto& [name, file] : map_it->items()) {
    if (!file.is_string()) fail(index_path, fmt::format("weight_map entry '{}' is not a file name string", name));
    std::string file_name = file.get<std::string>();
    if (file_name.empty() || file_name == "." || file_name == ".." || file_name.find('/') != std::string::npos) {
      fail(index_path, fmt::format("weight_map entry '{}' names '{}', which is not a file in this directory", name,
                                   file_name));
    }
    weight_map[name] = file_name;
    shard_files.insert(file_name);
  }

  SafetensorsContents result;
  std::map<std::string, Tensor> found;
  std::map<std::string, std::string> found_in;
  bool have_metadata = false;
  std::uint64_t total_bytes = 0;
  for (const auto& file_name : shard_files) {
    const fs::path shard = dir / file_name;
    if (!fs::exists(shard)) {
      fail(index_path, fmt::format("missing shard file: weight_map names '{}', which does not exist", file_name));
    }
    SafetensorsContents part = read_safetensors(shard);
    if (!have_metadata) {
      result.metadata = part.metadata;
      have_metadata = true;
    }
    for (const auto& name : part.tensors.names()) {
      if (auto it = found_in.find(name); it != found_in.end()) {
        fail(index_path, fmt::format("tensor '{}' is in two shards: '{}' and '{}'", name, it->second, file_name));
      }
      auto mapped = weight_map.find(name);
      if (mapped == weight_map.end()) {
        fail(index_path, fmt::format("tensor '{}' in shard '{}' is missing from weight_map", name, file_name));
      }
      if (mapped->second != file_name) {
        fail(index_path, fmt::format("tensor '{}' is in shard '{}' but weight_map places it in '{}'", name, file_name,
                                     mapped->second));
      }
      const Tensor& t = part.tensors.at(name);
      found[name] = t;
      found_in[name] = file_name;
      total_bytes += t.bytes();
    }
  }
  for (const auto& [name, file_name] : weight_map) {
    if (!found.count(name)) {
      fail(index_path, fmt::format("tensor '{}' is missing: weight_map places it in '{}', which does not hold it", name,
                                   file_name));
    }
  }
  if (total_bytes != *declared_total) {
    // A shard the index names no tensor of is never read: say so when it would explain the sum.
    std::string unnamed;
    std::error_code ec;  // (a hint: a folder that cannot be listed leaves it out, not the message)
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string file = it->path().filename().string();
      if (it->path().extension() == ".safetensors" && !shard_files.count(file)) unnamed.append(", '").append(file).append("'");
    }
    fail(index_path, fmt::format("metadata.total_size is {} but the shards hold {} bytes of tensors{}", *declared_total,
                                 total_bytes,
                                 unnamed.empty() ? ""
                                                 : " (weight_map names no tensor of " + unnamed.substr(2) +
                                                       " in this folder: are its tensors missing from weight_map?)"));
  }
  for (auto& [name, t] : found) result.tensors.insert(name, t);
  return result;
}

}  // namespace atl

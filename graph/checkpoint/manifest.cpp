#include "graph/checkpoint/manifest.hpp"

#include <cstdio>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/json_file.hpp"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const fs::path& file, const std::string& fault) {
  throw CheckpointError(fmt::format("{}: {}", file.string(), fault));
}

bool is_step_number(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  return digits > 0 && digits <= 18 && (text.size() == digits || (text.size() == digits + 1 && text.back() == '\n'));
}

}  // namespace

std::string file_checksum(const fs::path& file) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), std::fclose);
  if (!f) fail(file, "cannot open");
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  if (!state || XXH3_128bits_reset(state.get()) != XXH_OK) throw std::bad_alloc();
  std::vector<char> buffer(std::size_t{1} << 20);
  std::size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f.get())) > 0) XXH3_128bits_update(state.get(), buffer.data(), n);
  if (std::ferror(f.get())) fail(file, "read failed");
  const XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

json make_manifest(const fs::path& dir, std::int64_t step, const std::string& marker) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == marker || !entry.is_regular_file()) continue;
    files[name] = {{"bytes", entry.file_size()}, {"xxh3_128", file_checksum(entry.path())}};
  }
  return {{"format", kManifestFormat}, {"step", step}, {"files", files}};
}

bool verify_manifest(const fs::path& dir, const std::string& marker) {
  const fs::path marker_file = dir / marker;
  const std::string text = read_text_file(marker_file);
  if (is_step_number(text)) return false;  // saved before manifests existed
  json manifest;
  try {
    manifest = parse_json(text);
  } catch (const json::exception&) {  // malformed or nested too deep
    fail(marker_file, "not a checkpoint manifest (expected the JSON object a save writes last)");
  }
  const bool format_ok = manifest.is_object() && manifest.contains("format") && manifest.at("format").is_string() &&
                         manifest.at("format").get<std::string>() == kManifestFormat;
  if (!format_ok || !manifest.contains("files") ||
      !manifest.at("files").is_object()) {
    fail(marker_file, fmt::format("not a checkpoint manifest (expected \"format\": \"{}\" and \"files\")",
                                  kManifestFormat));
  }
  const json& files = manifest.at("files");
  for (const auto& [name, entry] : files.items()) {
    const fs::path file = dir / name;
    if (name.find('/') != std::string::npos || name == marker) fail(marker_file, "lists a bad file name '" + name + "'");
    if (!entry.is_object() || !entry.contains("bytes") || !entry.at("bytes").is_number_unsigned() ||
        !entry.contains("xxh3_128") || !entry.at("xxh3_128").is_string()) {
      fail(marker_file, "entry for '" + name + "' lacks bytes or xxh3_128");
    }
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) fail(file, "missing (listed in the checkpoint's manifest)");
    const auto bytes = fs::file_size(file, ec);
    if (bytes != entry.at("bytes").get<std::uintmax_t>()) {
      fail(file, fmt::format("{} bytes, the manifest says {}: the file changed after the save", bytes,
                             entry.at("bytes").get<std::uintmax_t>()));
    }
    if (file_checksum(file) != entry.at("xxh3_128").get<std::string>()) {
      fail(file, "checksum differs from the manifest: the file changed after the save (corrupted or edited)");
    }
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != marker && !files.contains(name)) fail(entry.path(), "not part of the checkpoint as saved (not in its manifest)");
  }
  return true;
}

}  // namespace atl

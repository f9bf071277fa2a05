// A checkpoint's COMPLETE file is its manifest: the size and XXH3-128 checksum of every other
// file, written last. Loading verifies it, so a flipped byte, a truncated or swapped file, or an
// extra one is refused naming the file (a marker with arbitrary content is not a checkpoint).
//   {"format": "atoll-checkpoint-manifest/1", "step": 10,
//    "files": {"model.safetensors": {"bytes": 1234, "xxh3_128": "0f3a..."}, ...}}
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace atl {

inline constexpr const char* kManifestFormat = "atoll-checkpoint-manifest/1";

// The XXH3-128 of a file's bytes, as 32 hex digits.
std::string file_checksum(const std::filesystem::path& file);

// The manifest of every regular file in `dir` except `marker` (the manifest's own name).
nlohmann::json make_manifest(const std::filesystem::path& dir, std::int64_t step, const std::string& marker);

// Checks `dir` against the manifest in dir/marker; throws CheckpointError naming the first file
// that is missing, of another size, with another checksum, or not listed. A marker holding only a
// step number (checkpoints of atoll before manifests) is accepted unverified: returns false.
bool verify_manifest(const std::filesystem::path& dir, const std::string& marker);

}  // namespace atl

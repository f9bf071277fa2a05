// safetensors files as Hugging Face writes and reads them (MODELS.md §10.5):
//   8-byte little-endian header length N | N bytes of JSON header, space-padded to a multiple of 8 |
//   the data buffer, every byte of which belongs to exactly one tensor.
// Header: {"__metadata__": {string: string}, name: {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}, ...}, offsets relative to the data buffer.
// atoll writes tensors ordered by (element size descending, name), so each is aligned to its
// element size, and BOOL bytes are 0 or 1. dtypes: F32, BF16, I32, I64, BOOL.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/param.hpp"

namespace atl {

// "F32", "BF16", "I32", "I64", "BOOL".
std::string_view safetensors_dtype_name(DType dtype);

// Writes `file` durably (temporary name, fsync, rename). Tensors must be defined CPU tensors;
// no tensor may be called "__metadata__". Empty metadata writes no "__metadata__" entry.
void write_safetensors(const std::filesystem::path& file, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

struct SafetensorsContents {
  TensorMap tensors;  // sorted by name (not in file order), so the result does not depend on the writer
  std::map<std::string, std::string> metadata;
};

// Reads and validates a whole file; throws CheckpointError "<file>: <fault>" on any deviation from
// the format (truncation, bad JSON, unknown dtype, bad shape or offsets, overlaps, holes, bad bools).
SafetensorsContents read_safetensors(const std::filesystem::path& file);

// The name of one HF shard: "model-00002-of-00005.safetensors".
std::string shard_file_name(int index_from_one, int count);

// Writes `dir/model.safetensors` when all tensor bytes fit in max_shard_bytes, else shards
// `dir/model-0000i-of-0000n.safetensors` (greedy in TensorMap order; a tensor larger than a shard gets
// its own) plus `dir/model.safetensors.index.json` {"metadata": {"total_size": tensor bytes},
// "weight_map": {name: file}}. Each file is written durably, and the layout not chosen (and shards
// of an older, larger layout) is removed afterwards; atomicity across files comes from writing into a
// fresh directory (see checkpoint_dir.hpp).
void write_sharded_safetensors(const std::filesystem::path& dir, const TensorMap& tensors,
                               std::int64_t max_shard_bytes,
                               const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Reads `dir/model.safetensors.index.json` and its shards when the index exists, else
// `dir/model.safetensors`. Validates the index: shard files exist, every tensor sits in the shard
// the weight_map names and in no other, no tensor is missing from the map, total_size matches the
// tensor bytes. Tensors are sorted by name; metadata is that of the first shard (by file name).
SafetensorsContents read_model_files(const std::filesystem::path& dir);

}  // namespace atl

// Checkpoint <-> HF layout (atoll-convert): a training checkpoint holds native tensors; an HF
// directory holds the family's HF names and layout (model.safetensors or shards + index) and
// config.json.
#pragma once
#include <cstdint>
#include <filesystem>

#include "graph/config.hpp"
#include "kernels/dtype.hpp"

namespace atl {

// The run config a checkpoint was saved with (trainer_state.json "config").
RunConfig checkpoint_run_config(const std::filesystem::path& checkpoint_dir);

// Writes `out_dir` (which must not exist; it appears whole or not at all). bulk_dtype bf16 rounds
// bulk tensors to bf16; island tensors always stay fp32 (MODELS.md §10.5.2).
void export_hf(const std::filesystem::path& checkpoint_dir, const std::filesystem::path& out_dir, DType bulk_dtype,
               std::int64_t max_shard_bytes);

// Reads an HF directory for the model `config` describes and saves it as a training checkpoint
// (step 0, fresh optimizer state) under `checkpoint_root`; returns the checkpoint directory.
std::filesystem::path import_hf(const std::filesystem::path& hf_dir, const RunConfig& config,
                                const std::filesystem::path& checkpoint_root);

}  // namespace atl

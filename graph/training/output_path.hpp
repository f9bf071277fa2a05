// Output paths (run_dir, checkpoint.dir, --trace, --dump-logits) are checked before any work, so
// a typo fails in a second with exit 2 instead of after the run.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace atl {

// Throws ConfigError(`file`, `key`, ...) unless `path` is a directory (a file, for `as_file`) this
// process can create or write: an existing one must be writable, a missing one's nearest existing
// ancestor must be a writable directory (a file's missing folders are created when it is written),
// and none may lie inside a saved checkpoint (which would then fail to load).
void check_output_path(const std::filesystem::path& path, bool as_file, const std::string& file, const std::string& key);
// An input an output file must not replace: a file, or a directory (nothing inside it either).
struct RunInput {
  std::string path;  // "" for none
  std::string what;  // "the config file", "the checkpoint.load directory"
  bool directory = false;
};
// Throws ConfigError(`file`, `key`, ...) when the output file `out` is one of `inputs` or lies
// inside one of their directories (paths compared after resolving links and "..").
void check_replaces_no_input(const std::string& out, const std::vector<RunInput>& inputs, const std::string& file,
                             const std::string& key);

// The --trace file of node `node_rank` of a multi-process job: node 0's is `path` itself, node N's
// has ".nodeN" before the extension ("trace.json" -> "trace.node1.json"), on that node's own disk.
std::string node_trace_path(const std::string& path, int node_rank);
// The missing folders of an output file checked above, made just before it is written.
void create_parent_folders(const std::filesystem::path& file);

}  // namespace atl

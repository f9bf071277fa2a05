// Before anything large is allocated: does the run fit in this machine's memory? An estimate of
// the process's peak (parameters, gradients, AdamW state, the sim's per-rank buffers, and the
// activations of the micro-batches in flight) against what is available (MemAvailable, the
// cgroup's memory.max, RLIMIT_AS). Over it: a ConfigError naming the keys that drive the biggest
// part, instead of an OOM kill or std::bad_alloc mid-run. The estimate is coarse (within a small
// factor); ATOLL_SKIP_MEMORY_CHECK=1 skips the check.
#pragma once
#include <filesystem>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/models/model.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"

namespace atl {

struct MemoryPart {
  std::string what;  // with the keys that drive it
  double bytes = 0;
  std::string key;  // the config key a refusal names when this part is the largest
};

struct RunMemoryEstimate {
  std::vector<MemoryPart> parts;
  double total() const;
};

// The memory a run of `config` takes in this process; ranks_here: as ranks_in_process (run.hpp).
RunMemoryEstimate estimate_run_memory(const RunConfig& config, const Model& model, int ranks_here = 0);

// The step program whose gathers the memory estimates replay (graph/plan/memory.hpp): the one the
// engine runs, with two micro-batches at most (its peak repeats from the second on: a huge batch
// compiles no more; a batch the mesh cannot split, which atoll-train refuses, with one).
// nullopt for pp or cp > 1 (no program is compiled for them yet).
std::optional<StepProgram> memory_program(const RunConfig& config, const Model& model, const Plan& plan);

// Bytes this process may still allocate (nullopt: unknown).
std::optional<double> available_memory_bytes();

// The room its memory cgroup leaves this process: limit less usage, the least over the cgroup
// and its ancestors (a parent's limit binds too). The cgroup is read from `proc_cgroup`
// (/proc/self/cgroup) and found under `mount` (/sys/fs/cgroup): v2 (memory.max, memory.current)
// or v1 (memory/..., memory.limit_in_bytes, memory.usage_in_bytes); a path not there (a
// container's own cgroup mounted as the root) falls back to the mount's root. nullopt: no limit.
std::optional<double> cgroup_memory_room(const std::filesystem::path& mount = "/sys/fs/cgroup",
                                         const std::filesystem::path& proc_cgroup = "/proc/self/cgroup");

// Throws ConfigError when the estimate exceeds the available memory (or a size overflows).
void check_memory_preflight(const RunConfig& config, const Model& model, int ranks_here = 0);

}  // namespace atl

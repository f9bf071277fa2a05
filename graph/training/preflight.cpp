#include "graph/training/preflight.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "graph/plan/memory.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/run.hpp"

namespace atl {

namespace {

double gib(double bytes) { return bytes / double(std::int64_t{1} << 30); }

// /proc/meminfo's MemAvailable, in bytes.
std::optional<double> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return std::nullopt;
}

// A number from a cgroup file: nullopt when missing, "max", or v1's "unlimited" (about 2^63).
std::optional<double> cgroup_number(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value >= 0x1p62) return std::nullopt;
  return value;
}

// RLIMIT_AS minus the address space in use (VmSize).
std::optional<double> address_space_room() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmSize:", 0) == 0) {
      const double used = std::strtod(line.c_str() + 7, nullptr) * 1024.0;
      return std::max(0.0, static_cast<double>(limit.rlim_cur) - used);
    }
  }
  return static_cast<double>(limit.rlim_cur);
}

// The partial sums a pairwise tree over n micro-batches' gradients holds at most (a binary
// counter of sums: one per set bit).
double tree_partials(double n) { return n > 1 ? std::floor(std::log2(n)) + 1.0 : 1.0; }

// Bytes a rank holds per micro-batch of a step besides tensors (its step program's instructions
// and collectives, compiled for every micro-batch, and its batch slice's bookkeeping): peak RSS
// grew 3.4-5.6 KB a micro-batch over beam-tiny runs with 8192 and 32768 micro-batches a rank (an
// upper bound: the gradient trees' growth is in it too).
constexpr double kBytesPerMicroBatch = 6144;

double field(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

double RunMemoryEstimate::total() const {
  double sum = 0;
  for (const auto& p : parts) sum += p.bytes;
  return sum;
}

namespace {

// Micro-batches a rank runs in a step (the reference trainer, one rank: all of them); one for a
// batch the mesh cannot split, which atoll-train refuses and atoll-plan shows.
int micro_batches_or_one(const RunConfig& config, const Mesh& mesh) {
  try {
    return micro_batches_per_rank(config, mesh);
  } catch (const ConfigError&) {
    return 1;
  }
}

}  // namespace

RunMemoryEstimate estimate_run_memory(const RunConfig& config, const Model& model, int ranks_here) {
  // Counted in double: absurd sizes must not overflow on the way to being refused.
  double params = 0;
  for (const auto& s : model.specs()) {
    double n = 1;
    for (auto d : s.shape) n *= static_cast<double>(d);
    params += n;
  }
  const bool reference = config.topology.engine == Engine::reference;
  const double ranks = ranks_in_process(config, ranks_here);
  const double threads = static_cast<double>(compute_threads(config, ranks_here));
  RunMemoryEstimate e;
  const Mesh mesh(config.topology.mesh, config.source_file);
  const double per_rank = micro_batches_or_one(config, mesh);
  // The reference trainer runs its micro-batches in waves of one per thread.
  const double wave = std::min(threads, per_rank);
  if (reference) {
    // fp32 master, the summed gradient, two moments, the initial copy; one gradient per micro-batch
    // of a wave; the partial sums of the tree that adds them in order.
    e.parts.push_back({"parameters, gradients and AdamW state (model size)", 20.0 * params, "model"});
    e.parts.push_back({"gradients of a wave of micro-batches (model size x min(compute.threads, micro-batches))",
                       4.0 * params * wave, threads < per_rank ? "compute.threads" : "train.micro_batch"});
    e.parts.push_back({"the gradient sum's partial sums (model size x log2 of the micro-batches; train.micro_batch)",
                       4.0 * params * (tree_partials(per_rank) - 1.0), "train.micro_batch"});
  } else {
    // The sim holds every rank: the plan's per-rank estimate (shards, state, gathered units with
    // their padding: a tensor with fewer dim-0 rows than ranks pads to one row per rank), the
    // unsharded gradients waiting for their reduce-scatter and each micro-batch's bookkeeping.
    const Plan plan = make_plan(model.specs(), model.sharding_rules(), mesh, config.precision);
    const std::optional<StepProgram> program = memory_program(config, model, plan);
    const MemoryEstimate m = estimate_memory(plan, 0, program ? &*program : nullptr);
    // Unsharded fp32 gradients waiting for the step's reduce-scatter. One micro-batch a rank: a
    // unit's gradient lives from its backward to its reduce-scatter (about the gathered peak).
    // More: after the first, every unit holds its gradient tree's partial sums until the last (an
    // expert group one tree per source rank of its ep group).
    double unsharded = 4.0 * static_cast<double>(m.peak_gathered_bytes);
    if (per_rank > 1) {
      unsharded = 0;
      for (const UnitPlan& u : plan.units) {
        if (u.stage != 0) continue;
        const double sources = u.role == UnitRole::experts ? plan.mesh.ep() : 1;
        unsharded += 4.0 * static_cast<double>(u.shard_count) * static_cast<double>(u.shard_numel) * sources *
                     tree_partials(per_rank);
      }
    }
    // A fresh model is generated shard by shard, but a checkpoint (and a resume, which cuts shards
    // from full tensors) holds the whole fp32 master and both moments in the process.
    e.parts.push_back({"the full model state a checkpoint gathers (master and two moments, model size x 3)",
                       12.0 * params, "model"});
    e.parts.push_back({"per-rank shards and gathers (this process's ranks x the plan's per-rank estimate, atoll-plan "
                       "prints it)",
                       ranks * static_cast<double>(m.total_bytes()),
                       // the sim's part grows with the mesh, unless there is one rank: then it is the model
                       config.topology.mesh.world_size() > 1 ? "topology.mesh" : "model"});
    e.parts.push_back({"unsharded gradients before their reduce-scatter (this process's ranks x the padded model, "
                       "or its unit gathers with one micro-batch a rank; x log2 of the micro-batches a rank)",
                       ranks * unsharded, per_rank > 1 ? "train.micro_batch" : "topology.mesh"});
    e.parts.push_back({"the step program and batch slices of every micro-batch (ranks x micro-batches a rank)",
                       ranks * per_rank * kBytesPerMicroBatch, "train.global_batch"});
  }
  const nlohmann::json hf = model.hf_config();
  const double H = field(hf, "hidden_size"), L = field(hf, "num_hidden_layers"), V = field(hf, "vocab_size");
  const double mlp = std::max(field(hf, "intermediate_size"),
                              3.0 * field(hf, "num_experts_per_tok") * field(hf, "moe_intermediate_size"));
  const double per_token = 4.0 * (L * (16.0 * H + 3.0 * mlp) + 3.0 * V);
  const double tokens = static_cast<double>(config.train.micro_batch) * static_cast<double>(config.train.seq_len);
  // Micro-batches alive at once: a wave of the reference's; per rank one, or all of a rank's
  // with train.schedule all_forward_first.
  const double alive = reference ? wave : ranks * (config.train.schedule == StepSchedule::one_at_a_time ? 1.0 : per_rank);
  e.parts.push_back({"activations (train.micro_batch x train.seq_len tokens per micro-batch, model.hidden_size, "
                     "model.num_hidden_layers, model.vocab_size; train.schedule)",
                     per_token * tokens * alive,
                     // the larger factor of a micro-batch's tokens
                     config.train.micro_batch > config.train.seq_len ? "train.micro_batch" : "train.seq_len"});
  // The global batch itself (ids, positions, masks, targets).
  e.parts.push_back({"the global batch (train.global_batch x train.seq_len)",
                     32.0 * static_cast<double>(config.train.global_batch) * static_cast<double>(config.train.seq_len),
                     "train.global_batch"});
  return e;
}

std::optional<StepProgram> memory_program(const RunConfig& config, const Model& model, const Plan& plan) {
  if (plan.mesh.pp() > 1 || plan.mesh.cp() > 1) return std::nullopt;
  const int micro_batches = std::min(micro_batches_or_one(config, plan.mesh), 2);
  return compile_step_program(plan, model.ops(), micro_batches, config.train.schedule, config.topology.ep_dispatch);
}

std::optional<double> cgroup_memory_room(const std::filesystem::path& mount, const std::filesystem::path& proc_cgroup) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // v2 when the mount is the unified hierarchy, else v1's memory controller.
  const bool v2 = fs::exists(mount / "cgroup.controllers", ec);
  const fs::path base = v2 ? mount : mount / "memory";
  const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
  std::string path;  // this process's cgroup, relative to the hierarchy's root
  std::ifstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);) {  // "id:controllers:path"
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool memory = v2 ? line.compare(0, first, "0") == 0 && controllers.empty()
                           : ("," + controllers + ",").find(",memory,") != std::string::npos;
    if (memory) path = line.substr(second + 1);
  }
  fs::path dir = base / fs::path(path).relative_path();
  if (path.empty() || !fs::is_directory(dir, ec)) dir = base;
  std::optional<double> room;
  for (fs::path d = dir;; d = d.parent_path()) {
    const std::optional<double> limit = cgroup_number(d / limit_file), usage = cgroup_number(d / usage_file);
    if (limit) room = std::min(room.value_or(*limit), std::max(0.0, *limit - usage.value_or(0.0)));
    if (d == base || !d.has_relative_path() || d.parent_path() == d) break;
  }
  return room;
}

std::optional<double> available_memory_bytes() {
  std::optional<double> room;
  for (auto candidate : {mem_available(), cgroup_memory_room(), address_space_room()}) {
    if (candidate) room = room ? std::min(*room, *candidate) : *candidate;
  }
  return room;
}

void check_memory_preflight(const RunConfig& config, const Model& model, int ranks_here) {
  const char* skip = std::getenv("ATOLL_SKIP_MEMORY_CHECK");
  if (skip && std::string(skip) == "1") return;
  const RunMemoryEstimate e = estimate_run_memory(config, model, ranks_here);
  const std::optional<double> room = available_memory_bytes();
  if (!room || e.total() <= *room) return;
  const auto biggest = std::max_element(e.parts.begin(), e.parts.end(),
                                        [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
  // Figures that would read alike at one decimal ("needs 0.5, has 0.5") get two more.
  const int digits = fmt::format("{:.1f}", gib(e.total())) == fmt::format("{:.1f}", gib(*room)) ? 3 : 1;
  throw ConfigError(config.source_file, biggest->key,
                    fmt::format("the run needs about {:.{}f} GiB, this machine has {:.{}f} GiB available; the largest "
                                "part is {} at {:.1f} GiB (ATOLL_SKIP_MEMORY_CHECK=1 skips this estimate)",
                                gib(e.total()), digits, gib(*room), digits, biggest->what, gib(biggest->bytes)));
}

}  // namespace atl

// The YAML run config (docs/config.md lists every key): loaded, overridden with --set, validated,
// and resolved into plain structs. Errors are ConfigError naming the file and the dotted key.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "graph/config_reader.hpp"
#include "graph/data/data_config.hpp"
#include "graph/expert_flow.hpp"
#include "graph/step_schedule.hpp"
#include "kernels/precision.hpp"

namespace atl {

enum class Backend { sim, ucx, nccl };
const char* backend_name(Backend backend);

// Mesh axes, outer to inner (MODELS.md §5.1). ep re-factors the non-pp ranks; it is not a
// separate factor of the world size.
struct MeshConfig {
  std::int64_t pp = 1;
  std::int64_t dp_replicate = 1;
  std::int64_t dp_shard = 1;
  std::int64_t cp = 1;
  std::int64_t ep = 1;
  std::int64_t world_size() const { return pp * dp_replicate * dp_shard * cp; }
};

// Which engine runs the steps: the actor runtime (default) or the single-process reference
// trainer (one rank only; the yardstick the runtime is tested against).
enum class Engine { actors, reference };
const char* engine_name(Engine engine);

// One node of a ucx job as the topology lists it (topology.nodes).
struct NodeEntry {
  std::string host;         // where it runs; node 0's host and port take the rendezvous
  std::int64_t port = 29500;
  std::int64_t ranks = 0;   // ranks it runs (the entries' ranks add up to the mesh's world size)
};

struct TopologyConfig {
  Backend backend = Backend::sim;
  Engine engine = Engine::actors;
  MeshConfig mesh;
  ExpertDispatchFlow ep_dispatch = ExpertDispatchFlow::all_to_all;  // how experts ops move tokens (ep > 1)
  // ucx: the job's nodes in node order (empty: placement from flags, torchrun's or Slurm's variables).
  std::vector<NodeEntry> nodes;
  // ucx: UCX's peer error handling (comm/ucx/ucx_world.hpp): survivors name a dead peer; off, one
  // machine's processes talk over shared memory (faster) and a dead peer aborts them in UCX.
  bool ucx_peer_errors = true;
  // ucx: a file holding the job token (graph/launch/job_token.hpp); "" for ATOLL_JOB_TOKEN only.
  std::string job_token_file;
  // ucx: how long nodes wait for every node to join, and for a silent peer before it counts as lost.
  double rendezvous_timeout_s = 120;
  double heartbeat_timeout_s = 5;
  // sim backend only: an injected delay (milliseconds) per collective kind, e.g. {all_gather: 5},
  // to study overlap and slow links. Numerics do not change.
  std::map<std::string, double> sim_delay_ms;
};

struct TrainConfig {
  std::int64_t steps = 0;         // required
  std::int64_t global_batch = 0;  // required: rows per optimizer step
  std::int64_t micro_batch = 0;   // required: rows per forward/backward pass
  std::int64_t seq_len = 0;       // required: tokens per row
  double lr = 0.0;                // required: peak learning rate
  std::int64_t warmup = 0;        // linear warmup steps
  std::uint64_t seed = 0;
  double min_lr_ratio = 0.1;      // cosine decay ends at lr * min_lr_ratio
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;         // global gradient-norm clip; 0 = off
  std::int64_t log_every = 10;
  // A step whose loss or gradient norm is not finite is never applied. stop: the run ends (exit
  // code 3); skip_step: the step is dropped (counted in metrics.jsonl) and the run goes on, until
  // more than max_skipped_steps steps were skipped.
  bool skip_nonfinite_steps = false;
  std::int64_t max_skipped_steps = 10;
  StepSchedule schedule = StepSchedule::one_at_a_time;  // the order of a step's micro-batches (job-wide)
};

struct ModelSection {
  std::string family;     // beam | flint | inkling2
  std::string preset;     // a family preset; empty = the family's default
  YAML::Node overrides;   // every other key of `model:` (a mapping, possibly empty); the family validates it
};

// Training checkpoints (graph/checkpoint): native safetensors + optimizer state + trainer state.
struct CheckpointConfig {
  std::string dir;         // root of the step-NNNNNNNN directories; default <run_dir>/checkpoints
  std::int64_t every = 0;  // save every this many steps and at the last step; 0 = never
  std::int64_t keep = 3;   // complete checkpoints kept (oldest removed first); 0 = all
  std::string load;        // a checkpoint directory whose weights start the run (moments and step fresh)
};

// Threads of one rank's kernels (kernels/cpu/compute_pool.hpp); results do not depend on them.
struct ComputeConfig {
  std::int64_t threads = 0;  // 0 = every core for a process that runs one rank, else one per rank
  // compute.bf16_gemm: "chain" (false: gemm.hpp's FMA order, the same bits on every CPU) or "amx"
  // (true: AMX tiles for bf16 operands, faster; the same bits only among CPUs with AMX).
  bool bf16_amx = false;
};

struct RunConfig {
  std::string source_file;  // the YAML file this came from
  std::string run_dir;
  ModelSection model;
  TopologyConfig topology;
  Precision precision = Precision::bf16;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  ComputeConfig compute;
};

// The most tokens a step may hold (global_batch x seq_len): beyond it, sizes overflow.
inline constexpr std::int64_t kMaxStepTokens = std::int64_t{1} << 31;

// Reads `path`, applies each `key.path=value` of `sets` to the YAML tree (the value is parsed as
// YAML; missing mappings on the path are created), then validates. Throws ConfigError.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& sets = {});
// The same from YAML text; `source_name` stands in for the file name in errors.
RunConfig parse_run_config(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& sets = {});
// checkpoint.dir when the config names none: <run_dir>/checkpoints.
std::string default_checkpoint_dir(const std::string& run_dir);

// Called in a handler of `e`: rethrows it, or, when one of `sets` gave its key (the key, or a
// mapping holding it), the same error ending "(given by --set key=value)": a value from the
// command line is named as such. load_run_config does this for what it checks.
[[noreturn]] void rethrow_naming_set(const ConfigError& e, const std::vector<std::string>& sets);
// That error's message: what the apps print for any ConfigError, since some checks come after the
// config is read (the family's model keys, the mesh against the model, the data source).
std::string message_naming_set(const ConfigError& e, const std::vector<std::string>& sets);

// The settings of multi-process jobs, as to_json lists them under "topology" (nodes,
// ucx_peer_errors, job_token_file and the two timeouts): a sim run refuses them at other than
// their defaults (multi_process_settings({})).
nlohmann::json multi_process_settings(const TopologyConfig& topology);

// The resolved config, defaults and overrides included (model overrides appear as keys of "model").
nlohmann::json to_json(const RunConfig& config);
// A resolved config as run.json or trainer_state.json saved it, in to_json's form today: builds
// before 2026-12-03 wrote model overrides given as yes/no/on/off as strings, which the config
// had read as booleans (no model key takes those words as a string).
nlohmann::json saved_config_as_read(nlohmann::json saved);

// The families `model.family` accepts, and the values of `topology.backend`.
const std::vector<std::string>& model_families();
const std::vector<std::string>& backends();

}  // namespace atl

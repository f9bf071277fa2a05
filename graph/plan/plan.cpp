#include "graph/plan/plan.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/config_reader.hpp"

namespace atl {

namespace {


// The module that holds a param: its name without the last segment ("" for a top-level param).
std::string module_of(const std::string& param) {
  const auto dot = param.rfind('.');
  return dot == std::string::npos ? std::string() : param.substr(0, dot);
}

// The path with activation-checkpoint wrapper segments removed (they are not part of HF names).
std::string without_checkpoint_segments(const std::string& path) {
  static const std::string segment = "_checkpoint_wrapped_module";
  std::string out;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find('.', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    if (part != segment) out += (out.empty() ? "" : ".") + part;
    begin = end + 1;
  }
  return out;
}

bool matches_fp32_entry(const std::string& module_path, const std::vector<std::string>& entries) {
  const std::string path = without_checkpoint_segments(module_path);
  for (const auto& entry : entries) {
    if (path == entry || path.ends_with("." + entry)) return true;
  }
  return false;
}

// The outermost module on `module_path` that matches the fp32 list, looking only at modules
// strictly below `parent` ("" = any module). Empty when none matches.
std::string island_module(const std::string& parent, const std::string& module_path,
                          const std::vector<std::string>& entries) {
  std::size_t pos = parent.empty() ? 0 : parent.size() + 1;
  while (pos <= module_path.size() && !module_path.empty()) {
    std::size_t end = module_path.find('.', pos);
    if (end == std::string::npos) end = module_path.size();
    const std::string candidate = module_path.substr(0, end);
    if (matches_fp32_entry(candidate, entries)) return candidate;
    pos = end + 1;
  }
  return {};
}

// "model.layers.3.mlp.gate.weight" with prefix "model.layers." -> 3; -1 if not a layer param.
std::int64_t layer_of(const std::string& param, const std::string& prefix) {
  if (prefix.empty() || !param.starts_with(prefix)) return -1;
  std::size_t i = prefix.size();
  std::int64_t layer = 0;
  const std::size_t digits_begin = i;
  while (i < param.size() && param[i] >= '0' && param[i] <= '9' && i - digits_begin < 12) {
    layer = layer * 10 + (param[i] - '0');
    ++i;
  }
  if (i == digits_begin || i >= param.size() || param[i] != '.') return -1;
  return layer;
}

bool under_module(const std::string& param, const std::string& module) { return param.starts_with(module + "."); }

std::string block_name(const FamilyShardingRules& rules, std::int64_t layer) {
  std::string prefix = rules.layer_prefix;
  if (!prefix.empty() && prefix.back() == '.') prefix.pop_back();
  return prefix + "." + std::to_string(layer);
}

// Units being formed, keyed by name, with the order they were first seen.
struct Draft {
  std::string name;
  UnitRole role;
  std::int64_t layer;
  bool island;
  std::vector<const ParamSpec*> specs;
};

// `shape`: what the unit holds (an expert-group unit: its EP slice), sharded on `shard_dim`.
UnitParam layout_param(const std::string& name, const Shape& shape, int shard_dim, int shard_count,
                       std::int64_t offset) {
  UnitParam p;
  p.name = name;
  p.shape = shape;
  if (shape.empty()) {
    p.rows = 1;
    p.row_numel = 1;
  } else {
    p.shard_dim = shard_dim;
    p.rows = shape[static_cast<std::size_t>(shard_dim)];
    p.row_numel = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (static_cast<int>(i) < shard_dim) p.outer *= shape[i];
      if (static_cast<int>(i) > shard_dim) p.row_numel *= shape[i];
    }
  }
  p.rows_per_rank = (p.rows + shard_count - 1) / shard_count;
  p.shard_offset = offset;
  p.shard_numel = p.outer * p.rows_per_rank * p.row_numel;
  return p;
}

[[noreturn]] void fail_island_outside(const ParamSpec& spec, const std::string& unit, const FamilyShardingRules& rules) {
  throw std::invalid_argument(fmt::format(
      "planner ({}): parameter '{}' is an fp32 island but no module on its path matches the fp32 modules [{}], so it "
      "would share unit '{}' with bulk parameters and one gather buffer cannot hold two dtypes; it must be moved into "
      "its own submodule listed among the fp32 modules",
      rules.family, spec.name, fmt::join(rules.fp32_modules, ", "), unit));
}

[[noreturn]] void fail_bulk_inside(const ParamSpec& spec, const std::string& unit, const FamilyShardingRules& rules) {
  throw std::invalid_argument(fmt::format(
      "planner ({}): parameter '{}' is not an fp32 island but sits in fp32 unit '{}' (fp32 modules [{}]), so that "
      "unit would mix dtypes and the param cannot be isolated; it must be moved into its own submodule outside '{}'",
      rules.family, spec.name, unit, fmt::join(rules.fp32_modules, ", "), unit));
}

// MODELS.md §5.6: layers as evenly as possible over the stages, the first (L mod pp) one more.
void assign_stages(Plan& plan) {
  const int stages = plan.mesh.pp();
  std::set<std::int64_t> layer_set;
  for (const auto& u : plan.units) {
    if (u.layer >= 0) layer_set.insert(u.layer);
  }
  const std::vector<std::int64_t> layers(layer_set.begin(), layer_set.end());
  const auto count = static_cast<std::int64_t>(layers.size());
  if (stages > 1 && count < stages) {
    throw ConfigError(plan.mesh.source_file(), "topology.mesh.pp",
                      fmt::format("expected at most {} pipeline stages (one per decoder layer at least), got {}",
                                  count, stages));
  }
  std::map<std::int64_t, int> stage_of_layer;
  std::size_t next = 0;
  for (int stage = 0; stage < stages; ++stage) {
    const std::int64_t take = count / stages + (stage < count % stages ? 1 : 0);
    for (std::int64_t k = 0; k < take; ++k) stage_of_layer[layers[next++]] = stage;
  }
  for (auto& u : plan.units) {
    u.stage = u.layer >= 0 ? stage_of_layer.at(u.layer) : u.role == UnitRole::embedding ? 0 : stages - 1;
  }
}

void check_unique_names(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules) {
  std::set<std::string> seen;
  for (const auto& s : specs) {
    if (!seen.insert(s.name).second) {
      throw std::invalid_argument("planner (" + rules.family + "): parameter '" + s.name + "' is declared twice");
    }
  }
}

// Expert parallelism splits each layer's routed experts evenly over the ep ranks.
void check_expert_split(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules, const Mesh& mesh) {
  if (mesh.ep() == 1) return;
  bool experts = false;
  for (const auto& spec : specs) {
    const std::int64_t layer = layer_of(spec.name, rules.layer_prefix);
    const std::string prefix = block_name(rules, layer) + "." + rules.experts_module + ".";
    if (layer < 0 || spec.name.rfind(prefix, 0) != 0) continue;
    experts = true;
    if (spec.shape.empty() || spec.shape[0] % mesh.ep() != 0) {
      throw ConfigError(mesh.source_file(), "topology.mesh.ep",
                        "expected ep to divide the number of experts of every MoE layer; " + spec.name + " holds " +
                            std::to_string(spec.shape.empty() ? 0 : spec.shape[0]) + " experts, ep is " +
                            std::to_string(mesh.ep()));
    }
  }
  if (!experts) {
    throw ConfigError(mesh.source_file(), "topology.mesh.ep",
                      "expected 1 for a model without routed experts (" + rules.family + "), got " +
                          std::to_string(mesh.ep()));
  }
}

struct Drafts {
  std::map<std::string, Draft> by_name;
  std::vector<std::string> first_seen;
};

// 1. Every param to a draft unit: under a layer, its experts (ep > 1), its island or its block;
// otherwise an embedding, a head, a model-level island or the root.
Drafts draft_units(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules, const Mesh& mesh) {
  Drafts drafts;
  auto assign = [&](const std::string& name, UnitRole role, std::int64_t layer, bool island, const ParamSpec& spec) {
    auto [it, inserted] = drafts.by_name.try_emplace(name, Draft{name, role, layer, island, {}});
    if (inserted) drafts.first_seen.push_back(name);
    it->second.specs.push_back(&spec);
  };
  for (const auto& spec : specs) {
    const std::string module = module_of(spec.name);
    if (const std::int64_t layer = layer_of(spec.name, rules.layer_prefix); layer >= 0) {
      const std::string block = block_name(rules, layer);
      const std::string island = island_module(block, module, rules.fp32_modules);
      const std::string experts = block + "." + rules.experts_module;
      if (mesh.ep() > 1 && under_module(spec.name, experts)) {
        assign(experts, UnitRole::experts, layer, false, spec);  // EP owns them (§5.3 step 1)
      } else if (!island.empty()) {
        assign(island, UnitRole::island, layer, true, spec);
      } else {
        assign(block, UnitRole::block, layer, false, spec);
      }
      continue;
    }
    auto owner = [&](const std::vector<std::string>& modules) -> std::string {
      for (const auto& m : modules) {
        if (under_module(spec.name, m)) return m;
      }
      return {};
    };
    if (const std::string m = owner(rules.embedding_modules); !m.empty()) {
      assign(m, UnitRole::embedding, -1, false, spec);
    } else if (const std::string h = owner(rules.head_modules); !h.empty()) {
      assign(h, UnitRole::head, -1, rules.head_is_island, spec);
    } else if (const std::string island = island_module("", module, rules.fp32_modules); !island.empty()) {
      assign(island, UnitRole::island, -1, true, spec);
    } else {
      assign("model", UnitRole::root, -1, false, spec);
    }
  }
  return drafts;
}

// 2. Every unit must be dtype-uniform.
void check_uniform_dtypes(const Drafts& drafts, const FamilyShardingRules& rules) {
  for (const auto& name : drafts.first_seen) {
    const Draft& d = drafts.by_name.at(name);
    for (const ParamSpec* s : d.specs) {
      if (s->island && !d.island) fail_island_outside(*s, d.name, rules);
      if (!s->island && d.island) fail_bulk_inside(*s, d.name, rules);
      if (s->storage_dtype != d.specs.front()->storage_dtype) {
        throw std::invalid_argument(fmt::format(
            "planner ({}): unit '{}' mixes storage dtypes ({} for '{}', {} for '{}'); parameter '{}' must be moved "
            "into its own submodule",
            rules.family, d.name, dtype_name(d.specs.front()->storage_dtype), d.specs.front()->name,
            dtype_name(s->storage_dtype), s->name, s->name));
      }
    }
  }
}

// 3. Forward execution order (plan.hpp).
std::vector<const Draft*> forward_order(const Drafts& drafts, const FamilyShardingRules& rules) {
  std::vector<const Draft*> order;
  auto take = [&](auto predicate) {
    for (const auto& name : drafts.first_seen) {
      const Draft& d = drafts.by_name.at(name);
      if (predicate(d)) order.push_back(&d);
    }
  };
  for (const auto& m : rules.embedding_modules) {
    if (auto it = drafts.by_name.find(m); it != drafts.by_name.end() && it->second.role == UnitRole::embedding) {
      order.push_back(&it->second);
    }
  }
  std::set<std::int64_t> layers;
  for (const auto& [name, d] : drafts.by_name) {
    if (d.layer >= 0) layers.insert(d.layer);
  }
  for (std::int64_t l : layers) {
    take([&](const Draft& d) { return d.layer == l && d.role == UnitRole::island; });
    take([&](const Draft& d) { return d.layer == l && d.role == UnitRole::block; });
    take([&](const Draft& d) { return d.layer == l && d.role == UnitRole::experts; });
  }
  take([](const Draft& d) { return d.layer < 0 && d.role == UnitRole::island; });
  take([](const Draft& d) { return d.role == UnitRole::root; });
  for (const auto& m : rules.head_modules) {
    if (auto it = drafts.by_name.find(m); it != drafts.by_name.end() && it->second.role == UnitRole::head) {
      order.push_back(&it->second);
    }
  }
  return order;
}

// 4. A unit's layout, policy and schedule (the last layer's and pipeline parallelism's schedules
// are fixed up by make_plan).
UnitPlan layout_unit(const Draft& d, const FamilyShardingRules& rules, const Mesh& mesh, Precision precision) {
  UnitPlan u;
  u.name = d.name;
  u.role = d.role;
  u.layer = d.layer;
  u.island = d.island;
  const bool experts = d.role == UnitRole::experts;
  u.shard_count = experts ? mesh.ep_shard() : mesh.shard_group_size();
  u.shard_axis = experts ? kExpertShardAxis : "dp_shard";
  u.ep_slices = experts ? mesh.ep() : 1;
  u.storage_dtype = d.specs.front()->storage_dtype;
  for (const ParamSpec* s : d.specs) {
    Shape shape = s->shape;
    if (experts) shape[0] /= mesh.ep();  // one EP rank's experts (ep divides E: checked before)
    const int dim = experts && shape.size() >= 2 ? 1 : 0;
    u.params.push_back(layout_param(s->name, shape, dim, u.shard_count, u.shard_numel));
    u.numel += u.params.back().numel();
    u.shard_numel += u.params.back().shard_numel;
  }
  u.policy = d.island ? island_policy() : bulk_policy(precision);
  switch (d.role) {
    case UnitRole::embedding: u.schedule = {true, 0, 0, false}; break;
    case UnitRole::island: u.schedule = {false, 0, 0, true}; break;
    case UnitRole::experts: u.schedule = {true, 0, 0, false}; break;  // gathered for its op only
    case UnitRole::block:
      u.schedule = {true, 1, 2, false};
      if (rules.block_casts_inputs_itself) u.policy.cast_forward_inputs = false;
      break;
    case UnitRole::head:
    case UnitRole::root: u.schedule = {false, 0, 0, false}; break;
  }
  return u;
}

// MODELS.md §6 invariant 4: every parameter is owned by exactly one unit (FSDP or expert group).
void check_single_owner(const Plan& plan, const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules) {
  std::map<std::string, int> owners;
  for (const auto& u : plan.units) {
    for (const auto& p : u.params) ++owners[p.name];
  }
  for (const auto& s : specs) {
    if (owners[s.name] != 1) {
      throw std::logic_error(fmt::format("planner ({}): parameter '{}' is owned by {} units, expected 1", rules.family,
                                         s.name, owners[s.name]));
    }
  }
}

// Each block names the blocks its gathers prefetch, forward and backward.
void resolve_prefetch_units(Plan& plan) {
  std::vector<std::size_t> blocks;
  for (std::size_t i = 0; i < plan.units.size(); ++i) {
    if (plan.units[i].role == UnitRole::block) blocks.push_back(i);
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    UnitPlan& u = plan.units[blocks[b]];
    for (std::size_t k = 1; k <= static_cast<std::size_t>(u.schedule.forward_prefetch) && b + k < blocks.size(); ++k) {
      u.forward_prefetch_units.push_back(plan.units[blocks[b + k]].name);
    }
    for (std::size_t k = 1; k <= static_cast<std::size_t>(u.schedule.backward_prefetch) && k <= b; ++k) {
      u.backward_prefetch_units.push_back(plan.units[blocks[b - k]].name);
    }
  }
}

}  // namespace

const char* unit_role_name(UnitRole role) {
  switch (role) {
    case UnitRole::embedding: return "embedding";
    case UnitRole::island: return "island";
    case UnitRole::block: return "block";
    case UnitRole::experts: return "experts";
    case UnitRole::head: return "head";
    case UnitRole::root: return "root";
  }
  return "?";
}

std::int64_t UnitParam::first_row(int shard_index) const {
  return std::min<std::int64_t>(rows, static_cast<std::int64_t>(shard_index) * rows_per_rank);
}

std::int64_t UnitParam::rows_on(int shard_index) const {
  const std::int64_t begin = first_row(shard_index);
  return std::min<std::int64_t>(rows, begin + rows_per_rank) - begin;
}

const UnitParam& UnitPlan::param(const std::string& param_name) const {
  for (const auto& p : params) {
    if (p.name == param_name) return p;
  }
  throw std::out_of_range("unit '" + name + "' holds no parameter '" + param_name + "'");
}

MixedPrecisionPolicy bulk_policy(Precision precision) {
  const DType compute = compute_dtype(precision);
  return {compute, DType::f32, compute, true};
}

MixedPrecisionPolicy island_policy() { return {DType::f32, DType::f32, DType::f32, false}; }

std::int64_t cp_local_tokens(std::int64_t seq_len, int cp, int chunks_per_rank) {
  if (seq_len < 1 || cp < 1 || chunks_per_rank < 1) {  // (the config and the mesh checked these)
    throw std::invalid_argument(fmt::format("cp_local_tokens: seq_len {}, cp {} and chunks_per_rank {} must be positive",
                                            seq_len, cp, chunks_per_rank));
  }
  const std::int64_t chunks = std::int64_t{cp} * chunks_per_rank;
  return (seq_len + chunks - 1) / chunks * chunks_per_rank;
}

std::size_t Plan::unit_index(const std::string& name) const {
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (units[i].name == name) return i;
  }
  throw std::out_of_range("the plan has no unit named '" + name + "'");
}

const UnitPlan& Plan::unit(const std::string& name) const { return units[unit_index(name)]; }

const UnitPlan& Plan::unit_of_param(const std::string& param) const {
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      if (p.name == param) return u;
    }
  }
  throw std::out_of_range("no unit of the plan owns parameter '" + param + "'");
}

Plan make_plan(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules, const Mesh& mesh,
               Precision precision) {
  check_unique_names(specs, rules);
  check_expert_split(specs, rules, mesh);
  const Drafts drafts = draft_units(specs, rules, mesh);
  check_uniform_dtypes(drafts, rules);
  Plan plan;
  plan.mesh = mesh;
  plan.precision = precision;
  for (const Draft* d : forward_order(drafts, rules)) plan.units.push_back(layout_unit(*d, rules, mesh, precision));
  assign_stages(plan);
  // MODELS.md §5.2, §6.17: no reshard and no prefetch under pipeline parallelism, for every unit
  // (the embedding too): nothing is gathered again for each micro-batch.
  if (mesh.pp() > 1) {
    for (auto& u : plan.units) u.schedule = {false, 0, 0, u.schedule.resident_for_step};
  }
  // MODELS.md §5.2: every layer reshards after forward except the last, needed first in backward:
  // its block and, under expert parallelism, its experts (a unit of their own, of that layer).
  std::int64_t last_block_layer = -1;
  for (const auto& u : plan.units) {
    if (u.role == UnitRole::block) last_block_layer = u.layer;
  }
  if (last_block_layer >= 0) {
    for (auto& u : plan.units) {
      if ((u.role == UnitRole::block || u.role == UnitRole::experts) && u.layer == last_block_layer) {
        u.schedule.reshard_after_forward = false;
      }
    }
  }
  check_single_owner(plan, specs, rules);
  resolve_prefetch_units(plan);
  return plan;
}

}  // namespace atl

#include "graph/plan/format.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/plan/memory.hpp"

namespace atl {

std::string describe_schedule(const GatherSchedule& s) {
  std::string text = s.resident_for_step        ? "resident for step"
                     : s.reshard_after_forward ? "reshard"
                                               : "keep until backward";
  if (s.forward_prefetch > 0) text += fmt::format(", fwd prefetch {}", s.forward_prefetch);
  if (s.backward_prefetch > 0) text += fmt::format(", bwd prefetch {}", s.backward_prefetch);
  return text;
}

std::string format_bytes(std::int64_t bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int u = -1;
  while (value >= 1024.0 && u < 3) {
    value /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", value, units[u]);
}

std::string format_plan(const Plan& plan, const StepProgram* program) {
  const MemoryEstimate memory = estimate_memory(plan, 0, program);
  std::vector<std::string> header = {"unit",  "role",       "params", "elements",      "storage", "param",
                                     "reduce", "inputs",    "shard/rank", "gathered/step", "schedule"};
  const bool staged = plan.mesh.pp() > 1;
  if (staged) header.push_back("stage");
  std::vector<std::vector<std::string>> rows;
  std::int64_t params = 0, elements = 0, shard = 0, gathered = 0, islands = 0;
  for (std::size_t i = 0; i < plan.units.size(); ++i) {
    const UnitPlan& u = plan.units[i];
    const UnitTraffic& t = memory.units[i];
    const std::int64_t model_numel = u.numel * u.ep_slices;  // an expert group: all EP ranks' experts
    rows.push_back({u.name, unit_role_name(u.role), fmt::format("{}", u.params.size()), fmt::format("{}", model_numel),
                    std::string(dtype_name(u.storage_dtype)), std::string(dtype_name(u.policy.param_dtype)),
                    std::string(dtype_name(u.policy.reduce_dtype)), u.policy.cast_forward_inputs ? "cast" : "as is",
                    fmt::format("{}", u.shard_numel), format_bytes(t.bytes_gathered_per_step),
                    describe_schedule(u.schedule)});
    if (staged) rows.back().push_back(fmt::format("{}", u.stage));
    params += static_cast<std::int64_t>(u.params.size());
    elements += model_numel;
    shard += u.shard_numel;
    gathered += t.bytes_gathered_per_step;
    if (u.island) ++islands;
  }
  rows.push_back({"total", "", fmt::format("{}", params), fmt::format("{}", elements), "", "", "", "",
                  fmt::format("{}", shard), format_bytes(gathered), ""});
  if (staged) rows.back().push_back("");

  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
  }
  // Text columns align left, numbers right.
  auto numeric = [](std::size_t c) { return c == 2 || c == 3 || c == 8 || c == 9 || c == 11; };
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c) s += "  ";
      s += numeric(c) ? fmt::format("{:>{}}", cells[c], width[c]) : fmt::format("{:<{}}", cells[c], width[c]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };

  const Mesh& mesh = plan.mesh;
  std::string out = fmt::format("plan: {} units ({} fp32 islands), precision {}, sharded over {} ranks per unit",
                                plan.units.size(), islands, precision_name(plan.precision), mesh.shard_group_size());
  if (mesh.ep() > 1) {
    out += fmt::format(" (expert groups: {} experts per EP rank over ep_shard {})", "1/" + std::to_string(mesh.ep()),
                       mesh.ep_shard());
  }
  out += "\n\n";
  std::vector<std::string> lines;
  for (const auto& r : rows) lines.push_back(line(r));
  std::size_t rule_width = 0;
  for (const auto& l : lines) rule_width = std::max(rule_width, l.size() - 1);
  out += line(header);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i + 1 == lines.size()) out += std::string(rule_width, '-') + "\n";  // above the total
    out += lines[i];
  }
  out += "\nelements: unpadded parameter elements (an expert group: every EP rank's experts). shard/rank:\n"
         "padded f32 elements each rank keeps (an expert group: its share of its EP rank's experts,\n"
         "sharded on dim 1).\n"
         "inputs: whether floating forward inputs are cast to the param dtype.\n"
         "gathered/step: all-gather buffer bytes per step of one micro-batch (resharded units are\n"
         "gathered again for backward, islands once per step).\n";

  out += fmt::format("\nmesh: {}\n", mesh.describe());
  if (mesh.ep() > 1) {
    out += fmt::format("MoE mesh per stage: ep_shard {} x ep {}: EP rank r owns experts [r E/{}, (r+1) E/{}), "
                       "its expert groups sharded over its ep_shard group\n",
                       mesh.ep_shard(), mesh.ep(), mesh.ep(), mesh.ep());
  }
  if (mesh.pp() > 1 || mesh.cp() > 1) {
    out += "atoll-train does not run pp or cp > 1 yet; this is the layout it will use.\n";
  }
  out += "groups:\n";
  // Same text as Group::describe, which GCC 12 -O3 flags with a false -Wrestrict when inlined.
  for (const auto& g : mesh.all_groups()) out += fmt::format("  {}[{}]\n", g.axis, fmt::join(g.ranks, ","));

  for (int stage = 0; stage < mesh.pp(); ++stage) {
    const MemoryEstimate m = estimate_memory(plan, stage, program);
    const std::string whose = mesh.pp() == 1 ? "" : fmt::format(", pipeline stage {}", stage);
    out += fmt::format("\nper-rank memory estimate{} (activations and unsharded gradients not counted):\n", whose);
    auto memory_line = [&](const std::string& what, std::int64_t bytes) {
      out += fmt::format("  {:<42} {:>12}  ({} bytes)\n", what, format_bytes(bytes), bytes);
    };
    memory_line("parameters (fp32 master shards)", m.parameter_bytes);
    memory_line("gradients (fp32 shards)", m.gradient_bytes);
    memory_line("optimizer state (AdamW, 2 x fp32 shards)", m.optimizer_bytes);
    memory_line("peak gathered parameters", m.peak_gathered_bytes);
    out += fmt::format("    (reached at the {})\n", m.peak_at);
    memory_line("total", m.total_bytes());
  }
  return out;
}

}  // namespace atl

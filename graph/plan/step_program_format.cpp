// Printing the step program for atoll-plan --graph: text, JSON and DOT.
#include "graph/plan/step_program.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace atl {

namespace {

bool names_unit(const StepInstruction& i) {
  return i.kind == StepInstructionKind::gather || i.kind == StepInstructionKind::release ||
         i.kind == StepInstructionKind::grads;
}

std::string describe(const StepProgram& program, std::uint64_t c) {
  const CollectiveNode& n = program.collectives[c];
  return fmt::format("#{} {} over {}", n.seq, collective_op_name(n.op), n.axis);
}

}  // namespace

std::string format_step_program(const Plan& plan, const StepProgram& program) {
  std::string out = fmt::format("op graph: {} ops\n", program.ops.size());
  for (std::size_t o = 0; o < program.ops.size(); ++o) {
    const OpSpec& op = program.ops[o];
    std::vector<std::string> units;
    for (std::size_t u : program.op_units[o]) units.push_back(plan.units[u].name);
    out += fmt::format("  op {:<3} {:<24} {:<9} ({}) -> ({})  reads {}\n", o, op.name, op_kind_name(op.kind),
                       fmt::join(op.inputs, ", "), fmt::join(op.outputs, ", "),
                       units.empty() ? std::string("no parameters") : fmt::format("{}", fmt::join(units, ", ")));
  }
  out += fmt::format("step program: {} micro-batch(es), schedule {}, {} activation buffer(s) per edge, {} "
                     "instructions, {} collectives per rank\n",
                     program.micro_batches, step_schedule_name(program.schedule), program.activation_buffers,
                     program.instructions.size(), program.collectives.size());
  for (const StepInstruction& i : program.instructions) {
    const std::string unit = names_unit(i) ? plan.units[i.unit].name : std::string();
    switch (i.kind) {
      case StepInstructionKind::gather:
        out += fmt::format("  gather    {:<28} {}\n", unit, describe(program, i.collective));
        break;
      case StepInstructionKind::release:
        out += fmt::format("  release   {}\n", unit);
        break;
      case StepInstructionKind::count:
        out += fmt::format("  count     {:<28} {}\n", "(targets, tokens)", describe(program, i.collective));
        break;
      case StepInstructionKind::report:
        out += fmt::format("  report    {:<28} {}\n", "(loss, gradient norm parts)", describe(program, i.collective));
        break;
      case StepInstructionKind::forward:
      case StepInstructionKind::backward:
        out += fmt::format("  {:<9} {:<28} micro-batch {}\n", step_instruction_name(i.kind),
                           program.ops[static_cast<std::size_t>(i.op)].name, i.micro_batch);
        break;
      case StepInstructionKind::grads:
      case StepInstructionKind::expert_forward:
      case StepInstructionKind::expert_backward: {
        std::vector<std::string> posted;
        for (std::uint64_t c : posted_by(i)) posted.push_back(describe(program, c));
        const std::string what =
            i.kind == StepInstructionKind::grads
                ? unit
                : fmt::format("{} mb {}", program.ops[static_cast<std::size_t>(i.op)].name, i.micro_batch);
        out += fmt::format("  {:<9} {:<28} {}\n", i.kind == StepInstructionKind::grads ? "grads" : "exchange", what,
                           fmt::join(posted, ", "));
        break;
      }
    }
  }
  return out;
}

std::string step_program_json(const Plan& plan, const StepProgram& program) {
  nlohmann::ordered_json out;
  out["micro_batches"] = program.micro_batches;
  out["schedule"] = step_schedule_name(program.schedule);
  out["activation_buffers"] = program.activation_buffers;
  auto& ops = out["ops"] = nlohmann::ordered_json::array();
  for (std::size_t o = 0; o < program.ops.size(); ++o) {
    const OpSpec& op = program.ops[o];
    std::vector<std::string> units;
    for (std::size_t u : program.op_units[o]) units.push_back(plan.units[u].name);
    ops.push_back({{"name", op.name}, {"kind", op_kind_name(op.kind)}, {"layer", op.layer}, {"inputs", op.inputs},
                   {"outputs", op.outputs}, {"units", units}});
  }
  auto& instructions = out["instructions"] = nlohmann::ordered_json::array();
  for (const StepInstruction& i : program.instructions) {
    nlohmann::ordered_json j{{"kind", step_instruction_name(i.kind)}};
    if (i.op >= 0) j["op"] = program.ops[static_cast<std::size_t>(i.op)].name;
    if (i.micro_batch >= 0) j["micro_batch"] = i.micro_batch;
    if (names_unit(i)) j["unit"] = plan.units[i.unit].name;
    if (i.kind == StepInstructionKind::grads) j["last"] = i.last;
    const auto posted = posted_by(i);
    if (!posted.empty()) j["collectives"] = posted;
    instructions.push_back(std::move(j));
  }
  auto& collectives = out["collectives"] = nlohmann::ordered_json::array();
  for (const CollectiveNode& n : program.collectives) {
    collectives.push_back({{"seq", n.seq}, {"op", collective_op_name(n.op)}, {"axis", n.axis}, {"tag", n.tag}});
  }
  return out.dump(1) + "\n";
}

std::string step_program_dot(const Plan& plan, const StepProgram& program) {
  std::string out = "digraph step_program {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n";
  for (std::size_t k = 0; k < program.instructions.size(); ++k) {
    const StepInstruction& i = program.instructions[k];
    std::string label = step_instruction_name(i.kind);
    if (i.op >= 0) label += fmt::format(" {} mb {}", program.ops[static_cast<std::size_t>(i.op)].name, i.micro_batch);
    if (names_unit(i)) label += " " + plan.units[i.unit].name;
    const char* shape = i.kind == StepInstructionKind::forward || i.kind == StepInstructionKind::backward ? "ellipse"
                                                                                                         : "plaintext";
    out += fmt::format("  i{} [label=\"{}\", shape={}];\n", k, label, shape);
    if (k > 0) out += fmt::format("  i{} -> i{};\n", k - 1, k);
    for (std::uint64_t c : posted_by(i)) {
      out += fmt::format("  c{} [label=\"{}\", shape=box, style=filled, fillcolor=lightblue];\n  i{} -> c{} "
                         "[style=dashed];\n",
                         c, describe(program, c), k, c);
    }
  }
  return out + "}\n";
}

}  // namespace atl

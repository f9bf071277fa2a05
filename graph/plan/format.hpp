// The printable plan (what atoll-plan shows): one row per unit, the mesh and its groups, and
// the per-rank memory estimate.
#pragma once
#include <cstdint>
#include <string>

#include "graph/plan/plan.hpp"

namespace atl {

struct StepProgram;  // graph/plan/step_program.hpp

// program: the step program the runtime runs (pp = cp = 1), for its memory peak (memory.hpp).
std::string format_plan(const Plan& plan, const StepProgram* program = nullptr);

// "The schedule" column: "reshard, fwd prefetch 1, bwd prefetch 2", "resident for step", ...
std::string describe_schedule(const GatherSchedule& schedule);
// 1536 -> "1.5 KiB"; below 1 KiB: "512 B".
std::string format_bytes(std::int64_t bytes);

}  // namespace atl

// How a tool's run ended, in one line, for every atoll app (exit codes: atl::exit_code_for,
// docs/failures.md).
#pragma once
#include <exception>
#include <string>
#include <vector>

namespace atl {

// "config error: ..." (naming the --set that gave the value, if one did), "non-finite training:
// ...", the message of a failure that names its own file, checkpoint or signal, or "error: ..."
// for an unforeseen one.
std::string end_message(const std::exception& e, const std::vector<std::string>& sets);

// Writes "<program>: <end_message>" to stderr; returns exit_code_for(e).
int report_failure(const char* program, const std::exception& e, const std::vector<std::string>& sets);

}  // namespace atl

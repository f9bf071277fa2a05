#include "apps/end_message.hpp"

#include <iostream>

#include "graph/config.hpp"
#include "graph/config_reader.hpp"
#include "graph/training/exit_code.hpp"
#include "graph/training/run.hpp"
#include "graph/training/starting_point.hpp"

namespace atl {

std::string end_message(const std::exception& e, const std::vector<std::string>& sets) {
  if (const auto* config = dynamic_cast<const ConfigError*>(&e)) return "config error: " + message_naming_set(*config, sets);
  if (dynamic_cast<const NonFiniteError*>(&e)) return "non-finite training: " + std::string(e.what());
  // The rest name their file, checkpoint or signal; an unforeseen failure says it is an error.
  const bool unforeseen = exit_code_for(e) == 1 && !dynamic_cast<const StartFailed*>(&e);
  return std::string(unforeseen ? "error: " : "").append(e.what());
}

int report_failure(const char* program, const std::exception& e, const std::vector<std::string>& sets) {
  std::cerr << program << ": " << end_message(e, sets) << "\n";
  return exit_code_for(e);
}

}  // namespace atl

// libFuzzer target: the run-config loader (YAML parse, duplicate keys, every section's reader) on
// arbitrary text. Every input must parse or be refused with ConfigError.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)atl::parse_run_config(text, "fuzz.yaml");
  } catch (const atl::ConfigError&) {
  }
  return 0;
}

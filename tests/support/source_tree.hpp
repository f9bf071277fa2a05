// Where ctest says the source tree is (ATOLL_SOURCE_DIR), for tests that read its configs and
// scripts. No Catch macro here: multi-process tests call these on helper threads, and Catch's
// assertions are not thread-safe.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace atl::testing {

inline std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) throw std::runtime_error(std::string("environment variable ") + name + " is not set (ctest sets it)");
  return value;
}

inline std::filesystem::path source_path(const std::string& relative) {
  return std::filesystem::path(required_env("ATOLL_SOURCE_DIR")) / relative;
}

}  // namespace atl::testing

// Command-line checks CLI11 2.1 lacks. It reads "99999999999999999999" for an int64 option as the
// largest int64 instead of refusing it, so counts are checked on the text, before conversion.
#pragma once
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace atl {

// A whole number in 1 .. 2^63 - 1, written in decimal digits.
inline CLI::Validator positive_int64(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && stop == end && value >= 1) return "";
        return "expected " + what + " (an integer in [1, " + std::to_string(std::numeric_limits<std::int64_t>::max()) +
               "]), got '" + text + "'";
      },
      what);
}

// A path that names something: an empty one would be refused later by a message naming nothing
// ("'': cannot create it").
inline CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "expected a path, got ''" : ""; },
                        "PATH");
}

}  // namespace atl

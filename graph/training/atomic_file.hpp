// Files are written to a temporary name in the same directory and renamed into place, so a
// crash never leaves a half-written file where a complete one was.
#pragma once
#include <filesystem>
#include <string_view>

namespace atl {

void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace atl

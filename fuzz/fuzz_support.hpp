// Fuzz targets that read files: the input written to one scratch file per process.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace atl::fuzz {

inline std::filesystem::path write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("atoll-fuzz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / name;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return file;
}

}  // namespace atl::fuzz

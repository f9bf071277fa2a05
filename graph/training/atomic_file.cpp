#include "graph/training/atomic_file.hpp"

#include <fstream>
#include <stdexcept>

namespace atl {

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write " + tmp.string());
    f.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!f) throw std::runtime_error("write failed: " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace atl

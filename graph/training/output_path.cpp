#include "graph/training/output_path.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/durable_file.hpp"
#include "graph/config_reader.hpp"

namespace atl {

namespace {

// Throws ConfigError(`file`, `key`, "<context>'<dir>' is not writable (...: why)") unless this process
// can make a file in the existing directory `dir`, found by making one and removing it: root
// passes access(2) even where the file system refuses (/sys, read-only mounts).
void require_can_create_in(const std::filesystem::path& dir, const std::string& context, const std::string& file,
                           const std::string& key) {
  std::string probe = (dir / ".atoll-write-probe-XXXXXX").string();
  std::string why;
  if (const int fd = ::mkstemp(probe.data()); fd < 0) {
    why = std::string("creating a file there failed: ") + std::strerror(errno);
  } else {
    ::close(fd);
    if (::unlink(probe.c_str()) != 0) why = "cannot remove the probe file " + probe + ": " + std::strerror(errno);
  }
  if (!why.empty()) throw ConfigError(file, key, context + "'" + dir.string() + "' is not writable (" + why + ")");
}

}  // namespace

void check_output_path(const std::filesystem::path& path, bool as_file, const std::string& file, const std::string& key) {
  namespace fs = std::filesystem;
  if (const std::string problem = name_length_problem(path); !problem.empty()) throw ConfigError(file, key, problem);
  if (const auto checkpoint = enclosing_checkpoint(path)) {
    throw ConfigError(file, key, "'" + path.string() + "' " + inside_checkpoint_problem(*checkpoint));
  }
  std::error_code ec;
  if (fs::exists(path, ec)) {
    if (as_file && fs::is_directory(path, ec)) throw ConfigError(file, key, "'" + path.string() + "' is a directory");
    // The file is written under a temporary name and renamed over the old one: a device or a pipe
    // (/dev/null, as root) would be replaced by a regular file.
    if (as_file && !fs::is_regular_file(path, ec)) {
      throw ConfigError(file, key, "'" + path.string() + "' exists and is not a regular file (a device, a pipe or a "
                                   "socket would be replaced by one); expected a file path");
    }
    if (!as_file && !fs::is_directory(path, ec)) {
      throw ConfigError(file, key, "'" + path.string() + "' exists and is not a directory");
    }
    const fs::path dir = as_file ? (path.has_parent_path() ? path.parent_path() : fs::path(".")) : path;
    require_can_create_in(dir, "", file, key);
    return;
  }
  // A file's folder is created when the file is written, as run_dir is (a trace inside a new run_dir).
  if (as_file) {
    check_output_path(path.has_parent_path() ? path.parent_path() : fs::path("."), false, file, key);
    return;
  }
  // Not there yet: the nearest existing ancestor must be a writable directory.
  fs::path ancestor = fs::absolute(path, ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path()) {
    ancestor = ancestor.parent_path();
  }
  if (!fs::is_directory(ancestor, ec)) {
    throw ConfigError(file, key, "cannot create '" + path.string() + "': '" + ancestor.string() + "' is not a directory");
  }
  require_can_create_in(ancestor, "cannot create '" + path.string() + "': ", file, key);
}

void create_parent_folders(const std::filesystem::path& file) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
}

void check_replaces_no_input(const std::string& out, const std::vector<RunInput>& inputs, const std::string& file,
                             const std::string& key) {
  namespace fs = std::filesystem;
  const fs::path target = fs::weakly_canonical(out);
  for (const RunInput& input : inputs) {
    if (input.path.empty()) continue;
    const fs::path in = fs::weakly_canonical(input.path);
    if (!input.directory && target == in) {
      throw ConfigError(file, key, "'" + out + "' is " + input.what + "; expected another file");
    }
    const auto [end, at] = std::mismatch(in.begin(), in.end(), target.begin(), target.end());
    if (input.directory && end == in.end()) {
      throw ConfigError(file, key, "'" + out + "' is inside " + input.what + " " + input.path +
                                       "; expected a file outside it");
    }
  }
}

std::string node_trace_path(const std::string& path, int node_rank) {
  if (node_rank == 0) return path;
  const std::filesystem::path p(path);
  const std::string tag = ".node" + std::to_string(node_rank);
  return (p.parent_path() / (p.stem().string() + tag + p.extension().string())).string();
}

}  // namespace atl

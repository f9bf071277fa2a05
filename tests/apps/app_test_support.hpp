// Running the apps as subprocesses in tests: scratch directories, exit codes, output and files.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/source_tree.hpp"

namespace atl::testing {

namespace fs = std::filesystem;

// No Catch macro here or in what the multi-process tests call on helper threads (app_binary,
// source_path, run_shell): Catch's assertions are not thread-safe, and two threads asserting at
// once once corrupted the test process's heap.
inline fs::path app_binary(const std::string& name) { return fs::path(required_env("ATOLL_BINARY_DIR")) / "apps" / name; }

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() /
           ("atoll_train_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
            std::to_string(now));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string shell_quote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The file's bytes, "" when it cannot be read (no Catch macro: run_shell runs on helper threads).
inline std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The file's bytes; a missing or unreadable file fails the test (two missing files would
// otherwise compare equal as "" == ""). Not on helper threads.
inline std::string read_file(const fs::path& path) {
  INFO("reading " << path.string());
  REQUIRE(std::ifstream(path, std::ios::binary).is_open());
  return file_text(path);
}

inline void write_file(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  REQUIRE(out.good());
}

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a shell command line; stdout and stderr go to files in `scratch` and are read back.
inline Result run_shell(const std::string& command_line, const fs::path& scratch) {
  fs::create_directories(scratch);
  const fs::path out_path = scratch / "stdout.txt";
  const fs::path err_path = scratch / "stderr.txt";
  std::string command = command_line;
  command.append(" >").append(shell_quote(out_path.string()));
  command.append(" 2>").append(shell_quote(err_path.string()));
  const int status = std::system(command.c_str());
  Result r;
  r.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = file_text(out_path);
  r.err = file_text(err_path);
  return r;
}

// Runs apps/<binary> with `args` (run_shell).
inline Result run_app(const std::string& binary, const std::vector<std::string>& args, const fs::path& scratch) {
  std::string command = shell_quote(app_binary(binary).string());
  // Appended piecewise: `" " + std::string&&` trips a false -Wrestrict in GCC 12.
  for (const auto& a : args) command.append(" ").append(shell_quote(a));
  return run_shell(command, scratch);
}

inline std::string last_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// The lines of a file another process is appending to that are whole (end in a newline): what a
// test waiting for a run's progress counts (a line seen half-written is not parsed).
inline std::size_t complete_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return static_cast<std::size_t>(
      std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
}

inline std::vector<nlohmann::json> read_metrics(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    INFO("metrics line " << lines.size() + 1 << ": " << line);
    REQUIRE(nlohmann::json::accept(line));
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// The metrics file with the wall-clock fields removed, one re-dumped object per line.
inline std::string metrics_without_timing(const fs::path& path) {
  std::string result;
  for (auto m : read_metrics(path)) {
    m.erase("tokens_per_s");
    m.erase("elapsed_s");
    result += m.dump() + "\n";
  }
  return result;
}

}  // namespace atl::testing

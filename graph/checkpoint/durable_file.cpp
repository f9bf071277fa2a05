#include "graph/checkpoint/durable_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/core.h>

namespace atl {

namespace {

[[noreturn]] void fail_errno(const std::filesystem::path& file, const char* what) {
  throw FileWriteError(fmt::format("{}: {}: {}", file.string(), what, std::strerror(errno)));
}

// The first bytes of `name`, at most `bytes`, ending on a whole UTF-8 character.
std::string utf8_prefix(const std::string& name, std::size_t bytes) {
  if (bytes >= name.size()) return name;
  while (bytes > 0 && (static_cast<unsigned char>(name[bytes]) & 0xC0) == 0x80) --bytes;  // a continuation byte
  return name.substr(0, bytes);
}

}  // namespace

DurableFileWriter::DurableFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  const std::string prefix = temporary_prefix(".", path_.filename().string(), ".tmp-");
  remove_abandoned_temporaries(parent_folder(path_), prefix);
  temporary_ = path_.parent_path() / (prefix + temporary_tag());
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  // The error names the file asked for (the temporary name is ours, not the caller's).
  if (fd_ < 0) fail_errno(path_, "cannot create (writing a temporary beside it)");
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void DurableFileWriter::write(const void* bytes, std::size_t count) {
  // One write() moves at most ~2 GiB on Linux, and may move less than asked.
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  const char* p = static_cast<const char*>(bytes);
  while (count > 0) {
    ssize_t n = ::write(fd_, p, std::min(count, kChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path_, "write failed (its temporary is removed)");
    }
    p += n;
    count -= static_cast<std::size_t>(n);
  }
}

void DurableFileWriter::commit() {
  if (::fsync(fd_) != 0) fail_errno(path_, "fsync failed (its temporary is removed)");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int saved = errno;
    ::unlink(temporary_.c_str());
    errno = saved;
    fail_errno(path_, "close failed (its temporary is removed)");
  }
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    int saved = errno;
    ::unlink(temporary_.c_str());
    errno = saved;
    fail_errno(path_, "cannot rename the temporary file into place");
  }
  fsync_directory(parent_folder(path_));
}

void write_file_durably(const std::filesystem::path& path, std::string_view contents) {
  DurableFileWriter writer(path);
  writer.write(contents.data(), contents.size());
  writer.commit();
}

namespace {
std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}
}  // namespace

std::string temporary_tag() { return host_name() + "-" + std::to_string(static_cast<long>(::getpid())); }

std::string temporary_prefix(std::string_view lead, const std::string& name, std::string_view trail) {
  // Room for the tag: a host name of up to 64 bytes (HOST_NAME_MAX), '-' and a pid of up to 10 digits.
  constexpr std::size_t kNameMax = 255, kTagMax = 64 + 1 + 10, kHash = 9;  // "~" and 8 hex digits
  const std::size_t room = kNameMax - kTagMax - lead.size() - trail.size();
  if (name.size() <= room) return fmt::format("{}{}{}", lead, name, trail);
  std::uint32_t hash = 2166136261u;  // FNV-1a: the same cut name on every run and build
  for (const unsigned char c : name) hash = (hash ^ c) * 16777619u;
  return fmt::format("{}{}~{:08x}{}", lead, utf8_prefix(name, room - kHash), hash, trail);
}

std::string name_length_problem(const std::filesystem::path& path) {
  std::filesystem::path before;
  for (const std::filesystem::path& part : path) {
    const std::string& name = part.native();
    if (name.size() > 255) {
      return fmt::format("the name '{}...' in '{}' has {} bytes; expected at most 255 (a file name's limit)",
                         utf8_prefix(name, 24), before.empty() ? "." : before.string(), name.size());
    }
    before /= part;
  }
  return "";
}

void remove_abandoned_temporaries(const std::filesystem::path& folder, const std::string& prefix_given) {
  const std::string prefix = prefix_given + host_name() + "-";  // this machine's only: its pids say something
  std::error_code ec;
  std::vector<std::filesystem::path> gone;
  for (auto it = std::filesystem::directory_iterator(folder, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH) gone.push_back(it->path());
  }
  for (const auto& path : gone) std::filesystem::remove_all(path, ec);
}

std::filesystem::path parent_folder(const std::filesystem::path& path) {
  return path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
}

void create_directories_durably(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;  // innermost first
  fs::path start = fs::absolute(dir).lexically_normal();
  if (!start.has_filename()) start = start.parent_path();  // "out/" is out
  for (fs::path p = start; !fs::exists(p); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    fs::create_directory(*it);
    fsync_directory(it->parent_path());
  }
}

void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(dir, "cannot open directory to fsync");
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) fail_errno(dir, "fsync of directory failed");
}

}  // namespace atl

#include "comm/rendezvous/framing.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace atl::framing {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("control channel: " + what + (errno ? std::string(" (") + std::strerror(errno) + ")" : ""));
}

[[noreturn]] void fail_plain(const std::string& what) {
  errno = 0;
  fail(what);
}

std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0;
  return out.str();
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until fd is readable (or writable); false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) fail("poll");
  }
}

namespace {

void write_all(int fd, const void* data, std::size_t bytes, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) fail_plain("timed out sending");
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("send");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void read_all(int fd, void* data, std::size_t bytes, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_for(fd, POLLIN, deadline)) fail_plain("timed out waiting for a message");
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail_plain("the peer closed the connection");
    if (n < 0) fail("recv");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace

void send_message(int fd, const json& message, Clock::time_point deadline) {
  const std::string text = message.dump();
  if (text.size() > kMaxMessage) {
    fail_plain("a message of " + std::to_string(text.size()) + " bytes to send (more than the limit of " +
               std::to_string(kMaxMessage) + ")");
  }
  const std::uint32_t length = htonl(static_cast<std::uint32_t>(text.size()));
  write_all(fd, &length, 4, deadline);
  write_all(fd, text.data(), text.size(), deadline);
}

json receive_message(int fd, Clock::time_point deadline, std::uint32_t max_bytes) {
  std::uint32_t length = 0;
  read_all(fd, &length, 4, deadline);
  length = ntohl(length);
  if (length > max_bytes) {
    fail_plain("a message of " + std::to_string(length) + " bytes (more than the limit of " + std::to_string(max_bytes) + ")");
  }
  std::string text(length, '\0');
  read_all(fd, text.data(), length, deadline);
  json out = json::parse(text, nullptr, false);
  if (out.is_discarded() || !out.is_object()) fail_plain("a malformed message");
  return out;
}

}  // namespace atl::framing

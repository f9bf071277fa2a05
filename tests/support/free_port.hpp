// Loopback addresses and free TCP ports on 127.0.0.1 for tests that start rendezvous or whole
// jobs.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace atl::testing {

inline sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// The lowest port of the kernel's ephemeral range: bind(0) and connect() take theirs from
// [this, ...), so a port below it is never handed out behind a test's back.
inline int ephemeral_port_low() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  return low;
}

// The candidates below the ephemeral range a test tries, in a per-process order: [10000, low).
// Empty (span 0) when the range starts too low to leave room.
struct PortCandidates {
  int low = 10000, span = 0;
  unsigned start = 0;
  PortCandidates() {
    span = std::max(0, ephemeral_port_low() - 1 - low);
    if (span < 100) span = 0;
    static std::atomic<unsigned> calls{0};
    start = static_cast<unsigned>(::getpid()) * 7919u + 104729u * calls++;
  }
  int at(unsigned attempt) const {
    return low + static_cast<int>((start + 31u * attempt) % static_cast<unsigned>(span));
  }
};

// A TCP port on 127.0.0.1 that was free when checked, below the ephemeral range: the UCX
// listeners and connections of the jobs a test starts (bind(0) and connect(), between this check
// and node 0's bind) cannot take it. The kernel's own pick where no such port turns up.
inline int free_port() {
  const PortCandidates candidates;
  for (unsigned attempt = 0; candidates.span > 0 && attempt < 200; ++attempt) {
    const int port = candidates.at(attempt);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in addr = loopback(port);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (bound) return port;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = loopback(0);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Whether some socket of this machine listens on TCP `port` (IPv4 or IPv6), as /proc/net/tcp{,6}
// list them; no connection is made (a rendezvous would count a probe as a silent peer).
inline bool listening_on(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && std::stoi(local.substr(colon + 1), nullptr, 16) == port) {
        return true;
      }
    }
  }
  return false;
}

// Waits until `port` is listening (listening_on) or `limit` passes; whether it listens.
inline bool wait_until_listening(int port, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!listening_on(port)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Whether this machine has IPv6 loopback (some containers switch IPv6 off).
inline bool has_ipv6_loopback() {
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (probe < 0) return false;
  sockaddr_in6 any6{};
  any6.sin6_family = AF_INET6;
  any6.sin6_addr = in6addr_loopback;
  const bool bound = ::bind(probe, reinterpret_cast<const sockaddr*>(&any6), sizeof(any6)) == 0;
  ::close(probe);
  return bound;
}

// A socket listening on 127.0.0.1 (another program's server, in a test) on a port below the
// kernel's ephemeral range whose successor was free when checked: no connection or bind(0)
// elsewhere takes that successor meanwhile. fd -1 when no such pair turned up. The caller closes fd.
struct HeldPort {
  int fd = -1;
  int port = 0;
};

inline HeldPort listen_below_free_successor() {
  const PortCandidates candidates;
  for (unsigned attempt = 0; candidates.span > 0 && attempt < 200; ++attempt) {
    const int port = candidates.at(attempt);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return {};
    sockaddr_in addr = loopback(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd, 4) == 0) {
      const int next = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in above = loopback(port + 1);
      const bool free = next >= 0 && ::bind(next, reinterpret_cast<sockaddr*>(&above), sizeof(above)) == 0;
      if (next >= 0) ::close(next);
      if (free) return {fd, port};
    }
    ::close(fd);
  }
  return {};
}

}  // namespace atl::testing

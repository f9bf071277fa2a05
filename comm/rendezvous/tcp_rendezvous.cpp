#include "comm/rendezvous/tcp_rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/rendezvous/framing.hpp"

namespace atl {

using namespace framing;

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int fd() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string hex(const WorkerAddress& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out.push_back(digits[static_cast<unsigned>(b) >> 4]);
    out.push_back(digits[static_cast<unsigned>(b) & 15]);
  }
  return out;
}

WorkerAddress unhex(const std::string& text) {
  auto value = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    throw std::runtime_error("rendezvous: a malformed worker address");
  };
  if (text.size() % 2) throw std::runtime_error("rendezvous: a malformed worker address");
  WorkerAddress out;
  for (std::size_t i = 0; i < text.size(); i += 2) out.push_back(static_cast<std::byte>(value(text[i]) * 16 + value(text[i + 1])));
  return out;
}

json addresses_json(const std::map<int, WorkerAddress>& addresses) {
  json out = json::object();
  for (const auto& [rank, address] : addresses) out[std::to_string(rank)] = hex(address);
  return out;
}

std::map<int, WorkerAddress> addresses_from(const json& j) {
  std::map<int, WorkerAddress> out;
  for (const auto& [rank, address] : j.items()) out[std::stoi(rank)] = unhex(address.get<std::string>());
  return out;
}

// Node 0's address, IPv4 or IPv6 (a literal like ::1, or a name: its first address).
struct Endpoint {
  sockaddr_storage addr{};
  socklen_t length = 0;
  int family() const { return addr.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&addr); }
};

Endpoint resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    fail_plain("cannot resolve the master address '" + host + "'");
  }
  Endpoint out;
  std::memcpy(&out.addr, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

std::string ip_text(const Endpoint& e) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* ip = e.family() == AF_INET6
                       ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(e.get())->sin6_addr)
                       : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(e.get())->sin_addr);
  return ::inet_ntop(e.family(), ip, text, sizeof(text)) ? text : "";
}

// An address as the resolver reads it without a name lookup (127.1 and ::1%lo included).
bool is_ip_literal(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  const bool literal = ::getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0;
  if (found) ::freeaddrinfo(found);
  return literal;
}

// The names that mean this machine's loopback wherever they are used (RFC 6761, Debian's hosts).
bool is_loopback_name(std::string host) {
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!host.empty() && host.back() == '.') host.pop_back();
  return host == "localhost" || host == "localhost.localdomain" || host == "ip6-localhost" || host == "ip6-loopback" ||
         (host.size() > std::string_view(".localhost").size() && host.ends_with(".localhost"));
}

std::string path_of(const std::string& parent, const std::string& key) { return parent.empty() ? key : parent + "." + key; }

std::string difference(const json& a, const json& b, const std::string& path) {
  if (a.type() != b.type()) return path;
  if (a.is_object()) {
    for (const auto& [key, value] : a.items()) {
      if (!b.contains(key)) return path_of(path, key);
      if (std::string d = difference(value, b.at(key), path_of(path, key)); !d.empty()) return d;
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key)) return path_of(path, key);
    }
    return "";
  }
  if (a.is_array()) {
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (std::string d = difference(a[i], b[i], path + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    }
    return a.size() == b.size() ? "" : path;
  }
  return a == b ? "" : (path.empty() ? "(the whole description)" : path);
}

// The first message of a connection: the job token alone (a few hundred bytes at most).
constexpr std::uint32_t kMaxGreeting = 4096;

// Compares in time that does not depend on where the texts first differ.
bool same_token(const std::string& given, const std::string& token) {
  unsigned char differ = given.size() == token.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i) {
    differ |= static_cast<unsigned char>(given[i] ^ (token.empty() ? 0 : token[i % token.size()]));
  }
  return differ == 0;
}

// Whether the peer of a connected socket closed it (its process ended).
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte = 0;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void throw_if_stopped(const RendezvousSettings& s);

// Connects within the deadline, looking for a stop every 100 ms: a host that drops packets would
// hold a blocking connect() for the kernel's SYN retries (minutes). False when refused or timed out.
bool connect_within(const RendezvousSettings& s, int fd, const Endpoint& addr, Clock::time_point deadline) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) fail("fcntl");
  if (::connect(fd, addr.get(), addr.length) != 0) {
    if (errno != EINPROGRESS) return false;
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (wait_for(fd, POLLOUT, slice)) break;
      if (slice == deadline) return false;
      throw_if_stopped(s);
    }
    int error = 0;
    socklen_t length = sizeof(error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) return false;
  }
  if (::fcntl(fd, F_SETFL, flags) != 0) fail("fcntl");  // blocking again: framing polls before it reads or writes
  return true;
}

void throw_if_stopped(const RendezvousSettings& s) {
  if (const int signal = s.stop_requested ? s.stop_requested() : 0; signal != 0) {
    throw RendezvousStopped(signal, "asked to stop (signal " + std::to_string(signal) +
                                        ") while waiting for the other nodes at the rendezvous");
  }
}

// Waits as wait_for does, in slices of 100 ms, looking for a stop between them: what has arrived
// wins over a stop (node 0's answer means the job has started).
bool wait_unless_stopped(const RendezvousSettings& s, int fd, Clock::time_point deadline) {
  for (;;) {
    const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    if (wait_for(fd, POLLIN, slice)) return true;
    if (slice == deadline) return false;
    throw_if_stopped(s);
  }
}

// Node 0's listening socket at the master address (every interface when that address is this
// machine's loopback name, which other machines cannot reach).
Socket listen_for_nodes(const RendezvousSettings& s) {
  Endpoint addr = resolve(s.master_addr, s.master_port);
  const std::string host = listen_host(s.master_addr, ip_text(addr));
  if (host != s.master_addr) {  // every interface: a literal, no lookup
    addr = resolve(host, s.master_port);
    if (s.log) {
      s.log("listening on every interface (" + host + "): the master address '" + s.master_addr +
            "' is this machine's loopback here, which the other machines cannot reach");
    }
  }
  Socket listener(::socket(addr.family(), SOCK_STREAM, 0));
  if (listener.fd() < 0) fail("socket");
  const int one = 1, zero = 0;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Every interface of IPv6 takes IPv4 peers too, whatever the system's default (bindv6only).
  if (host == "::") ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (::bind(listener.fd(), addr.get(), addr.length) != 0) {
    fail("cannot listen on " + host + " port " + std::to_string(s.master_port));
  }
  if (::listen(listener.fd(), 64) != 0) fail("listen");
  return listener;
}

// A node that joined: its connection and what it said (its job and worker addresses).
struct Joined {
  Socket socket;
  json hello;
};

// The nodes joined so far, and those that joined, then closed their connection (their process ended).
struct Joining {
  std::map<int, Joined> joined;
  std::set<int> left;
};

// Takes one connection: its token first, alone, in a small message (a connection without it costs
// node 0 no more than kMaxGreeting bytes, and nothing else it says is read), then its hello. A
// refused peer is told why (best effort: an intruder may be gone), so a misconfigured node names
// its fault instead of waiting out the rendezvous; the token itself is never sent.
void admit(const RendezvousSettings& s, Socket peer, Clock::time_point deadline, Joining& nodes) {
  json hello;
  bool token_valid = false;
  try {
    // A short deadline per connection: a silent peer cannot hold the rendezvous.
    const auto soon = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    const json greeting = receive_message(peer.fd(), soon, kMaxGreeting);
    token_valid = greeting.contains("token") && greeting["token"].is_string() &&
                  same_token(greeting["token"].get<std::string>(), s.token);
    if (token_valid) {  // the node waits for this before it says more: a refusal finds nothing unread
      send_message(peer.fd(), json{{"accepted", true}}, soon);
      hello = receive_message(peer.fd(), soon);
    }
  } catch (const std::exception& e) {
    if (s.log) s.log(std::string("dropped a connection that sent no valid greeting: ") + e.what());
    return;
  }
  auto refuse = [&](const std::string& key, const std::string& why) {
    if (s.log) s.log("refused a connection " + why);
    try {
      const auto soon = std::min(deadline, Clock::now() + std::chrono::seconds(1));
      send_message(peer.fd(), json{{"refused", why}, {"key", key}}, soon);
    } catch (const std::exception&) {
    }
  };
  if (!token_valid) return refuse("ATOLL_JOB_TOKEN", "with a wrong job token");
  auto& joined = nodes.joined;
  const int node = hello.contains("node") && hello["node"].is_number_integer() ? hello["node"].get<int>() : -1;
  // A node whose launcher restarted it claims its number again: its earlier connection closed
  // (maybe since the last look).
  if (joined.count(node) && closed_by_peer(joined.at(node).socket.fd())) {
    joined.erase(node);
    nodes.left.insert(node);
  }
  if (node < 1 || node >= s.nnodes || joined.count(node)) {
    return refuse("--node-rank", "claiming node " + std::to_string(node) +
                                     (joined.count(node) ? ", which another process took"
                                                         : ", not a node of this job (node 0 runs " +
                                                               std::to_string(s.nnodes) + " nodes: check --nnodes too)"));
  }
  if (nodes.left.erase(node) && s.log) {
    s.log("node " + std::to_string(node) + " joined again (its earlier connection had closed)");
  }
  joined[node] = Joined{std::move(peer), std::move(hello)};
}

// Waits until every other node has joined (and is still there), or the deadline, which names
// the missing nodes.
std::map<int, Joined> await_nodes(const RendezvousSettings& s, const Socket& listener, Clock::time_point deadline) {
  Joining nodes;
  while (static_cast<int>(nodes.joined.size()) < s.nnodes - 1) {
    // In slices of a second: a joined node whose process ends meanwhile is missing again, and the
    // timeout names it as such (a restarted one joins again).
    const auto slice = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    const bool arrived = wait_unless_stopped(s, listener.fd(), slice);
    for (auto it = nodes.joined.begin(); it != nodes.joined.end();) {
      if (!closed_by_peer(it->second.socket.fd())) {
        ++it;
        continue;
      }
      if (s.log) s.log("node " + std::to_string(it->first) + " left the rendezvous (its connection closed)");
      nodes.left.insert(it->first);
      it = nodes.joined.erase(it);
    }
    if (!arrived && slice < deadline) continue;
    if (!arrived) {
      std::string missing;
      for (int n = 1; n < s.nnodes; ++n) {
        if (!nodes.joined.count(n)) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(n) + (nodes.left.count(n) ? " (joined, then left)" : "");
        }
      }
      fail_plain(std::to_string(nodes.joined.size() + 1) + " of " + std::to_string(s.nnodes) + " nodes joined within " +
                 seconds_text(s.timeout) + " s (topology.rendezvous_timeout_s); missing: node " + missing);
    }
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() >= 0) admit(s, std::move(peer), deadline, nodes);
  }
  return std::move(nodes.joined);
}

// Every node runs the same job, or none does: each joined node gets the address book, or the first
// differing key (and this node throws JobMismatch naming it).
std::map<int, WorkerAddress> answer_nodes(const RendezvousSettings& s, const std::map<int, Joined>& joined,
                                          const std::map<int, WorkerAddress>& mine, Clock::time_point deadline) {
  std::string mismatch_key;
  int mismatch_node = -1;
  for (const auto& [node, j] : joined) {
    const std::string d = first_difference(s.job, j.hello.value("job", std::string()));
    if (!d.empty()) {
      mismatch_key = d;
      mismatch_node = node;
      break;
    }
  }
  std::map<int, WorkerAddress> all = mine;
  for (const auto& [node, j] : joined) {
    for (auto& [rank, address] : addresses_from(j.hello.at("addresses"))) all[rank] = address;
  }
  const json reply = mismatch_key.empty()
                         ? json{{"addresses", addresses_json(all)}}
                         : json{{"mismatch", mismatch_key}, {"node", mismatch_node}};
  for (const auto& [node, j] : joined) {
    try {
      send_message(j.socket.fd(), reply, deadline);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(e.what()) + ", answering node " + std::to_string(node) +
                               " (it left after joining)");
    }
  }
  if (!mismatch_key.empty()) {
    throw JobMismatch(mismatch_key, "node " + std::to_string(mismatch_node) + " runs a different job: the first "
                                        "differing config key is " + mismatch_key);
  }
  return all;
}

std::map<int, WorkerAddress> coordinate(const RendezvousSettings& s, const std::map<int, WorkerAddress>& mine,
                                        RendezvousLinks* links) {
  const auto deadline = Clock::now() + s.timeout;
  const Socket listener = listen_for_nodes(s);
  std::map<int, Joined> joined = await_nodes(s, listener, deadline);
  std::map<int, WorkerAddress> all = answer_nodes(s, joined, mine, deadline);
  if (links) {
    for (auto& [node, j] : joined) links->sockets[node] = j.socket.release();
  }
  return all;
}

std::map<int, WorkerAddress> join(const RendezvousSettings& s, const std::map<int, WorkerAddress>& mine,
                                  RendezvousLinks* links) {
  const auto deadline = Clock::now() + s.timeout;
  const Endpoint addr = resolve(s.master_addr, s.master_port);
  Socket socket;
  for (;;) {  // node 0 may not listen yet
    socket = Socket(::socket(addr.family(), SOCK_STREAM, 0));
    if (socket.fd() < 0) fail("socket");
    if (connect_within(s, socket.fd(), addr, deadline)) break;
    if (remaining_ms(deadline) == 0) {
      fail("node 0 at " + s.master_addr + ":" + std::to_string(s.master_port) + " did not answer within " +
           seconds_text(s.timeout) + " s (topology.rendezvous_timeout_s; is node 0 running there? once it has "
           "started the job it no longer listens: did another process take node " + std::to_string(s.node_rank) +
           "?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    throw_if_stopped(s);
  }
  // The token alone first; node 0 accepts it (or refuses, and closes) before this node says more.
  send_message(socket.fd(), json{{"token", s.token}}, deadline);
  json reply;
  try {
    wait_unless_stopped(s, socket.fd(), deadline);  // node 0 may be busy, hung, or another program
    reply = receive_message(socket.fd(), deadline);
    if (reply.contains("accepted")) {
      send_message(socket.fd(), json{{"node", s.node_rank}, {"job", s.job}, {"addresses", addresses_json(mine)}},
                   deadline);
      // Node 0 answers once every node has joined, within its own timeout (which it counts from
      // its start, maybe later than this node's): a fresh one here, as node 0 closes the
      // connection when it gives up.
      const auto answer_by = Clock::now() + s.timeout;
      wait_unless_stopped(s, socket.fd(), answer_by);
      reply = receive_message(socket.fd(), answer_by);
    }
  } catch (const RendezvousStopped&) {
    throw;
  } catch (const std::exception& e) {  // node 0 gave up on a node that never came, or timed out itself
    throw_if_stopped(s);  // or a stop of the whole job reached node 0 first, which closed the connection
    throw std::runtime_error(std::string(e.what()) + ", and node 0 at " + s.master_addr + ":" +
                             std::to_string(s.master_port) + " sent no address book (it names the nodes that did "
                             "not join within " + seconds_text(s.timeout) + " s, topology.rendezvous_timeout_s; "
                             "another program on that port would not answer either)");
  }
  if (reply.contains("refused")) {
    const std::string key = reply.value("key", std::string("ATOLL_JOB_TOKEN"));
    throw JobMismatch(key, "node 0 at " + s.master_addr + ":" + std::to_string(s.master_port) + " refused this node's "
                           "connection " + reply["refused"].get<std::string>() +
                           (key == "ATOLL_JOB_TOKEN" ? " (every node needs the same ATOLL_JOB_TOKEN or "
                                                       "topology.job_token_file; scripts/launch sets one)"
                                                     : ""));
  }
  if (reply.contains("mismatch")) {
    const std::string key = reply["mismatch"].get<std::string>();
    throw JobMismatch(key, "node " + std::to_string(reply.value("node", -1)) + " and node 0 run different jobs: the "
                           "first differing config key is " + key);
  }
  std::map<int, WorkerAddress> all = addresses_from(reply.at("addresses"));
  if (links) links->sockets[0] = socket.release();
  return all;
}

}  // namespace

std::string listen_host(const std::string& master_addr, const std::string& resolved_ip) {
  if (is_ip_literal(master_addr) || is_loopback_name(master_addr)) return master_addr;
  const bool loopback =
      resolved_ip.rfind("127.", 0) == 0 || resolved_ip == "::1" || resolved_ip.rfind("::ffff:127.", 0) == 0;
  if (!loopback) return master_addr;
  return resolved_ip.find(':') != std::string::npos ? "::" : "0.0.0.0";
}

std::string first_difference(const std::string& left_json, const std::string& right_json) {
  const json a = json::parse(left_json, nullptr, false), b = json::parse(right_json, nullptr, false);
  if (a.is_discarded() || b.is_discarded()) return left_json == right_json ? "" : "(the whole description)";
  return difference(a, b, "");
}

std::map<int, WorkerAddress> rendezvous(const RendezvousSettings& settings, const std::map<int, WorkerAddress>& mine,
                                        RendezvousLinks* links) {
  if (settings.nnodes < 1 || settings.node_rank < 0 || settings.node_rank >= settings.nnodes) {
    throw std::invalid_argument("rendezvous: node " + std::to_string(settings.node_rank) + " of " +
                                std::to_string(settings.nnodes));
  }
  if (settings.nnodes == 1) return mine;
  return settings.node_rank == 0 ? coordinate(settings, mine, links) : join(settings, mine, links);
}

}  // namespace atl

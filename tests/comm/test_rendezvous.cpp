// The rendezvous's bounded waits (topology.rendezvous_timeout_s): node 0 names the nodes that
// never joined; a node whose node 0 never listens says so; a refused node is told why.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous/framing.hpp"
#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "tests/support/free_port.hpp"

using namespace atl;

namespace {

RendezvousSettings settings_for(int node, int nnodes, int port, std::chrono::milliseconds timeout) {
  RendezvousSettings s;
  s.master_port = port;
  s.node_rank = node;
  s.nnodes = nnodes;
  s.token = std::string("t");
  s.job = std::string(R"({"job":1})");  // (assigning char arrays here trips a false -Wrestrict in GCC 12)
  s.timeout = timeout;
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A two-node job at `master_addr`, node 1 in a thread: what each node got, and node 0's log.
struct TwoNodes {
  std::map<int, WorkerAddress> zero_sees, one_sees;
  std::string zero_error, one_error;
  std::vector<std::string> zero_log;
};

TwoNodes two_nodes_at(const std::string& master_addr) {
  TwoNodes r;
  const int port = testing::free_port();
  std::thread one([&] {
    RendezvousSettings s = settings_for(1, 2, port, std::chrono::seconds(20));
    s.master_addr = master_addr;
    r.one_error = error_of([&] { r.one_sees = rendezvous(s, {{1, WorkerAddress{std::byte{7}}}}); });
  });
  RendezvousSettings s = settings_for(0, 2, port, std::chrono::seconds(20));
  s.master_addr = master_addr;
  s.log = [&r](const std::string& line) { r.zero_log.push_back(line); };
  r.zero_error = error_of([&] { r.zero_sees = rendezvous(s, {{0, WorkerAddress{std::byte{5}}}}); });
  one.join();
  return r;
}

// The rendezvous of `s`, asked to stop (with `signal`) at its `at`-th look for a stop.
struct Stopped {
  int signal = 0;  // 0: it did not stop
  int looks = 0;
  std::string what, error;  // the stop's message; any other error
};
Stopped stopped_at_look(RendezvousSettings s, int at, int signal) {
  Stopped r;
  s.stop_requested = [&r, at, signal] { return ++r.looks >= at ? signal : 0; };
  r.error = error_of([&] {
    try {
      rendezvous(s, {});
    } catch (const RendezvousStopped& e) {
      r.signal = e.signal();
      r.what = e.what();
    }
  });
  return r;
}

}  // namespace

TEST_CASE("rendezvous: node 0 names the nodes that never joined, within the timeout", "[comm][rendezvous]") {
  const std::map<int, WorkerAddress> none;
  const std::string two = error_of([&] {
    rendezvous(settings_for(0, 2, testing::free_port(), std::chrono::milliseconds(500)), none);
  });
  CHECK(two.find("1 of 2 nodes joined within 0.5 s (topology.rendezvous_timeout_s); missing: node 1") !=
        std::string::npos);
  const std::string three = error_of([&] {
    rendezvous(settings_for(0, 3, testing::free_port(), std::chrono::milliseconds(200)), none);
  });
  CHECK(three.find("1 of 3 nodes joined within 0.2 s (topology.rendezvous_timeout_s); missing: node 1, 2") !=
        std::string::npos);
}

TEST_CASE("rendezvous: a stop asked for while waiting ends the wait with its signal, on node 0 and the others",
          "[comm][rendezvous]") {
  // Asked to stop at the third look: the waits poll it (a 60 s timeout would fail the test).
  for (int node : {0, 1}) {
    INFO("node " << node);
    const Stopped r = stopped_at_look(settings_for(node, 2, testing::free_port(), std::chrono::seconds(60)), 3, 15);
    CHECK(r.error.empty());
    CHECK(r.signal == 15);
    CHECK(r.looks == 3);
    CHECK(r.what == "asked to stop (signal 15) while waiting for the other nodes at the rendezvous");
  }
  // A node connected to node 0 and waiting for its address book (node 2 never comes) stops too.
  const int port = testing::free_port();
  std::string node0;
  // (Node 0 waits out its timeout: long enough that node 1 joins and stops well before it on a slow machine.)
  std::thread first([&] { node0 = error_of([&] { rendezvous(settings_for(0, 3, port, std::chrono::seconds(8)), {}); }); });
  const bool listening = testing::wait_until_listening(port, std::chrono::seconds(20));  // node 1 connects at once
  // At the 20th look (~2 s of 100 ms waits): joined by then however slowly node 0 answers its token.
  const Stopped node1 = stopped_at_look(settings_for(1, 3, port, std::chrono::seconds(60)), 20, 2);
  first.join();
  REQUIRE(listening);
  CHECK(node1.error.empty());
  CHECK(node1.signal == 2);
  // Node 1 had joined; stopped, it closed its connection: missing again, and named so.
  CHECK(node0.find("1 of 3 nodes joined") != std::string::npos);
  CHECK(node0.find("missing: node 1 (joined, then left), 2") != std::string::npos);
}

TEST_CASE("rendezvous: a node waiting for node 0 to accept its token stops when asked", "[comm][rendezvous]") {
  // Something listens on node 0's port but never answers (node 0 hung or busy, another program):
  // the wait for the token's answer polls for a stop like the others (it held to the timeout).
  const int port = testing::free_port();
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  const sockaddr_in addr = testing::loopback(port);
  REQUIRE(::bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  const Stopped r = stopped_at_look(settings_for(1, 2, port, std::chrono::seconds(30)), 3, 15);
  ::close(listener);
  CHECK(r.error.empty());
  CHECK(r.signal == 15);
  CHECK(r.looks == 3);
}

TEST_CASE("rendezvous: node 0 at an IPv6 address (::1) is reached like an IPv4 one", "[comm][rendezvous]") {
  if (!testing::has_ipv6_loopback()) {  // (some containers switch IPv6 off)
    WARN("no IPv6 loopback here: the ::1 rendezvous was not tried");
    return;
  }
  const TwoNodes r = two_nodes_at("::1");
  CHECK(r.zero_error.empty());
  CHECK(r.one_error.empty());
  const std::map<int, WorkerAddress> both = {{0, WorkerAddress{std::byte{5}}}, {1, WorkerAddress{std::byte{7}}}};
  CHECK(r.zero_sees == both);
  CHECK(r.one_sees == both);
  CHECK(r.zero_log.empty());  // a literal: listened on as given
}

TEST_CASE("rendezvous: a node that joined waits for the address book as long as node 0 waits for the others",
          "[comm][rendezvous]") {
  // Node 1 starts first, with a 4 s timeout; node 0 at 2.5 s (1.5 s before node 1 would stop
  // trying to reach it); node 2 at 4.5 s, after node 1's own 4 s but 2 s before the fresh 4 s
  // node 1 waits from its join: node 1 must not give up on a job that is still forming. (Only the
  // last wait discriminates; each margin is over a second, for loaded machines.)
  const int port = testing::free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::map<int, WorkerAddress> one{{1, WorkerAddress{std::byte{1}}}}, two{{2, WorkerAddress{std::byte{2}}}};
  std::string one_error = "(not run)", two_error = "(not run)";
  std::map<int, WorkerAddress> one_sees;
  std::thread node1([&] {
    one_error = error_of([&] { one_sees = rendezvous(settings_for(1, 3, port, std::chrono::seconds(4)), one); });
  });
  std::thread node2([&] {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(4500));
    two_error = error_of([&] { rendezvous(settings_for(2, 3, port, std::chrono::seconds(30)), two); });
  });
  std::this_thread::sleep_until(start + std::chrono::milliseconds(2500));
  const std::string zero_error = error_of(
      [&] { rendezvous(settings_for(0, 3, port, std::chrono::seconds(30)), {{0, WorkerAddress{std::byte{0}}}}); });
  node1.join();
  node2.join();
  CHECK(zero_error.empty());
  CHECK(one_error.empty());
  CHECK(two_error.empty());
  CHECK(one_sees.size() == 3);
}

TEST_CASE("rendezvous: a node whose node 0 never listens stops after its timeout", "[comm][rendezvous]") {
  const int port = testing::free_port();
  const std::string error =
      error_of([&] { rendezvous(settings_for(1, 2, port, std::chrono::milliseconds(300)), {}); });
  CHECK(error.find("node 0 at 127.0.0.1:" + std::to_string(port) + " did not answer within 0.3 s") !=
        std::string::npos);
}

TEST_CASE("rendezvous: a second process claiming a node rank is refused and told so, and the job goes on",
          "[comm][rendezvous]") {
  const int port = testing::free_port();
  const auto timeout = std::chrono::milliseconds(20000);
  std::map<int, WorkerAddress> node0_result;
  std::thread node0([&] { node0_result = rendezvous(settings_for(0, 3, port, timeout), {{0, WorkerAddress{}}}); });
  // Two processes claim node 1, in either order: one joins, the other is refused at once.
  struct Claim {
    std::map<int, WorkerAddress> result;
    std::string error;
  };
  Claim a, b;
  std::atomic<int> refused{0};
  auto claim = [&](Claim& c) {
    c.error = error_of([&] { c.result = rendezvous(settings_for(1, 3, port, timeout), {{1, WorkerAddress{}}}); });
    if (!c.error.empty()) ++refused;
  };
  std::thread first([&] { claim(a); });
  std::thread second([&] { claim(b); });
  for (int poll = 0; poll < 800 && refused == 0; ++poll) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  const std::map<int, WorkerAddress> node2_result = rendezvous(settings_for(2, 3, port, timeout), {{2, WorkerAddress{}}});
  node0.join();
  first.join();
  second.join();
  CHECK(refused == 1);
  const Claim& lost = a.error.empty() ? b : a;
  const Claim& won = a.error.empty() ? a : b;
  CHECK(lost.error == "node 0 at 127.0.0.1:" + std::to_string(port) +
                          " refused this node's connection claiming node 1, which another process took");
  CHECK(won.result.size() == 3);
  CHECK(node0_result.size() == 3);
  CHECK(node2_result.size() == 3);
}

TEST_CASE("rendezvous: node 0 listens on every interface when its host name resolves to loopback here",
          "[comm][rendezvous]") {
  // The Debian trap: /etc/hosts maps the machine's own name to 127.0.1.1, which no other machine
  // reaches: (name, what it resolves to, where node 0 listens).
  const std::tuple<const char*, const char*, const char*> to_every_interface[] = {
      {"node-a", "127.0.1.1", "0.0.0.0"}, {"node-a", "::1", "::"}, {"node-a", "::ffff:127.0.0.1", "::"}};
  for (const auto& [name, ip, any] : to_every_interface) {
    INFO(name << " at " << ip);
    CHECK(listen_host(name, ip) == any);
  }
  // A name of a network address, an IP literal, and localhost with its aliases are taken as given.
  const std::pair<const char*, const char*> as_given[] = {
      {"node-a", "10.1.2.3"},       {"node-a", "fd00::5"},         {"127.0.1.1", "127.0.1.1"},
      {"::1", "::1"},               {"127.1", "127.0.0.1"},        {"localhost", "127.0.0.1"},
      {"LocalHost.", "127.0.0.1"},  {"ip6-localhost", "::1"},      {"ip6-loopback", "::1"},
      {"node.localhost", "127.0.0.1"}, {"localhost.localdomain", "127.0.0.1"}};
  for (const auto& [name, ip] : as_given) {
    INFO(name << " at " << ip);
    CHECK(listen_host(name, ip) == name);
  }
}

TEST_CASE("rendezvous: at a host name that is loopback here, node 0 says it listens on every interface and is reached",
          "[comm][rendezvous]") {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  char ip[NI_MAXHOST] = {};  // what the name resolves to here, as the rendezvous sees it
  if (::getaddrinfo(name, nullptr, &hints, &found) == 0 && found) {
    ::getnameinfo(found->ai_addr, found->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST);
    ::freeaddrinfo(found);
  }
  if (listen_host(name, ip) == name) {
    WARN("this machine's name '" << name << "' is not a loopback name here (" << ip
                                 << "): the every-interface listen was not tried");
    return;
  }
  const TwoNodes r = two_nodes_at(name);
  CHECK(r.zero_error.empty());
  CHECK(r.one_error.empty());
  CHECK(r.one_sees.size() == 2);
  REQUIRE(r.zero_log.size() == 1);
  CHECK_THAT(r.zero_log[0], Catch::StartsWith("listening on every interface"));
  CHECK_THAT(r.zero_log[0], Catch::Contains(std::string("'") + name + "'"));
}

namespace {

// A raw connection to node 0 on 127.0.0.1:port (an intruder, or a node speaking by hand).
int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in addr = testing::loopback(port);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}
// A message as the rendezvous frames it: a 4-byte big-endian length, then the JSON text.
std::string frame(const nlohmann::json& message) {
  const std::string text = message.dump();
  const std::uint32_t length = htonl(static_cast<std::uint32_t>(text.size()));
  return std::string(reinterpret_cast<const char*>(&length), 4) + text;
}
// Node 0's log, written by its thread while the test reads it.
class SharedLog {
 public:
  std::function<void(const std::string&)> writer() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    };
  }
  bool has(const std::string& part) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::any_of(lines_.begin(), lines_.end(),
                       [&](const std::string& l) { return l.find(part) != std::string::npos; });
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// Node 0 of an `nnodes` job on `port`, in a thread of its own, its log kept.
struct Node0 {
  SharedLog log;
  std::map<int, WorkerAddress> sees;
  std::string error;
  std::thread thread;  // last: started once the rest exists
  Node0(int nnodes, int port, std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : thread([this, nnodes, port, timeout] {
          RendezvousSettings s = settings_for(0, nnodes, port, timeout);
          s.log = log.writer();
          error = error_of([&] { sees = rendezvous(s, {{0, WorkerAddress{std::byte{5}}}}); });
        }) {}
};

}  // namespace

TEST_CASE("rendezvous: a connection is read no further than a small greeting before its token is checked",
          "[comm][rendezvous]") {
  // A length header promising 32 MiB (a frame node 0 would have parsed whole before: ~1 GB of
  // JSON tree for nested brackets) is dropped unread; a wrong token is refused.
  const int port = testing::free_port();
  Node0 zero(2, port);
  REQUIRE(testing::wait_until_listening(port, std::chrono::seconds(20)));
  const int big = connect_raw(port);
  const std::uint32_t length = htonl(32u << 20);
  REQUIRE(::send(big, &length, 4, MSG_NOSIGNAL) == 4);
  const int wrong = connect_raw(port);
  const std::string greeting = frame({{"token", "not-the-token"}});
  REQUIRE(::send(wrong, greeting.data(), greeting.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(greeting.size()));
  // The refusal comes back before any other node joined: node 0 read the greeting and stopped.
  const nlohmann::json answer = framing::receive_message(wrong, framing::Clock::now() + std::chrono::seconds(20));
  CHECK(answer.value("key", std::string()) == "ATOLL_JOB_TOKEN");
  std::map<int, WorkerAddress> one_sees;
  const std::string one_error = error_of([&] {
    one_sees = rendezvous(settings_for(1, 2, port, std::chrono::seconds(20)), {{1, WorkerAddress{std::byte{7}}}});
  });
  zero.thread.join();
  ::close(big);
  ::close(wrong);
  CHECK(zero.error.empty());
  CHECK(one_error.empty());
  CHECK(zero.sees.size() == 2);
  CHECK(one_sees == zero.sees);
  CHECK(zero.log.has("dropped a connection that sent no valid greeting: control channel: a message of 33554432 "
                           "bytes (more than the limit of 4096)"));
  CHECK(zero.log.has("refused a connection with a wrong job token"));
}

TEST_CASE("rendezvous: a node that joined and went away (restarted by its launcher) takes its place again",
          "[comm][rendezvous]") {
  const int port = testing::free_port();
  Node0 zero(3, port);
  REQUIRE(testing::wait_until_listening(port, std::chrono::seconds(20)));
  // Node 1's first process joins by hand with an address node 0 must forget, and dies.
  const int first = connect_raw(port);
  const auto soon = framing::Clock::now() + std::chrono::seconds(20);
  framing::send_message(first, nlohmann::json{{"token", "t"}}, soon);
  CHECK(framing::receive_message(first, soon).contains("accepted"));
  framing::send_message(first, nlohmann::json{{"node", 1}, {"job", R"({"job":1})"}, {"addresses", {{"1", "ff"}}}},
                        soon);
  ::close(first);
  std::map<int, WorkerAddress> one_sees, two_sees;
  std::string one_error;
  std::thread node1([&] {
    one_error = error_of([&] {
      one_sees = rendezvous(settings_for(1, 3, port, std::chrono::seconds(20)), {{1, WorkerAddress{std::byte{7}}}});
    });
  });
  // Node 2 last: node 0 has taken the second node 1 by then, or the job would start without it.
  for (int poll = 0; poll < 800 && !zero.log.has("joined again"); ++poll) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const std::string two_error = error_of([&] {
    two_sees = rendezvous(settings_for(2, 3, port, std::chrono::seconds(20)), {{2, WorkerAddress{std::byte{9}}}});
  });
  zero.thread.join();
  node1.join();
  CHECK(zero.error.empty());
  CHECK(one_error.empty());
  CHECK(two_error.empty());
  CHECK(zero.log.has("node 1 joined again (its earlier connection had closed)"));
  REQUIRE(zero.sees.size() == 3);
  CHECK(zero.sees.at(1) == WorkerAddress{std::byte{7}});  // the live process's address, not the dead one's
  CHECK(one_sees == zero.sees);
  CHECK(two_sees == zero.sees);
}

TEST_CASE("framing: a timeout or a closed peer is said without a stale system error", "[comm][rendezvous]") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  errno = EINPROGRESS;  // what a non-blocking connect leaves behind
  CHECK(error_of([&] { framing::receive_message(fds[0], framing::Clock::now() + std::chrono::milliseconds(10)); }) ==
        "control channel: timed out waiting for a message");
  ::close(fds[1]);
  errno = EINPROGRESS;
  CHECK(error_of([&] { framing::receive_message(fds[0], framing::Clock::now() + std::chrono::seconds(20)); }) ==
        "control channel: the peer closed the connection");
  ::close(fds[0]);
}

TEST_CASE("rendezvous: node 0 names a node that joined and then ended as missing again", "[comm][rendezvous]") {
  const int port = testing::free_port();
  Node0 zero(3, port, std::chrono::seconds(4));
  REQUIRE(testing::wait_until_listening(port, std::chrono::seconds(20)));
  const int one = connect_raw(port);  // node 1 joins by hand, and its process ends
  const auto soon = framing::Clock::now() + std::chrono::seconds(20);
  framing::send_message(one, nlohmann::json{{"token", "t"}}, soon);
  CHECK(framing::receive_message(one, soon).contains("accepted"));
  framing::send_message(one, nlohmann::json{{"node", 1}, {"job", R"({"job":1})"}, {"addresses", {{"1", "ff"}}}}, soon);
  ::close(one);
  zero.thread.join();
  CHECK_THAT(zero.error, Catch::Contains("1 of 3 nodes joined within 4 s") &&
                             Catch::Contains("missing: node 1 (joined, then left), 2"));
  CHECK(zero.log.has("node 1 left the rendezvous (its connection closed)"));
}

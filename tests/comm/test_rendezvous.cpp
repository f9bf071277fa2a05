// The rendezvous's bounded waits (topology.rendezvous_timeout_s): node 0 names the nodes that
// never joined; a node whose node 0 never listens says so; a refused node is told why.
#include <catch2/catch.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

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
    RendezvousSettings s = settings_for(node, 2, testing::free_port(), std::chrono::seconds(60));
    int looks = 0;
    s.stop_requested = [&looks] { return ++looks >= 3 ? 15 : 0; };
    try {
      rendezvous(s, {});
      FAIL("no stop");
    } catch (const RendezvousStopped& e) {
      CHECK(e.signal() == 15);
      CHECK(looks == 3);
      CHECK(std::string(e.what()) == "asked to stop (signal 15) while waiting for the other nodes at the rendezvous");
    }
  }
  // A node connected to node 0 and waiting for its address book (node 2 never comes) stops too.
  const int port = testing::free_port();
  std::string node0;
  std::thread first([&] { node0 = error_of([&] { rendezvous(settings_for(0, 3, port, std::chrono::milliseconds(1500)), {}); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (order only: node 0 listens first)
  RendezvousSettings s = settings_for(1, 3, port, std::chrono::seconds(60));
  int looks = 0;
  s.stop_requested = [&looks] { return ++looks >= 3 ? 2 : 0; };
  int stopped_by = 0;
  try {
    rendezvous(s, {});
  } catch (const RendezvousStopped& e) {
    stopped_by = e.signal();
  }
  first.join();
  CHECK(stopped_by == 2);
  CHECK(node0.find("missing: node 2") != std::string::npos);
}

TEST_CASE("rendezvous: node 0 at an IPv6 address (::1) is reached like an IPv4 one", "[comm][rendezvous]") {
  // Only where this machine has IPv6 loopback (some containers switch IPv6 off).
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 any6{};
  any6.sin6_family = AF_INET6;
  any6.sin6_addr = in6addr_loopback;
  const bool has_ipv6 = probe >= 0 && ::bind(probe, reinterpret_cast<const sockaddr*>(&any6), sizeof(any6)) == 0;
  if (probe >= 0) ::close(probe);
  if (!has_ipv6) {
    WARN("no IPv6 loopback here: the ::1 rendezvous was not tried");
    return;
  }
  const int port = testing::free_port();
  std::map<int, WorkerAddress> zero_sees, one_sees;
  std::string one_error;
  std::thread one([&] {
    RendezvousSettings s = settings_for(1, 2, port, std::chrono::seconds(20));
    s.master_addr = "::1";
    one_error = error_of([&] { one_sees = rendezvous(s, {{1, WorkerAddress{std::byte{7}}}}); });
  });
  RendezvousSettings s = settings_for(0, 2, port, std::chrono::seconds(20));
  s.master_addr = "::1";
  const std::string zero_error = error_of([&] { zero_sees = rendezvous(s, {{0, WorkerAddress{std::byte{5}}}}); });
  one.join();
  CHECK(zero_error.empty());
  CHECK(one_error.empty());
  const std::map<int, WorkerAddress> both = {{0, WorkerAddress{std::byte{5}}}, {1, WorkerAddress{std::byte{7}}}};
  CHECK(zero_sees == both);
  CHECK(one_sees == both);
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
  // The Debian trap: /etc/hosts maps the machine's own name to 127.0.1.1, which no other machine reaches.
  CHECK(listen_host("node-a", "127.0.1.1") == "0.0.0.0");
  CHECK(listen_host("node-a", "::1") == "::");
  CHECK(listen_host("node-a", "::ffff:127.0.0.1") == "::");
  // A name of a network address, an IP literal, and localhost are taken as given.
  CHECK(listen_host("node-a", "10.1.2.3") == "node-a");
  CHECK(listen_host("node-a", "fd00::5") == "node-a");
  CHECK(listen_host("127.0.1.1", "127.0.1.1") == "127.0.1.1");
  CHECK(listen_host("::1", "::1") == "::1");
  CHECK(listen_host("127.1", "127.0.0.1") == "127.1");
  CHECK(listen_host("localhost", "127.0.0.1") == "localhost");
  CHECK(listen_host("LocalHost.", "127.0.0.1") == "LocalHost.");
  CHECK(listen_host("ip6-localhost", "::1") == "ip6-localhost");
  CHECK(listen_host("node.localhost", "127.0.0.1") == "node.localhost");
}

TEST_CASE("rendezvous: at a host name that is loopback here, node 0 says it listens on every interface and is reached",
          "[comm][rendezvous]") {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  bool loopback = false;
  if (::getaddrinfo(name, nullptr, &hints, &found) == 0 && found) {
    const sockaddr* a = found->ai_addr;
    loopback = (a->sa_family == AF_INET && (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127) ||
               (a->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr));
    ::freeaddrinfo(found);
  }
  if (!loopback || listen_host(name, "127.0.0.1") == name) {  // (localhost and its aliases listen as named)
    WARN("this machine's name '" << name << "' is not a loopback name here: the every-interface listen was not tried");
    return;
  }
  const int port = testing::free_port();
  std::string one_error;
  std::thread one([&] {
    RendezvousSettings s = settings_for(1, 2, port, std::chrono::seconds(20));
    s.master_addr = name;
    one_error = error_of([&] { rendezvous(s, {{1, WorkerAddress{std::byte{7}}}}); });
  });
  RendezvousSettings s = settings_for(0, 2, port, std::chrono::seconds(20));
  s.master_addr = name;
  std::vector<std::string> logged;
  s.log = [&](const std::string& line) { logged.push_back(line); };
  const std::string zero_error = error_of([&] { rendezvous(s, {{0, WorkerAddress{std::byte{5}}}}); });
  one.join();
  CHECK(zero_error.empty());
  CHECK(one_error.empty());
  REQUIRE(logged.size() == 1);
  CHECK_THAT(logged[0], Catch::StartsWith("listening on every interface"));
  CHECK_THAT(logged[0], Catch::Contains(std::string("'") + name + "'"));
}

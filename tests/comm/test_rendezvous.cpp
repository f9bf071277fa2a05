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
#include <tuple>
#include <utility>
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
  // (Node 0 waits out its timeout: long enough that node 1 joins and stops well before it on a slow machine.)
  std::thread first([&] { node0 = error_of([&] { rendezvous(settings_for(0, 3, port, std::chrono::seconds(8)), {}); }); });
  const bool listening = testing::wait_until_listening(port, std::chrono::seconds(20));  // node 1 connects at once
  RendezvousSettings s = settings_for(1, 3, port, std::chrono::seconds(60));
  int looks = 0;
  s.stop_requested = [&looks] { return ++looks >= 3 ? 2 : 0; };
  int stopped_by = 0;
  const std::string node1 = error_of([&] {
    try {
      rendezvous(s, {});
    } catch (const RendezvousStopped& e) {
      stopped_by = e.signal();
    }
  });
  first.join();
  REQUIRE(listening);
  CHECK(node1.empty());
  CHECK(stopped_by == 2);
  CHECK(node0.find("2 of 3 nodes joined") != std::string::npos);  // node 1 had joined before it stopped
  CHECK(node0.find("missing: node 2") != std::string::npos);
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

// The rendezvous's bounded waits (topology.rendezvous_timeout_s): node 0 names the nodes that
// never joined; a node whose node 0 never listens says so; both within their timeout.
#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <string>

#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "tests/support/free_port.hpp"

using namespace atl;

namespace {

RendezvousSettings settings_for(int node, int nnodes, int port, std::chrono::milliseconds timeout) {
  RendezvousSettings s;
  s.master_port = port;
  s.node_rank = node;
  s.nnodes = nnodes;
  s.token = "t";
  s.job = R"({"job":1})";
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
  const int port = testing::free_port();
  const std::map<int, WorkerAddress> none;
  // Node 1 of 3 joins; node 2 never comes. Node 0 gives up after 0.6 s, and node 1, waiting for the
  // address book, fails when node 0 goes.
  auto node1 = std::async(std::launch::async, [&] {
    return error_of([&] { rendezvous(settings_for(1, 3, port, std::chrono::seconds(20)), none); });
  });
  const std::string node0 = error_of([&] { rendezvous(settings_for(0, 3, port, std::chrono::milliseconds(600)), none); });
  CHECK(node0.find("2 of 3 nodes joined within 0.6 s (topology.rendezvous_timeout_s); missing: node 2") !=
        std::string::npos);
  CHECK_FALSE(node1.get().empty());
}

TEST_CASE("rendezvous: a node whose node 0 never listens stops after its timeout", "[comm][rendezvous]") {
  const int port = testing::free_port();
  const std::string error =
      error_of([&] { rendezvous(settings_for(1, 2, port, std::chrono::milliseconds(300)), {}); });
  CHECK(error.find("node 0 at 127.0.0.1:" + std::to_string(port) + " did not answer within 0.3 s") !=
        std::string::npos);
}

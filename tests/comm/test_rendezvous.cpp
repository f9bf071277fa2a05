// The rendezvous's bounded waits (topology.rendezvous_timeout_s): node 0 names the nodes that
// never joined; a node whose node 0 never listens says so.
#include <catch2/catch.hpp>

#include <chrono>
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

TEST_CASE("rendezvous: a node whose node 0 never listens stops after its timeout", "[comm][rendezvous]") {
  const int port = testing::free_port();
  const std::string error =
      error_of([&] { rendezvous(settings_for(1, 2, port, std::chrono::milliseconds(300)), {}); });
  CHECK(error.find("node 0 at 127.0.0.1:" + std::to_string(port) + " did not answer within 0.3 s") !=
        std::string::npos);
}

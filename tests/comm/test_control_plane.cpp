// The control plane of a multi-process job on its own (comm/rendezvous/control_plane.hpp), three
// nodes joined by socket pairs the way the rendezvous leaves them (node 0 to each node): a node
// that stops answering is lost after the timeout and node 0 tells the others which; a node that
// said goodbye is never lost, and every node hears its goodbye; an abort reaches every node with its code, through node 0.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "comm/rendezvous/control_plane.hpp"

using namespace atl;

namespace {

// What one node's callbacks saw, with a deadlock watchdog for waiting on it (never a timing claim).
struct Seen {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> events;

  void add(const std::string& event) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(event);
    changed.notify_all();
  }
  bool wait_for_events(std::size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(60), [&] { return events.size() >= n; });
  }
  std::vector<std::string> all() {
    std::lock_guard<std::mutex> lock(mutex);
    return events;
  }
};

ControlPlaneSettings settings_for(int node, std::chrono::milliseconds timeout, Seen& seen) {
  ControlPlaneSettings s;
  s.node_rank = node;
  s.heartbeat = std::chrono::milliseconds(50);
  s.timeout = timeout;
  s.on_lost = [&seen](int lost, const std::string& why) { seen.add("lost " + std::to_string(lost) + ": " + why); };
  s.on_goodbye = [&seen](int n) { seen.add("goodbye " + std::to_string(n)); };
  s.on_abort = [&seen](int n, int code, const std::string& why) {
    seen.add("abort " + std::to_string(n) + " exit " + std::to_string(code) + ": " + why);
  };
  return s;
}

// Node 0's end and node n's end of one connection.
struct Link {
  int zero = -1, other = -1;
  Link() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    zero = fds[0];
    other = fds[1];
  }
};

RendezvousLinks links(std::initializer_list<std::pair<const int, int>> sockets) { return RendezvousLinks{sockets}; }

}  // namespace

TEST_CASE("control plane: a node that stops answering is lost after the timeout, and node 0 names it to the others",
          "[comm][control]") {
  Seen zero_seen, one_seen;
  const Link one, two;  // node 2 never runs a control plane: alive, connected, silent (a stopped process)
  // (2 s: far beyond node 1's 50 ms heartbeats even on a loaded machine, so only node 2 is lost.)
  auto zero = std::make_unique<ControlPlane>(settings_for(0, std::chrono::seconds(2), zero_seen),
                                             links({{1, one.zero}, {2, two.zero}}));
  auto node1 = std::make_unique<ControlPlane>(settings_for(1, std::chrono::seconds(60), one_seen), links({{0, one.other}}));
  REQUIRE(zero_seen.wait_for_events(1));
  REQUIRE(one_seen.wait_for_events(1));
  node1.reset();
  zero.reset();
  ::close(two.other);
  CHECK(zero_seen.all() ==
        std::vector<std::string>{"lost 2: no heartbeat for 2 s (topology.heartbeat_timeout_s)"});
  CHECK(one_seen.all() ==
        std::vector<std::string>{"lost 2: node 0 lost it: no heartbeat for 2 s (topology.heartbeat_timeout_s)"});
}

TEST_CASE("control plane: a node that said goodbye is not lost when its connection closes, one that dies without is",
          "[comm][control]") {
  Seen zero_seen, one_seen, two_seen;
  const Link one, two;
  auto zero = std::make_unique<ControlPlane>(settings_for(0, std::chrono::seconds(30), zero_seen),
                                             links({{1, one.zero}, {2, two.zero}}));
  auto node1 = std::make_unique<ControlPlane>(settings_for(1, std::chrono::seconds(60), one_seen), links({{0, one.other}}));
  auto node2 = std::make_unique<ControlPlane>(settings_for(2, std::chrono::seconds(60), two_seen), links({{0, two.other}}));
  node1->finish();  // goodbye, then its sockets close
  REQUIRE(zero_seen.wait_for_events(1));
  // Node 2 hears it too, through node 0: node 1's data endpoints closing is its end there as well.
  REQUIRE(two_seen.wait_for_events(1));
  CHECK(two_seen.all() == std::vector<std::string>{"goodbye 1"});
  // Node 2 then dies without a goodbye: that one is lost (a closed connection, at once).
  node2.reset();
  REQUIRE(zero_seen.wait_for_events(2));
  zero.reset();
  node1.reset();
  const std::vector<std::string> seen = zero_seen.all();
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == "goodbye 1");
  CHECK_THAT(seen[1], Catch::StartsWith("lost 2: its connection broke"));
}

TEST_CASE("control plane: an abort reaches every node with its exit code, node 0 passing it on", "[comm][control]") {
  Seen zero_seen, one_seen, two_seen;
  const Link one, two;
  auto zero = std::make_unique<ControlPlane>(settings_for(0, std::chrono::seconds(60), zero_seen),
                                             links({{1, one.zero}, {2, two.zero}}));
  auto node1 = std::make_unique<ControlPlane>(settings_for(1, std::chrono::seconds(60), one_seen), links({{0, one.other}}));
  auto node2 = std::make_unique<ControlPlane>(settings_for(2, std::chrono::seconds(60), two_seen), links({{0, two.other}}));
  node2->abort(3, "non-finite weights at the save");
  REQUIRE(zero_seen.wait_for_events(1));
  REQUIRE(one_seen.wait_for_events(1));
  zero.reset();
  node1.reset();
  node2.reset();
  CHECK(zero_seen.all() == std::vector<std::string>{"abort 2 exit 3: non-finite weights at the save"});
  CHECK(one_seen.all() == std::vector<std::string>{"abort 2 exit 3: non-finite weights at the save"});
  CHECK(two_seen.all().empty());  // its own abort is no news to it
}

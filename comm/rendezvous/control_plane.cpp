#include "comm/rendezvous/control_plane.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/rendezvous/framing.hpp"

namespace atl {

using framing::Clock;
using json = nlohmann::json;

struct ControlPlane::Impl {
  ControlPlaneSettings settings;
  struct Peer {
    int fd = -1;
    Clock::time_point last_seen;
    bool finished = false;
  };
  std::map<int, Peer> peers;
  std::atomic<bool> stopping{false};
  bool reported = false;
  std::mutex send_mutex;  // heartbeats (control thread) and goodbyes (finish) share the sockets
  std::thread thread;

  void lost(int node, const std::string& why) {
    if (reported) return;
    reported = true;
    if (settings.node_rank == 0) last_word(node, json{{"lost", node}, {"why", why}});  // which node is gone
    if (settings.on_lost) settings.on_lost(node, why);
  }

  // This node's last word before it ends (its farewell, or node 0 passing on a loss or an abort):
  // `message` to every peer still in the job but `except` (best effort), then the end of its
  // sending side, read until they close (drain).
  void last_word(int except, const json& message) {
    pass_on(except, message);
    for (auto& [node, peer] : peers) ::shutdown(peer.fd, SHUT_WR);
    drain(Clock::now() + std::chrono::seconds(2));
  }

  // Closing a socket with unread data sends a reset, which can overtake the last message sent on
  // it and read as a crash on the other side: after shutting down the sending side, read what is
  // still coming (heartbeats sent before the peer saw that message) until every peer closes or
  // `deadline` passes.
  void drain(Clock::time_point deadline) {
    for (auto& [node, peer] : peers) {
      char sink[4096];
      while (peer.fd >= 0 && framing::wait_for(peer.fd, POLLIN, deadline)) {
        const ssize_t n = ::recv(peer.fd, sink, sizeof(sink), 0);
        if (n <= 0) break;  // the peer closed (or the connection is gone)
      }
    }
  }

  // `message` to every peer still in the job but `except`, best effort (a peer whose connection
  // broke is found lost by the receive side).
  void pass_on(int except, const json& message) {
    for (auto& [other, peer] : peers) {
      if (other == except || peer.finished) continue;
      try {
        send(peer.fd, message);
      } catch (const std::exception&) {
      }
    }
  }

  void send(int fd, const json& message) {
    std::lock_guard<std::mutex> lock(send_mutex);
    framing::send_message(fd, message, Clock::now() + std::chrono::seconds(1));
  }

  void loop() {
    auto next_beat = Clock::now();
    while (!stopping) {
      const auto now = Clock::now();
      if (now >= next_beat) {
        for (auto& [node, peer] : peers) {
          if (peer.finished) continue;
          try {
            send(peer.fd, json{{"heartbeat", settings.node_rank}});
          } catch (const std::exception&) {
            // The receive side decides: a goodbye may be waiting to be read, else the broken
            // connection reads as lost there.
          }
        }
        next_beat = now + settings.heartbeat;
      }
      std::vector<pollfd> fds;
      std::vector<int> nodes;
      for (auto& [node, peer] : peers) {
        if (peer.finished) continue;
        fds.push_back({peer.fd, POLLIN, 0});
        nodes.push_back(node);
      }
      if (fds.empty()) return;
      ::poll(fds.data(), fds.size(), static_cast<int>(settings.heartbeat.count()));
      for (std::size_t i = 0; i < fds.size() && !stopping; ++i) {
        Peer& peer = peers[nodes[i]];
        if (fds[i].revents != 0) {
          try {
            const json m = framing::receive_message(peer.fd, Clock::now() + std::chrono::seconds(1));
            peer.last_seen = Clock::now();
            if (m.contains("goodbye")) {
              peer.finished = true;
              if (settings.on_goodbye) settings.on_goodbye(nodes[i]);
              // The others hear it through node 0 (a star), before the node's drain ends and it
              // closes its data endpoints: their breaking is its end, not a failure, there too.
              if (settings.node_rank == 0) pass_on(nodes[i], json{{"finished", nodes[i]}});
              ::shutdown(peer.fd, SHUT_WR);  // nothing more to say: its drain sees the end at once
            }
            if (m.contains("finished") && settings.on_goodbye) settings.on_goodbye(m["finished"].get<int>());
            if (m.contains("lost")) lost(m["lost"].get<int>(), "node 0 lost it: " + m.value("why", std::string()));
            if (m.contains("abort") && !reported) {
              reported = true;  // its connection closing next is the abort, not a loss
              const int origin = m.value("node", nodes[i]);
              peer.finished = true;  // its end follows: no more polling it (on_abort normally exits)
              if (settings.node_rank == 0) last_word(nodes[i], m);  // the others hear it through node 0
              if (settings.on_abort) settings.on_abort(origin, m["abort"].get<int>(), m.value("why", std::string()));
            }
          } catch (const std::exception& e) {
            if (!stopping) lost(nodes[i], std::string("its connection broke: ") + e.what());
          }
        } else if (Clock::now() - peer.last_seen > settings.timeout) {
          lost(nodes[i], "no heartbeat for " + framing::seconds_text(settings.timeout) + " s (topology.heartbeat_timeout_s)");
        }
      }
    }
  }

  void close_all() {
    for (auto& [node, peer] : peers) {
      if (peer.fd >= 0) ::close(peer.fd);
      peer.fd = -1;
    }
  }
};

ControlPlane::ControlPlane(ControlPlaneSettings settings, RendezvousLinks links) : impl_(std::make_unique<Impl>()) {
  impl_->settings = std::move(settings);
  for (const auto& [node, fd] : links.sockets) impl_->peers[node] = Impl::Peer{fd, Clock::now(), false};
  impl_->thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

void ControlPlane::finish() { farewell(json{{"goodbye", impl_->settings.node_rank}}); }

void ControlPlane::abort(int exit_code, const std::string& why) {
  farewell(json{{"abort", exit_code}, {"why", why}, {"node", impl_->settings.node_rank}});
}

void ControlPlane::farewell(const nlohmann::json& message) {
  if (!impl_->thread.joinable()) return;
  if (impl_->settings.on_ending) impl_->settings.on_ending();  // before the peers can react
  impl_->stopping = true;
  impl_->thread.join();
  impl_->last_word(-1, message);
  impl_->close_all();
}

ControlPlane::~ControlPlane() {
  if (impl_->thread.joinable()) {
    impl_->stopping = true;
    impl_->thread.join();
  }
  impl_->close_all();
}

}  // namespace atl

// The control plane of a multi-process job after the rendezvous (issue 11): heartbeats over the
// rendezvous connections (node 0 to every node, every node to node 0) and failure detection. A
// peer is lost when its connection breaks (a process that dies closes its sockets: detected at
// once) or no heartbeat came for `timeout` (a stopped or cut-off node). Node 0 tells every other
// node which node it lost; a node that loses node 0 knows it too. `on_lost` runs once, on the
// control thread; the caller decides what stopping means (atoll-train exits 1 naming the node).
// finish() says goodbye on success, so peers that finish later do not count this node as lost;
// destroying a control plane without finish() closes the connections like a dying process.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "comm/rendezvous/tcp_rendezvous.hpp"

namespace atl {

struct ControlPlaneSettings {
  int node_rank = 0;
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds timeout{std::chrono::seconds(5)};
  std::function<void(int lost_node, const std::string& why)> on_lost;
  // A node said goodbye (it finished the job): a peer, or, on the other nodes, any node, whose
  // goodbye node 0 passes on. On the control thread. Optional.
  std::function<void(int node)> on_goodbye;
  // This node is ending the job (finish() or abort(), before its farewell): the other nodes'
  // ends from here on are expected. On the caller's thread. Optional.
  std::function<void()> on_ending;
  // A node ended the job with an exit code every node should share (abort()); on the control
  // thread, once. Node 0 relays it to the others first.
  std::function<void(int node, int exit_code, const std::string& why)> on_abort;
};

class ControlPlane {
 public:
  ControlPlane(ControlPlaneSettings settings, RendezvousLinks links);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;
  void finish();  // this node is done: goodbye to every peer, then close
  // This node ends the job with `exit_code` (a failure it alone saw, which every node should
  // report alike): every peer's on_abort runs with it. Then close, as finish().
  void abort(int exit_code, const std::string& why);

  struct Impl;

 private:
  void farewell(const nlohmann::json& message);  // the last message to every peer, then close
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl

// The rendezvous of a multi-process job (issue 11) over a plain TCP channel: node 0 listens on
// the master address and port, every other node connects and sends, first, the job token alone
// (node 0 reads at most 4 KiB of a connection before it has checked the token, and answers
// "accepted" or a refusal before the node says more), then its node rank, the job description (the resolved config as JSON text: every node must run the
// same job) and its ranks' UCX worker addresses. Node 0 drops and logs a connection whose token
// is wrong (the job is unaffected) and, once every node has joined, compares the descriptions:
// all equal, it sends every node the whole address book; otherwise every node (node 0 included)
// fails with the first key whose value differs. Tensors never travel here.
//
// Messages are a 4-byte big-endian length and a JSON object. Waits are bounded (`timeout`); a
// joining node retries its connection until node 0 listens or the timeout passes.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "comm/ucx/ucx_world.hpp"

namespace atl {

// Nodes disagree about the job: `key` is the first differing config key ("train.lr").
class JobMismatch : public std::runtime_error {
 public:
  JobMismatch(std::string key, const std::string& what) : std::runtime_error(what), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// The process was asked to stop (a signal) while it waited for the other nodes.
class RendezvousStopped : public std::runtime_error {
 public:
  RendezvousStopped(int signal, const std::string& what) : std::runtime_error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

struct RendezvousSettings {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int node_rank = 0;
  int nnodes = 1;
  std::string token;  // the job token every connection must present first
  std::string job;    // the job description (JSON text) every node must agree on
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  std::function<void(const std::string&)> log;  // node 0: a refused connection, say
  // A signal number once the process is asked to stop, else 0; polled while waiting (RendezvousStopped).
  std::function<int()> stop_requested;
};

// The connections the rendezvous leaves open (node 0: one per other node; the others: one to
// node 0), for the control plane's heartbeats (comm/rendezvous/control_plane.hpp).
struct RendezvousLinks {
  std::map<int, int> sockets;  // node -> connected socket (owned: closed by the control plane)
};

// Every rank's worker address; `mine` are this node's. Throws JobMismatch when the descriptions
// differ, RendezvousStopped when asked to stop while waiting, std::runtime_error on a timeout or a
// broken connection. `links`: keep the connections.
std::map<int, WorkerAddress> rendezvous(const RendezvousSettings& settings, const std::map<int, WorkerAddress>& mine,
                                        RendezvousLinks* links = nullptr);

// Where node 0 listens, given the master address and what it resolves to here (an IP in text):
// the master address itself, except for a host name (not an IP literal, not localhost or one of
// its aliases) that resolves to a loopback address. Debian's /etc/hosts maps a machine's own name
// to 127.0.1.1, while the other machines reach it by its network address; node 0 then listens on
// every interface ("0.0.0.0", or "::" for IPv6), as torchrun's store does. The job token still
// guards every connection.
std::string listen_host(const std::string& master_addr, const std::string& resolved_ip);

// The first key path whose values differ between two JSON texts ("" when equal): objects by key
// in order, arrays by index ("a.b[2]").
std::string first_difference(const std::string& left_json, const std::string& right_json);

}  // namespace atl

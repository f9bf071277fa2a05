// The comm actor of one rank: one collective stream over all of the rank's groups. Requests carry
// the sequence numbers of the step program (the same on every rank); the actor issues them to
// the group's Communicator strictly in that order (holding early arrivals), so every rank issues
// the same collectives in the same order on each group and across groups — what NCCL on one
// stream requires and what the sim backend's rendezvous checks.
#include <map>

#include "actors/spawn.hpp"
#include "actors/supervision.hpp"

namespace atl {

namespace {

struct CommState {
  std::map<std::string, std::shared_ptr<Communicator>> groups;  // by axis
  std::uint64_t next_seq = 0;
  std::map<std::uint64_t, CollectiveRequest> waiting;                       // arrived early
  std::map<std::uint64_t, caf::typed_response_promise<done_atom>> pending;  // issued, not done
};

using comm_pointer = comm_actor::stateful_pointer<CommState>;

void issue_ready(comm_pointer self) {
  auto& st = self->state;
  for (auto it = st.waiting.find(st.next_seq); it != st.waiting.end(); it = st.waiting.find(st.next_seq)) {
    CollectiveRequest req = std::move(it->second);
    st.waiting.erase(it);
    ++st.next_seq;
    const auto group = st.groups.find(req.axis);
    if (group == st.groups.end()) {
      throw std::logic_error("comm actor: collective #" + std::to_string(req.seq) + " (" + req.tag +
                             ") names group axis '" + req.axis + "' that this rank does not have");
    }
    // Completions arrive on a backend thread: turn them into a message to this actor.
    comm_actor handle = self;
    Completion done = [handle, seq = req.seq] { caf::anon_send(handle, completed_atom::value, seq); };
    Communicator& c = *group->second;
    switch (req.kind) {
      case CollectiveKind::all_gather:
        c.all_gather(req.send, req.recv, req.tag, done);
        break;
      case CollectiveKind::reduce_scatter:
        c.reduce_scatter(req.send, req.recv, req.tag, done);
        break;
      case CollectiveKind::all_reduce:
        c.all_reduce(req.recv, req.tag, done);
        break;
      case CollectiveKind::all_to_all_v:
        c.all_to_all_v(req.send, req.send_counts, req.recv, req.recv_counts, req.tag, done);
        break;
      default:
        throw std::logic_error(std::string("comm actor: unsupported collective ") + collective_name(req.kind));
    }
  }
}

// The stream cannot go on: every request this actor holds gets `error` rather than no answer, and
// the actor ends (a gap no later number can pass: a request arriving after this would wait
// forever); the trainer fails the step with the error.
void fail_stream(comm_pointer self, const std::string& reason) {
  const caf::error error = caf::make_error(caf::sec::runtime_error, reason);
  for (auto& [seq, pending] : self->state.pending) pending.deliver(error);
  self->state.pending.clear();
  self->state.waiting.clear();
  self->quit(error);
}

comm_actor::behavior_type comm_behavior(comm_pointer self, std::map<std::string, std::shared_ptr<Communicator>> groups) {
  exit_with_exception_message(self);
  self->state.groups = std::move(groups);
  return {
      [=](collect_atom, CollectiveRequest req) -> caf::result<done_atom> {
        auto& st = self->state;
        // A number already issued or held is a numbering bug; kept quiet, its request would never
        // be issued nor answered.
        if (req.seq < st.next_seq || st.pending.count(req.seq) > 0) {
          const std::string reason = "comm actor: collective #" + std::to_string(req.seq) + " (" + req.tag +
                                     ") was asked for twice (this rank's stream is at #" +
                                     std::to_string(st.next_seq) + ")";
          fail_stream(self, reason);
          return caf::make_error(caf::sec::runtime_error, reason);
        }
        auto rp = self->make_response_promise<done_atom>();
        st.pending.emplace(req.seq, rp);
        st.waiting.emplace(req.seq, std::move(req));
        try {
          issue_ready(self);
        } catch (const std::exception& e) {  // a collective the backend refuses: a mismatch between ranks
          fail_stream(self, e.what());
        }
        return rp;
      },
      [=](completed_atom, std::uint64_t seq) {
        auto it = self->state.pending.find(seq);
        if (it == self->state.pending.end()) return;
        it->second.deliver(done_atom::value);
        self->state.pending.erase(it);
      },
  };
}

}  // namespace

comm_actor spawn_comm_actor(caf::actor_system& system, std::vector<std::unique_ptr<Communicator>> communicators) {
  std::map<std::string, std::shared_ptr<Communicator>> groups;
  for (auto& c : communicators) {
    const std::string axis = c->group().axis;
    if (!groups.emplace(axis, std::shared_ptr<Communicator>(std::move(c))).second) {
      throw std::logic_error("comm actor: two groups of axis '" + axis + "' on one rank");
    }
  }
  return system.spawn(comm_behavior, std::move(groups));
}

}  // namespace atl

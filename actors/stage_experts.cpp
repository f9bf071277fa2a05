// The experts op of an expert-parallel plan, as the stage runs it (MODELS.md §5.5, all_to_all
// flow; the step program fixes the collectives, graph/plan/step_program.hpp). Every rank of an ep
// group is a source (its tokens' dispatched rows) and an owner (of E / ep experts):
//   forward: all-gather the rows per expert of every source; all_to_all_v the rows and their
//     routing weights to the owners; the owner's compute actor runs its experts on every source's
//     rows (source order); all_to_all_v the outputs back, in the source's dispatch order.
//   backward: all_to_all_v the output gradients to the owners; the owner's backward, one weight
//     gradient per source (the expert-group unit sums them in the reference's order); the row and
//     routing-weight gradients back.
// Padding tokens are never dispatched, so they never travel; an owner that receives no row still
// takes part in every collective (zero counts) and hands in zero gradients.
#include "actors/stage_state.hpp"

namespace atl::stage {

namespace {

Tensor i64_tensor(const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data<std::int64_t>());
  return t;
}

// Posts one collective of the rank's stream, then `next` (in the stage's thread).
void post(stage_pointer self, const CollectiveNode& node, CollectiveKind kind, Tensor send, Tensor recv,
          std::vector<std::int64_t> send_counts, std::vector<std::int64_t> recv_counts, std::function<void()> next) {
  self->request(self->state.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{node.seq, node.axis, kind, std::move(send), std::move(recv), node.tag,
                                  std::move(send_counts), std::move(recv_counts)})
      .then(
          [=](done_atom) {
            if (self->state.active) next();
          },
          [=](caf::error& e) { fail(self, e); });
}

// Runs `work` on the rank's compute actor as one task named `name`, then `next`.
void compute(stage_pointer self, std::string name, std::function<void()> work, std::function<void()> next) {
  ComputeJob job;
  job.tasks.push_back({std::move(name), std::move(work)});
  self->request(self->state.setup.compute, caf::infinite, run_atom::value, std::move(job))
      .then(
          [=](done_atom) {
            if (self->state.active) next();
          },
          [=](caf::error& e) { fail(self, e); });
}

// `f` in the stage; an exception fails the step instead of killing the actor.
template <class F>
bool guarded(stage_pointer self, F f) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    fail(self, caf::make_error(caf::sec::runtime_error, "rank " + std::to_string(self->state.setup.rank) + ": " + e.what()));
    return false;
  }
}

int ep_index(const StageState& st) { return st.setup.plan->mesh.ep_group(st.setup.rank).index_of(st.setup.rank); }

void next_instruction(stage_pointer self) {
  ++self->state.pc;
  advance(self);
}

}  // namespace

void expert_forward(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch, ep = st.setup.plan->mesh.ep();
  const std::vector<CollectiveNode> nodes = scheduled(st, ins);
  auto run = st.runs.at(mb);
  auto rows = std::make_shared<ExpertRowsOut>();
  if (!guarded(self, [&] { *rows = run->expert_rows(op); })) return;
  const auto experts = static_cast<std::int64_t>(rows->expert_rows.size());
  const Tensor all_counts = Tensor::empty({ep * experts}, DType::i64);
  post(self, nodes.at(0), CollectiveKind::all_gather, i64_tensor(rows->expert_rows), all_counts, {}, {}, [=] {
    auto& s = self->state;
    ExchangeRecord record;
    if (!guarded(self, [&] { record.rows = plan_expert_exchange(all_counts, ep, ep_index(s)); })) return;
    record.hidden = rows->x_rows.size(1);
    const ExpertExchange x = record.rows;
    const std::int64_t H = record.hidden;
    s.exchanges[{mb, op}] = record;
    const Tensor x_in = Tensor::empty({x.received(), H}), w_in = Tensor::empty({x.received()});
    auto arrived = std::make_shared<int>(0);
    auto both_arrived = [=] {
      if (++*arrived < 2) return;
      // The owner's experts on every source's rows, then the outputs back to their sources.
      with_params(self, self->state.program->op_units[static_cast<std::size_t>(op)],
                  [=](std::shared_ptr<TensorMap> weights) {
                    auto out = std::make_shared<Tensor>();
                    const std::string name = "expert group " + self->state.program->ops[static_cast<std::size_t>(op)].name;
                    compute(
                        self, name,
                        [=] {
                          std::vector<ExpertSourceRows> sources;
                          std::int64_t at = 0;
                          for (std::size_t j = 0; j < x.recv_rows.size(); ++j) {
                            const std::int64_t n = x.recv_rows[j];
                            sources.push_back({x_in.slice_rows(at, at + n), w_in.slice_rows(at, at + n),
                                               x.source_offsets[j]});
                            at += n;
                          }
                          *out = run->expert_group_forward(op, *weights, std::move(sources));
                        },
                        [=] {
                          const Tensor back = Tensor::empty({x.sent(), H});
                          post(self, nodes.at(3), CollectiveKind::all_to_all_v, *out, back,
                               element_counts(x.recv_rows, H), element_counts(x.send_rows, H), [=] {
                                 if (guarded(self, [&] { run->set_expert_output(op, back); })) next_instruction(self);
                               });
                        });
                  });
    };
    post(self, nodes.at(1), CollectiveKind::all_to_all_v, rows->x_rows, x_in, element_counts(x.send_rows, H),
         element_counts(x.recv_rows, H), both_arrived);
    post(self, nodes.at(2), CollectiveKind::all_to_all_v, rows->w_rows, w_in, x.send_rows, x.recv_rows,
         both_arrived);
  });
}

void expert_backward(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch;
  const std::vector<CollectiveNode> nodes = scheduled(st, ins);
  auto run = st.runs.at(mb);
  const auto found = st.exchanges.find({mb, op});
  if (found == st.exchanges.end()) {
    return fail(self, caf::make_error(caf::sec::runtime_error, "stage: backward exchange of op " + std::to_string(op) +
                                                                   " micro-batch " + std::to_string(mb) +
                                                                   " without its forward"));
  }
  const ExpertExchange x = found->second.rows;
  const std::int64_t H = found->second.hidden;
  st.exchanges.erase(found);
  Tensor d_out;
  if (!guarded(self, [&] { d_out = run->expert_output_grad(op); })) return;
  const Tensor d_in = Tensor::empty({x.received(), H});
  post(self, nodes.at(0), CollectiveKind::all_to_all_v, d_out, d_in, element_counts(x.send_rows, H),
       element_counts(x.recv_rows, H), [=] {
         const auto& units = self->state.program->op_units[static_cast<std::size_t>(op)];
         with_params(self, units, [=](std::shared_ptr<TensorMap> weights) {
           auto& s = self->state;
           // One zero gradient per source for the op's unit (the expert group), handed in by the
           // program's grads instruction.
           std::vector<TensorMap> grads(x.recv_rows.size());
           for (std::size_t u : units) {
             auto& mine = s.unit_grads[u];
             if (!mine.empty()) {
               return fail(self, caf::make_error(caf::sec::runtime_error,
                                                 "stage: expert group " + s.setup.plan->units[u].name +
                                                     " has an earlier gradient not handed in"));
             }
             for (TensorMap& g : grads) {
               auto map = std::make_shared<TensorMap>();
               for (const auto& p : s.setup.plan->units[u].params) {
                 map->insert(p.name, Tensor::zeros(weights->at(p.name).shape()));
                 g.insert(p.name, map->at(p.name));
               }
               mine.push_back(map);
             }
           }
           auto result = std::make_shared<ExpertRowGrads>();
           const std::string name = "expert group " + s.program->ops[static_cast<std::size_t>(op)].name;
           compute(
               self, name, [=] { *result = run->expert_group_backward(op, *weights, d_in, grads); },
               [=] {
                 const Tensor dx = Tensor::empty({x.sent(), H}), dw = Tensor::empty({x.sent()});
                 auto arrived = std::make_shared<int>(0);
                 auto both_arrived = [=] {
                   if (++*arrived < 2) return;
                   if (guarded(self, [&] { run->set_expert_input_grads(op, {dx, dw}); })) next_instruction(self);
                 };
                 post(self, nodes.at(1), CollectiveKind::all_to_all_v, result->d_x_rows, dx,
                      element_counts(x.recv_rows, H), element_counts(x.send_rows, H), both_arrived);
                 post(self, nodes.at(2), CollectiveKind::all_to_all_v, result->d_w_rows, dw, x.recv_rows,
                      x.send_rows, both_arrived);
               });
         });
       });
}

}  // namespace atl::stage

// The experts op of an expert-parallel plan, as the stage runs it (MODELS.md §5.5; the step
// program fixes the collectives of each flow, graph/plan/step_program.hpp expert_exchange_parts).
// Every rank of an ep group is a source (its tokens' dispatched rows) and an owner (of E / ep
// experts); the owner's compute actor runs its experts on every source's rows, in source order,
// and backward gives one weight gradient per source (the expert-group unit sums them in the
// reference's order of micro-batches).
//   all_to_all: counts first, the rows (and routing weights) go to their owners, the outputs come
//     back in the source's dispatch order; backward the same way round.
//   all_gather: every owner gathers every source's tokens, weights, indices and mask, dispatches
//     them itself and keeps its experts' rows; each (token, slot) pair's output is written at its
//     place in a zero buffer of every source's pairs, and an all-reduce over the ep group gives
//     each source its pairs (one owner's value plus exact zeros: the same bits as all_to_all).
//     Backward: all-gather the pairs' output gradients; reduce-scatter the pairs' input gradients.
// Padding tokens are never dispatched; an owner that receives no row still takes part in every
// collective and hands in zero gradients.
#include <optional>

#include "actors/stage_state.hpp"
#include "kernels/ops/elementwise.hpp"

namespace atl::stage {

namespace {

Tensor i64_tensor(const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data<std::int64_t>());
  return t;
}

// A span on the expert group's own trace track ("expert group <op>"), from `start` to now.
void span(stage_pointer self, const std::string& track, const std::string& name, double start) {
  const auto& tracer = self->state.setup.tracer;
  tracer->add({self->state.setup.rank, track, name, "experts", start, tracer->now_us()});
}

// Posts one collective of the rank's stream (the kind the program gives it), then `next` (in the
// stage's thread). Its span, named by the tag's part ("<op>:dispatch" -> "dispatch"), runs from the
// post to the completion.
void post(stage_pointer self, const CollectiveNode& node, Tensor send, Tensor recv,
          std::vector<std::int64_t> send_counts, std::vector<std::int64_t> recv_counts, std::function<void()> next) {
  const double start = self->state.setup.tracer->now_us();
  const auto colon = node.tag.rfind(':');
  const std::string track = "expert group " + node.tag.substr(0, colon), name = node.tag.substr(colon + 1);
  self->request(self->state.setup.comm, caf::infinite, collect_atom::value,
                CollectiveRequest{node.seq, node.axis, collective_kind(node.op), std::move(send), std::move(recv), node.tag,
                                  std::move(send_counts), std::move(recv_counts)})
      .then(
          [=](done_atom) {
            span(self, track, name, start);
            if (self->state.active) next();
          },
          [=](caf::error& e) { fail(self, e); });
}

// Runs `work` on the rank's compute actor as one task named `track` (the expert group), then
// `next`; its span on the group's track is the expert compute.
void compute(stage_pointer self, std::string track, std::function<void()> work, std::function<void()> next) {
  const double start = self->state.setup.tracer->now_us();
  ComputeJob job;
  job.tasks.push_back({track, std::move(work)});
  self->request(self->state.setup.compute, caf::infinite, run_atom::value, std::move(job))
      .then(
          [=](done_atom) {
            span(self, track, "expert compute", start);
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

// The instruction's micro-batch run and its collectives (as many as its flow's parts), or false
// after failing the step.
bool exchange_inputs(stage_pointer self, const StepInstruction& ins,
                     std::shared_ptr<MicroBatchRun>& run, std::vector<CollectiveNode>& nodes) {
  auto& st = self->state;
  const auto found = st.runs.find(ins.micro_batch);
  nodes = scheduled(st, ins);  // the flow's parts: compile_step_program made them so
  if (found == st.runs.end()) {
    fail(self, caf::make_error(caf::sec::runtime_error, "stage: exchange of op " + std::to_string(ins.op) +
                                                            " micro-batch " + std::to_string(ins.micro_batch) +
                                                            " that is not running"));
    return false;
  }
  run = found->second;
  return true;
}

// Takes the forward's record of (micro-batch, op), or fails the step.
std::optional<ExchangeRecord> take_record(stage_pointer self, int mb, int op) {
  auto& st = self->state;
  const auto found = st.exchanges.find({mb, op});
  if (found == st.exchanges.end()) {
    fail(self, caf::make_error(caf::sec::runtime_error, "stage: backward exchange of op " + std::to_string(op) +
                                                            " micro-batch " + std::to_string(mb) +
                                                            " without its forward"));
    return std::nullopt;
  }
  ExchangeRecord record = std::move(found->second);
  st.exchanges.erase(found);
  return record;
}

// Per source, one zero gradient map for the op's unit (the expert group), kept in the stage's
// unit_grads for the program's grads instruction; the maps share the tensors. False on failure.
bool per_source_grads(stage_pointer self, int op, const TensorMap& weights, std::size_t sources,
                      std::vector<TensorMap>& out) {
  auto& s = self->state;
  out.assign(sources, TensorMap());
  for (std::size_t u : s.setup.program->op_units[static_cast<std::size_t>(op)]) {
    auto& mine = s.unit_grads[u];
    if (!mine.empty()) {
      fail(self, caf::make_error(caf::sec::runtime_error, "stage: expert group " + s.setup.plan->units[u].name +
                                                              " has an earlier gradient not handed in"));
      return false;
    }
    for (TensorMap& g : out) {
      auto map = std::make_shared<TensorMap>();
      for (const auto& p : s.setup.plan->units[u].params) {
        map->insert(p.name, Tensor::zeros(weights.at(p.name).shape()));
        g.insert(p.name, map->at(p.name));
      }
      mine.push_back(map);
    }
  }
  return true;
}

std::string group_task(const StageState& st, int op) {
  return "expert group " + st.setup.program->ops[static_cast<std::size_t>(op)].name;
}

void all_to_all_forward(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch, ep = st.setup.plan->mesh.ep();
  std::shared_ptr<MicroBatchRun> run;
  std::vector<CollectiveNode> nodes;
  if (!exchange_inputs(self, ins, run, nodes)) return;
  auto rows = std::make_shared<ExpertRowsOut>();
  if (!guarded(self, [&] { *rows = run->expert_rows(op); })) return;
  // In precision bf16 the rows and the expert outputs are bf16 values (MODELS.md §10.1.12: the
  // MLP input and every bulk linear output are rounded): they travel as bf16, exactly, in half the
  // bytes. Gradients are fp32 and travel as such.
  const DType wire = st.setup.plan->precision == Precision::bf16 ? DType::bf16 : DType::f32;
  const Tensor x_send = wire == DType::f32 ? rows->x_rows : rows->x_rows.to(wire);
  const auto experts = static_cast<std::int64_t>(rows->expert_rows.size());
  const Tensor all_counts = Tensor::empty({ep * experts}, DType::i64);
  post(self, nodes.at(0), i64_tensor(rows->expert_rows), all_counts, {}, {}, [=] {
    auto& s = self->state;
    ExchangeRecord record;
    if (!guarded(self, [&] { record.exchange = plan_expert_exchange(all_counts, ep, ep_index(s)); })) return;
    record.hidden = rows->x_rows.size(1);
    const ExpertExchange x = record.exchange;
    const std::int64_t H = record.hidden;
    s.exchanges[{mb, op}] = record;
    const Tensor x_in = Tensor::empty({x.received(), H}, wire), w_in = Tensor::empty({x.received()});
    auto arrived = std::make_shared<int>(0);
    auto both_arrived = [=] {
      if (++*arrived < 2) return;
      // The owner's experts on every source's rows, then the outputs back to their sources.
      with_params(self, self->state.setup.program->op_units[static_cast<std::size_t>(op)],
                  [=](std::shared_ptr<TensorMap> weights) {
                    auto out = std::make_shared<Tensor>();
                    compute(
                        self, group_task(self->state, op),
                        [=] {
                          const Tensor x_rows = wire == DType::f32 ? x_in : x_in.to(DType::f32);
                          std::vector<ExpertSourceRows> sources;
                          std::int64_t at = 0;
                          for (std::size_t j = 0; j < x.recv_rows.size(); ++j) {
                            const std::int64_t n = x.recv_rows[j];
                            sources.push_back({x_rows.slice_rows(at, at + n), w_in.slice_rows(at, at + n),
                                               x.source_offsets[j]});
                            at += n;
                          }
                          *out = run->expert_group_forward(op, *weights, std::move(sources));
                          if (wire != DType::f32) *out = out->to(wire);
                        },
                        [=] {
                          const Tensor back = Tensor::empty({x.sent(), H}, wire);
                          post(self, nodes.at(3), *out, back,
                               element_counts(x.recv_rows, H), element_counts(x.send_rows, H), [=] {
                                 if (guarded(self, [&] {
                                       run->set_expert_output(op, wire == DType::f32 ? back : back.to(DType::f32));
                                     })) {
                                   next_instruction(self);
                                 }
                               });
                        });
                  });
    };
    post(self, nodes.at(1), x_send, x_in, element_counts(x.send_rows, H),
         element_counts(x.recv_rows, H), both_arrived);
    post(self, nodes.at(2), rows->w_rows, w_in, x.send_rows, x.recv_rows,
         both_arrived);
  });
}

void all_to_all_backward(stage_pointer self, const StepInstruction& ins) {
  const int op = ins.op, mb = ins.micro_batch;
  std::shared_ptr<MicroBatchRun> run;
  std::vector<CollectiveNode> nodes;
  if (!exchange_inputs(self, ins, run, nodes)) return;
  std::optional<ExchangeRecord> record = take_record(self, mb, op);
  if (!record) return;
  const ExpertExchange x = record->exchange;
  const std::int64_t H = record->hidden;
  Tensor d_out;
  if (!guarded(self, [&] { d_out = run->expert_output_grad(op); })) return;
  const Tensor d_in = Tensor::empty({x.received(), H});
  post(self, nodes.at(0), d_out, d_in, element_counts(x.send_rows, H),
       element_counts(x.recv_rows, H), [=] {
         const auto& units = self->state.setup.program->op_units[static_cast<std::size_t>(op)];
         with_params(self, units, [=](std::shared_ptr<TensorMap> weights) {
           std::vector<TensorMap> grads;
           if (!per_source_grads(self, op, *weights, x.recv_rows.size(), grads)) return;
           auto result = std::make_shared<ExpertRowGrads>();
           compute(
               self, group_task(self->state, op), [=] { *result = run->expert_group_backward(op, *weights, d_in, grads); },
               [=] {
                 const Tensor dx = Tensor::empty({x.sent(), H}), dw = Tensor::empty({x.sent()});
                 auto arrived = std::make_shared<int>(0);
                 auto both_arrived = [=] {
                   if (++*arrived < 2) return;
                   if (guarded(self, [&] { run->set_expert_input_grads(op, {dx, dw}); })) next_instruction(self);
                 };
                 post(self, nodes.at(1), result->d_x_rows, dx,
                      element_counts(x.recv_rows, H), element_counts(x.send_rows, H), both_arrived);
                 post(self, nodes.at(2), result->d_w_rows, dw, x.recv_rows,
                      x.send_rows, both_arrived);
               });
         });
       });
}

void all_gather_forward(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch, ep = st.setup.plan->mesh.ep(), me = ep_index(st);
  std::shared_ptr<MicroBatchRun> run;
  std::vector<CollectiveNode> nodes;
  if (!exchange_inputs(self, ins, run, nodes)) return;
  ExpertRowsOut rows;
  if (!guarded(self, [&] { rows = run->expert_rows(op); })) return;
  const std::int64_t T = rows.tokens.size(0), H = rows.tokens.size(1), K = rows.indices.size(1);
  const auto E = static_cast<std::int64_t>(rows.expert_rows.size());
  if (E % ep != 0) {
    return fail(self, caf::make_error(caf::sec::runtime_error, "stage: " + std::to_string(E) +
                                                                   " experts do not split over ep " + std::to_string(ep)));
  }
  auto record = std::make_shared<ExchangeRecord>();
  record->hidden = H;
  record->own = ExpertDispatch{rows.indices, rows.weights, rows.row_pair, Tensor(), Tensor()};
  const Tensor tokens = Tensor::empty({ep * T, H}), weights = Tensor::empty({ep * T, K});
  const Tensor indices = Tensor::empty({ep * T, K}, DType::i32), mask = Tensor::empty({ep * T}, DType::boolean);
  auto arrived = std::make_shared<int>(0);
  auto all_arrived = [=] {
    if (++*arrived < 4) return;
    with_params(self, self->state.setup.program->op_units[static_cast<std::size_t>(op)],
                [=](std::shared_ptr<TensorMap> w) {
                  const Tensor slots = Tensor::zeros({ep * T * K, H});
                  compute(
                      self, group_task(self->state, op),
                      [=] {
                        // Every source's tokens, dispatched here; this rank's experts' rows kept.
                        const std::int64_t n = E / ep;
                        std::vector<ExpertSourceRows> sources;
                        for (int j = 0; j < ep; ++j) {
                          const ExpertDispatch d =
                              plan_expert_dispatch(indices.slice_rows(j * T, (j + 1) * T),
                                                   weights.slice_rows(j * T, (j + 1) * T),
                                                   mask.slice_rows(j * T, (j + 1) * T), E);
                          const DispatchedRows all = dispatch_forward(tokens.slice_rows(j * T, (j + 1) * T), d);
                          const auto offsets = d.expert_offsets.span<std::int64_t>();
                          const std::int64_t first = offsets[me * n], last = offsets[(me + 1) * n];
                          std::vector<std::int64_t> local;
                          for (std::int64_t e = me * n; e <= (me + 1) * n; ++e) local.push_back(offsets[e] - first);
                          sources.push_back({all.x_rows.slice_rows(first, last), all.w_rows.slice_rows(first, last),
                                             std::move(local)});
                          record->sources.push_back(d);
                          record->first.push_back(first);
                          record->count.push_back(last - first);
                        }
                        const Tensor out = run->expert_group_forward(op, *w, std::move(sources));
                        std::int64_t at = 0;
                        for (int j = 0; j < ep; ++j) {
                          const std::int64_t c = record->count[static_cast<std::size_t>(j)];
                          scatter_rows_to_slots(out.slice_rows(at, at + c), record->sources[static_cast<std::size_t>(j)],
                                                record->first[static_cast<std::size_t>(j)],
                                                slots.slice_rows(j * T * K, (j + 1) * T * K));
                          at += c;
                        }
                      },
                      [=] {
                        self->state.exchanges[{mb, op}] = *record;
                        post(self, nodes.at(4), Tensor(), slots, {}, {}, [=] {
                          const Tensor mine = slots.slice_rows(me * T * K, (me + 1) * T * K);
                          if (guarded(self, [&] {
                                run->set_expert_output(op, gather_rows_from_slots(mine, record->own, 0,
                                                                                  record->own.rows()));
                              })) {
                            next_instruction(self);
                          }
                        });
                      });
                });
  };
  post(self, nodes.at(0), rows.tokens, tokens, {}, {}, all_arrived);
  post(self, nodes.at(1), rows.weights, weights, {}, {}, all_arrived);
  post(self, nodes.at(2), rows.indices, indices, {}, {}, all_arrived);
  post(self, nodes.at(3), rows.token_mask, mask, {}, {}, all_arrived);
}

void all_gather_backward(stage_pointer self, const StepInstruction& ins) {
  auto& st = self->state;
  const int op = ins.op, mb = ins.micro_batch, ep = st.setup.plan->mesh.ep();
  std::shared_ptr<MicroBatchRun> run;
  std::vector<CollectiveNode> nodes;
  if (!exchange_inputs(self, ins, run, nodes)) return;
  std::optional<ExchangeRecord> taken = take_record(self, mb, op);
  if (!taken) return;
  auto record = std::make_shared<ExchangeRecord>(std::move(*taken));
  const std::int64_t H = record->hidden, TK = record->own.indices.numel();
  Tensor d_out;
  if (!guarded(self, [&] { d_out = run->expert_output_grad(op); })) return;
  const Tensor mine = Tensor::zeros({TK, H}), every = Tensor::empty({ep * TK, H});
  if (!guarded(self, [&] { scatter_rows_to_slots(d_out, record->own, 0, mine); })) return;
  post(self, nodes.at(0), mine, every, {}, {}, [=] {
    with_params(self, self->state.setup.program->op_units[static_cast<std::size_t>(op)],
                [=](std::shared_ptr<TensorMap> w) {
                  std::vector<TensorMap> grads;
                  if (!per_source_grads(self, op, *w, static_cast<std::size_t>(ep), grads)) return;
                  const Tensor dx = Tensor::zeros({ep * TK, H}), dw = Tensor::zeros({ep * TK});
                  compute(
                      self, group_task(self->state, op),
                      [=] {
                        std::vector<Tensor> d_rows;
                        for (int j = 0; j < ep; ++j) {
                          const auto sj = static_cast<std::size_t>(j);
                          d_rows.push_back(gather_rows_from_slots(every.slice_rows(j * TK, (j + 1) * TK),
                                                                  record->sources[sj], record->first[sj],
                                                                  record->count[sj]));
                        }
                        const ExpertRowGrads g = run->expert_group_backward(op, *w, concat_rows(d_rows), grads);
                        std::int64_t at = 0;
                        for (int j = 0; j < ep; ++j) {
                          const auto sj = static_cast<std::size_t>(j);
                          const std::int64_t c = record->count[sj];
                          scatter_rows_to_slots(g.d_x_rows.slice_rows(at, at + c), record->sources[sj],
                                                record->first[sj], dx.slice_rows(j * TK, (j + 1) * TK));
                          scatter_rows_to_slots(g.d_w_rows.slice_rows(at, at + c), record->sources[sj],
                                                record->first[sj], dw.slice_rows(j * TK, (j + 1) * TK));
                          at += c;
                        }
                      },
                      [=] {
                        const Tensor dx_mine = Tensor::empty({TK, H}), dw_mine = Tensor::empty({TK});
                        auto arrived = std::make_shared<int>(0);
                        auto both_arrived = [=] {
                          if (++*arrived < 2) return;
                          const std::int64_t P = record->own.rows();
                          if (guarded(self, [&] {
                                run->set_expert_input_grads(op, {gather_rows_from_slots(dx_mine, record->own, 0, P),
                                                                 gather_rows_from_slots(dw_mine, record->own, 0, P)});
                              })) {
                            next_instruction(self);
                          }
                        };
                        post(self, nodes.at(1), dx, dx_mine, {}, {}, both_arrived);
                        post(self, nodes.at(2), dw, dw_mine, {}, {}, both_arrived);
                      });
                });
  });
}

}  // namespace

void expert_forward(stage_pointer self, const StepInstruction& ins) {
  if (self->state.setup.program->expert_flow == ExpertDispatchFlow::all_gather) return all_gather_forward(self, ins);
  all_to_all_forward(self, ins);
}

void expert_backward(stage_pointer self, const StepInstruction& ins) {
  if (self->state.setup.program->expert_flow == ExpertDispatchFlow::all_gather) return all_gather_backward(self, ins);
  all_to_all_backward(self, ins);
}

}  // namespace atl::stage

// One sim job run as two "processes": two engines in this test binary, each owning half the
// ranks and reading only its ranks' rows from its own data source, sharing nothing but the sim
// backend. They must produce the single-engine result bit for
// bit: the proof that nothing crosses a process boundary except through a Communicator (loss and
// gradient norm included: they travel in the step program's report collective).
#include <catch2/catch.hpp>

#include <csignal>
#include <thread>

#include "actors/actor_engine.hpp"
#include "comm/sim/sim_backend.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

std::unique_ptr<ActorEngine> engine_for(const RunConfig& config, ProcessOptions process) {
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  // No initial weights: each engine generates only its ranks' shards of the fresh model (the
  // single engine below is given the full initialized model; the values must agree).
  return std::make_unique<ActorEngine>(
      EngineInputs{.config = config, .model = model, .initial_master = {}, .optimizer = optimizer_settings(config.train)},
      std::move(process));
}

}  // namespace

TEST_CASE("Two engines on one sim backend, each with half the ranks, match one engine bitwise", "[actors][process]") {
  struct Case {
    const char* family;
    const char* preset;
    Layout layout;
  };
  const Case cases[] = {{"beam", "beam-tiny-moe", {2, 2}},  // HSDP split by replica
                        {"beam", "beam-tiny-moe", {4, 1}},  // every shard group spans both processes
                        {"inkling2", "inkling2-tiny", {2, 2}},
                        {"beam", "beam-tiny-moe", {2, 2, 2}},  // ep groups inside, ep_shard groups across
                        {"flint", "flint-tiny", {4, 1, 4}}};   // every ep exchange spans both processes
  constexpr int kSteps = 3;
  for (const Case& c : cases) {
    INFO(c.family << " dp_shard " << c.layout.dp_shard << " dp_replicate " << c.layout.dp_replicate << " ep "
                  << c.layout.ep);
    const RunConfig config = parity_config(c.family, c.preset, Precision::bf16, c.layout, 8, 1);
    std::unique_ptr<TrainingEngine> single_engine;
    const RunOutput single = run_engine(config, make_actor_engine, kSteps, true, &single_engine);

    auto backend = std::make_shared<SimBackend>(4);
    auto first = engine_for(config, {{0, 1}, backend});
    auto second = engine_for(config, {{2, 3}, backend});
    DataConfig data;
    data.synthetic_min_doc = 5;
    data.synthetic_max_doc = 40;
    const auto model = make_model(config.model, config.source_file);
    // run_engine's batches; each process reads its rows from a source of its own.
    auto first_source = make_data_source(data, model->unpadded_vocab_size(), 99);
    auto second_source = make_data_source(data, model->unpadded_vocab_size(), 99);
    const std::int64_t rows = config.train.global_batch, seq = config.train.seq_len;
    CHECK(first->rows_read(rows) == std::vector<RowRange>{{0, 4}});  // ranks 0, 1: data-parallel indices 0, 1
    CHECK(second->rows_read(rows) == std::vector<RowRange>{{4, 8}});
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1);
      const Batch mine = read_rows(*first_source, rows, seq, first->rows_read(rows));
      const Batch theirs = read_rows(*second_source, rows, seq, second->rows_read(rows));
      CHECK(mine.rows() == 4);
      CHECK(first_source->cursor() == second_source->cursor());
      const auto [a, b] = step_both(*first, mine, *second, theirs, s == 0);
      for (const StepResult* r : {&a, &b}) {
        CHECK(r->loss == single.steps[static_cast<std::size_t>(s)].loss);
        CHECK(r->grad_norm == single.steps[static_cast<std::size_t>(s)].grad_norm);
        CHECK(r->targets == single.steps[static_cast<std::size_t>(s)].targets);  // the count collective's totals
        CHECK(r->tokens == single.steps[static_cast<std::size_t>(s)].tokens);
      }
      if (s == 0) {
        // Routing stays with its ranks: together the two processes report the single engine's.
        auto both = a.routing;
        both.insert(both.end(), b.routing.begin(), b.routing.end());
        CHECK(same_routing(both, single.steps[0].routing));
      }
    }
    // The state gathers through collectives: both processes assemble the whole model, even when
    // every shard group spans both of them.
    const auto [a, b] = state_of_both(*first, *second);
    CHECK(bitwise_equal(a.master, single.master));
    CHECK(bitwise_equal(b.master, single.master));
    const TrainingState reference = single_engine->state();
    CHECK(bitwise_equal(a.exp_avg, reference.exp_avg));
    CHECK(bitwise_equal(a.exp_avg_sq, reference.exp_avg_sq));
    // The two processes' ranks post the same collectives.
    const auto records = backend->recorder()->records();
    std::size_t first_records = 0;
    for (const CollectiveRecord& r : records) first_records += r.rank < 2;
    CHECK(first_records * 2 == records.size());
  }
}

TEST_CASE("Two engines: a stop asked of one process reaches both in the step's count, the largest signal winning",
          "[actors][process]") {
  const RunConfig config = parity_config("beam", "beam-tiny-moe", Precision::fp32, {2, 2}, 8, 1);
  auto backend = std::make_shared<SimBackend>(4);
  auto first = engine_for(config, {{0, 1}, backend});
  auto second = engine_for(config, {{2, 3}, backend});
  REQUIRE(first->agrees_on_stop());
  const auto model = make_model(config.model, config.source_file);
  auto first_source = make_data_source(DataConfig{}, model->unpadded_vocab_size(), 99);
  auto second_source = make_data_source(DataConfig{}, model->unpadded_vocab_size(), 99);
  const std::int64_t rows = config.train.global_batch, seq = config.train.seq_len;
  auto step = [&] {
    const Batch mine = read_rows(*first_source, rows, seq, first->rows_read(rows));
    const Batch theirs = read_rows(*second_source, rows, seq, second->rows_read(rows));
    return step_both(*first, mine, *second, theirs);
  };
  const auto [a0, b0] = step();
  CHECK(a0.stop_signal == 0);
  CHECK(b0.stop_signal == 0);
  first->request_stop(SIGINT);  // one process only: the other learns it from the count
  const auto [a1, b1] = step();
  CHECK(a1.stop_signal == SIGINT);
  CHECK(b1.stop_signal == SIGINT);
  // Both, different signals: each ends by the larger, whichever process got it.
  for (const auto& [mine, theirs] : {std::pair{SIGTERM, SIGINT}, std::pair{SIGINT, SIGTERM}}) {
    first->request_stop(mine);
    second->request_stop(theirs);
    const auto [a, b] = step();
    CHECK(a.stop_signal == SIGTERM);
    CHECK(b.stop_signal == SIGTERM);
  }
}

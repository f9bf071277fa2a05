// The actor runtime over the ucx backend (issue 11, first part): two "processes" in this test,
// each with its own UcxWorld (UCX context, workers for its two ranks) connected to the other's
// workers over loopback, each running an engine of its ranks. The result equals the sim backend's
// bit for bit: losses, gradient norms and the final weights, for HSDP and expert parallelism.
#include <catch2/catch.hpp>

#include <thread>

#include "actors/actor_engine.hpp"
#include "comm/ucx/ucx_backend.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

TEST_CASE("Two engines over UCX, each with its own UCX context and two ranks, match the sim run bitwise",
          "[actors][ucx]") {
  struct Case {
    const char* family;
    const char* preset;
    Layout layout;
  };
  // HSDP; EP inside each process (beam) and with shared experts (flint): the exchanges stress
  // early completions (an all_to_all_v whose transfers finish at once).
  const Case cases[] = {{"beam", "beam-tiny-moe", {2, 2}}, {"beam", "beam-tiny-moe", {4, 1, 2}}, {"flint", "flint-tiny", {4, 1, 2}}};
  constexpr int kSteps = 3;
  for (const Case& c : cases) {
    INFO(c.family << " dp_shard " << c.layout.dp_shard << " dp_replicate " << c.layout.dp_replicate << " ep "
                  << c.layout.ep);
    const RunConfig config = parity_config(c.family, c.preset, Precision::bf16, c.layout, 8, 1);
    const RunOutput sim = run_engine(config, make_actor_engine, kSteps, false);

    // The rendezvous, by hand: each process's worker addresses to both.
    auto first_world = std::make_shared<UcxWorld>(4, std::vector<int>{0, 1});
    auto second_world = std::make_shared<UcxWorld>(4, std::vector<int>{2, 3});
    std::map<int, WorkerAddress> addresses = first_world->local_addresses();
    addresses.merge(second_world->local_addresses());
    first_world->connect(addresses);
    second_world->connect(addresses);

    std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
    auto engine = [&](std::vector<int> ranks, std::shared_ptr<UcxWorld> world) {
      return std::make_unique<ActorEngine>(EngineInputs{.config = config, .model = model, .initial_master = {},
                                                        .optimizer = optimizer_settings(config.train)},
                                           ProcessOptions{std::move(ranks), std::make_shared<UcxBackend>(world)});
    };
    auto first = engine({0, 1}, first_world);
    auto second = engine({2, 3}, second_world);
    DataConfig data;
    data.synthetic_min_doc = 5;
    data.synthetic_max_doc = 40;
    auto first_source = make_data_source(data, model->unpadded_vocab_size(), 99);
    auto second_source = make_data_source(data, model->unpadded_vocab_size(), 99);
    const std::int64_t rows = config.train.global_batch, seq = config.train.seq_len;
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1);
      const Batch mine = read_rows(*first_source, rows, seq, first->rows_read(rows));
      const Batch theirs = read_rows(*second_source, rows, seq, second->rows_read(rows));
      const auto [a, b] = step_both(*first, mine, *second, theirs);
      for (const StepResult* r : {&a, &b}) {
        CHECK(r->loss == sim.steps[static_cast<std::size_t>(s)].loss);
        CHECK(r->grad_norm == sim.steps[static_cast<std::size_t>(s)].grad_norm);
      }
    }
    const auto [a, b] = state_of_both(*first, *second);
    CHECK(bitwise_equal(a.master, sim.master));
    CHECK(bitwise_equal(b.master, sim.master));
    // Every collective went over UCX: each world recorded its own ranks'.
    CHECK(!first_world->recorder()->records().empty());
    for (const CollectiveRecord& r : first_world->recorder()->records()) CHECK(r.rank < 2);
  }
}

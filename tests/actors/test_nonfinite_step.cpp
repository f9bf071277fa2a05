// A step whose gradient is not finite is never applied, on either engine: masters and moments keep
// their bits, the result says which quantity and where, and the next step proceeds.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "actors/actor_engine.hpp"
#include "graph/data/data_source.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

TEST_CASE("A non-finite step leaves masters and moments untouched on both engines", "[actors][nonfinite]") {
  struct Case {
    const char* what;
    EngineFactory factory;
    Layout layout;
  };
  const std::vector<Case> cases = {{"reference", make_reference_engine, {1, 1}},
                                   {"actors dp_shard 2", make_actor_engine, {2, 1}}};
  for (const Case& c : cases) {
    INFO(c.what);
    const RunConfig config = parity_config("beam", "beam-tiny-dense", Precision::fp32, c.layout, 4);
    std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
    TensorMap master = TensorMap::initialized(model->specs(), 7, model->init_std());
    const std::string poisoned = "model.layers.1.mlp.down_proj.weight";
    master.at(poisoned).data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
    auto engine = c.factory(EngineInputs{.config = config, .model = model, .initial_master = master,
                                         .optimizer = optimizer_settings(config.train)});
    const TrainingState before = engine->state();
    auto data = make_data_source(DataConfig{}, model->unpadded_vocab_size(), 3);
    const StepResult r = engine->step(data->next(4, 32));
    CHECK_FALSE(r.applied);
    CHECK(r.step == 1);
    CHECK(r.nonfinite.find("loss is NaN") != std::string::npos);
    CHECK(r.nonfinite.find("gradient norm is NaN") != std::string::npos);
    CHECK(r.nonfinite.find("model.") != std::string::npos);  // the first tensor or unit named
    const TrainingState after = engine->state();
    CHECK(after.step == 1);
    CHECK(bitwise_equal(after.master, before.master));
    CHECK(bitwise_equal(after.exp_avg, before.exp_avg));
    CHECK(bitwise_equal(after.exp_avg_sq, before.exp_avg_sq));
    // The engine is still usable: the next step runs (and is refused again for the same reason).
    const StepResult next = engine->step(data->next(4, 32));
    CHECK(next.step == 2);
    CHECK_FALSE(next.applied);
  }
}

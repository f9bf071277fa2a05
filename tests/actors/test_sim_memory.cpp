// The sim runs every rank in one process; its tensor memory must grow with the rank count, not
// with its square (every rank holding something per other rank would).
#include <catch2/catch.hpp>

#include "actors/actor_engine.hpp"
#include "graph/data/data_source.hpp"
#include "kernels/host_allocator.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

// Peak bytes of live tensor storage over building the engine and two steps, for a fixed model
// and global batch, with `ranks` simulated ranks.
double peak_tensor_bytes(int ranks) {
  const RunConfig config = parity_config("beam", "beam-tiny-dense", Precision::bf16, {ranks, 1}, 16, 1);
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  auto data = make_data_source(DataConfig{}, model->unpadded_vocab_size(), 5);
  const Batch a = data->next(16, 32), b = data->next(16, 32);
  const std::size_t before = host_live_bytes();
  host_reset_peak_live_bytes();
  {
    auto engine = make_actor_engine(EngineInputs{.config = config, .model = model,
                                                 .initial_master = TensorMap::initialized(model->specs(), 7, 0.02f),
                                                 .optimizer = optimizer_settings(config.train)});
    engine->step(a);
    engine->step(b);
  }
  return static_cast<double>(host_peak_live_bytes() - before);
}

}  // namespace

TEST_CASE("Sim memory grows about linearly with the rank count", "[actors][memory]") {
  const double at4 = peak_tensor_bytes(4), at16 = peak_tensor_bytes(16);
  INFO("peak tensor bytes: 4 ranks " << at4 << ", 16 ranks " << at16);
  CHECK(at16 > at4);               // more ranks hold more (each its own gathers and gradients)
  CHECK(at16 <= 4.0 * 1.25 * at4);  // 4x the ranks: at most ~4x the bytes (quadratic would be 16x)
}

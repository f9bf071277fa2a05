// compute.threads (issue 7, item 4): a whole model's forward and backward on a compute pool of 2
// or 3 threads gives the serial run's loss and gradients bit for bit, for every family and both
// precisions; and the kernels split work into parts offered to the pool's workers (else the
// comparison would hold trivially).
#include <catch2/catch.hpp>

#include <string>
#include <utility>

#include "graph/config.hpp"
#include "graph/models/model.hpp"
#include "graph/param.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;

TEST_CASE("A model's forward and backward are bitwise independent of compute.threads, and the pool splits them",
          "[graph][threads]") {
  for (const auto& [family, preset] : {std::pair{"beam", "beam-tiny-moe"}, std::pair{"flint", "flint-tiny"},
                                       std::pair{"inkling2", "inkling2-tiny"}}) {
    ModelSection section;
    section.family = family;
    section.preset = preset;
    const auto model = make_model(section, "test.yaml");
    const TensorMap master = TensorMap::initialized(model->specs(), 5, 0.02f);
    // 4 rows of 256 tokens: the head's GEMMs (1024 x vocab x hidden) are worth splitting.
    const Batch batch = testing::synthetic_batch(4, 256, 8);
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      INFO(preset << " " << precision_name(precision));
      const TensorMap w = compute_weights(model->specs(), master, precision);
      auto step = [&](cpu::ComputePool* pool) {
        cpu::ComputePoolScope scope(pool);
        TensorMap grads = TensorMap::zeros_like(model->specs());
        const LossSum loss = model->forward_backward(w, batch, precision, 1.0f / 1024, grads);
        return std::pair{loss.loss_sum, std::move(grads)};
      };
      const auto [serial_loss, serial_grads] = step(nullptr);
      for (int threads : {2, 3}) {
        INFO(threads << " threads");
        cpu::ComputePool pool(threads);
        const auto [loss, grads] = step(&pool);
        CHECK(loss == serial_loss);
        CHECK(checkpoint_testing::same_tensors(grads, serial_grads));
        CHECK(pool.shared_runs() > 0);
      }
    }
  }
}

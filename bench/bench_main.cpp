// atoll-bench: kernel and trainer throughput, each reported against a baseline measured in the
// same run. Timings are wall clock on this machine; compare ratios, not absolute numbers.
//   env -u OPENBLAS_CORETYPE build/bench/atoll-bench      (the README's benchmark command)
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>

#include "actors/actor_engine.hpp"
#include "graph/config.hpp"
#include "graph/data/data_source.hpp"
#include "graph/models/beam/model.hpp"
#include "graph/reference/trainer.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/ops/matmul.hpp"
#include "kernels/rng.hpp"

using namespace atl;
using clock_type = std::chrono::steady_clock;

namespace {

// Best of `repeats` timings of fn, in seconds.
double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = clock_type::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

Tensor random_tensor(Shape shape, const char* name) {
  Tensor t = Tensor::empty(std::move(shape));
  CounterRng rng(1, name);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(i)));
  return t;
}

void bench_matmul(std::int64_t rows, std::int64_t in, std::int64_t out) {
  Tensor x = random_tensor({rows, in}, "x"), w = random_tensor({out, in}, "w");
  Tensor y = Tensor::empty({rows, out});
  const double flops = 2.0 * static_cast<double>(rows * in * out);
  double atoll_s = best_seconds(5, [&] { linear_forward(x, w); });
  double blas_s = best_seconds(5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x.data<float>(), static_cast<int>(in), w.data<float>(),
                static_cast<int>(in), 0.0f, y.data<float>(), static_cast<int>(out));
  });
  std::printf("matmul [%lld x %lld] @ [%lld x %lld]^T   atoll %7.1f GFLOP/s   sgemm %7.1f GFLOP/s   ratio %.3f\n",
              static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out),
              static_cast<long long>(in), flops / atoll_s * 1e-9, flops / blas_s * 1e-9, blas_s / atoll_s);
}

RunConfig bench_config(int dp_shard, const char* preset, std::int64_t rows, std::int64_t micro, std::int64_t seq) {
  return parse_run_config("model: {family: beam, preset: " + std::string(preset) + "}\n" +
                              "topology: {mesh: {dp_shard: " + std::to_string(dp_shard) + "}}\n" +
                              "train: {steps: 10, global_batch: " + std::to_string(rows) + ", micro_batch: " +
                              std::to_string(micro) + ", seq_len: " + std::to_string(seq) + ", lr: 1.0e-3, seed: 7}\n",
                          "bench");
}

// Mean seconds per step of `steps` steps (after one warm-up step) on the engine the factory builds.
double seconds_per_step(const RunConfig& config, const EngineFactory& factory, int steps,
                        std::unique_ptr<TrainingEngine>* keep = nullptr) {
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  auto engine = factory(EngineInputs{config, model, TensorMap::initialized(model->specs(), 7, model->init_std()),
                                     optimizer_settings(config.train)});
  auto data = make_data_source(config.data, model->unpadded_vocab_size(), 7);
  engine->step(data->next(config.train.global_batch, config.train.seq_len));
  auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) engine->step(data->next(config.train.global_batch, config.train.seq_len));
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count() / steps;
  if (keep) *keep = std::move(engine);
  return seconds;
}

double trainer_tokens_per_s(Precision precision, int steps) {
  auto model = std::make_shared<const BeamModel>(beam_preset("beam-small"));  // the throughput yardstick
  DataConfig dc;
  auto data = make_data_source(dc, model->unpadded_vocab_size(), 7);
  OptimizerSettings opt;
  opt.total_steps = steps + 1;
  ReferenceTrainer trainer(model, TensorMap::initialized(model->specs(), 7, 0.02f), precision, 4, opt);
  const std::int64_t rows = 8, seq = 256;
  trainer.step(data->next(rows, seq));  // warm-up step: first-touch allocations
  std::int64_t tokens = 0;
  auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) tokens += trainer.step(data->next(rows, seq)).tokens;
  return static_cast<double>(tokens) / std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

int main() {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("atoll-bench  (OPENBLAS_CORETYPE=%s%s)\n", coretype ? coretype : "unset",
              coretype ? "; the README command unsets it for benchmarks" : "");
  bench_matmul(1024, 256, 256);
  bench_matmul(2048, 256, 1024);
  bench_matmul(2048, 1024, 256);
  // Training uses one BLAS thread (kernels/cpu/gemm.hpp: results must not depend on the core
  // count); the trainer numbers below run as training does.
  openblas_set_num_threads(1);
  const double fp32 = trainer_tokens_per_s(Precision::fp32, 3);
  const double bf16 = trainer_tokens_per_s(Precision::bf16, 3);
  std::printf("reference trainer beam-small (8x256 tokens/step, micro-batch 4): fp32 %.0f tokens/s, bf16 %.0f "
              "tokens/s, bf16/fp32 %.3f\n",
              fp32, bf16, bf16 / fp32);

  // The actor runtime's overhead: beam-small, the same global batch (8 x 256 tokens, micro-batches
  // of 2 rows), reference trainer vs the actors simulating dp_shard = 4 in this process.
  const double reference_s = seconds_per_step(bench_config(1, "beam-small", 8, 2, 256), make_reference_engine, 3);
  std::unique_ptr<TrainingEngine> sharded;
  const double actors_s = seconds_per_step(bench_config(4, "beam-small", 8, 2, 256), make_actor_engine, 3, &sharded);
  std::printf("actor runtime beam-small step: reference %.3f s, actors dp_shard=4 (sim, 4 ranks on this machine) "
              "%.3f s, overhead ratio %.3f\n",
              reference_s, actors_s, actors_s / reference_s);
  auto& actors = dynamic_cast<ActorEngine&>(*sharded);
  const std::size_t block = actors.plan().unit_index("model.layers.1");
  std::printf("unit gather round trip (model.layers.1 of beam-small, 4 ranks, sim): %.1f us\n",
              actors.gather_round_trip_us(block, 50));
  std::unique_ptr<TrainingEngine> single;
  seconds_per_step(bench_config(1, "beam-tiny-moe", 4, 2, 32), make_actor_engine, 1, &single);
  auto& one = dynamic_cast<ActorEngine&>(*single);
  std::printf("unit gather round trip (model.layers.1 of beam-tiny-moe, 1 rank, sim): %.1f us\n",
              one.gather_round_trip_us(one.plan().unit_index("model.layers.1"), 500));
  return 0;
}

// atoll-bench: kernel and trainer throughput, each reported against a baseline measured in the
// same run. Timings are wall clock on this machine; compare ratios, not absolute numbers.
//   OPENBLAS_CORETYPE=SkylakeX build/bench/atoll-bench   (AVX-512 machines: OpenBLAS's best kernel)
#include <algorithm>
#include <cblas.h>

#include <array>
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
#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/host_allocator.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/kernel_clock.hpp"
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

// fn() with bf16 operands on AMX tiles (compute.bf16_gemm: amx); 0 where the CPU has none.
double on_amx(const std::function<double()>& fn) {
  if (!cpu::amx_available()) return 0;
  cpu::use_bf16_amx(true);
  const double result = fn();
  cpu::use_bf16_amx(false);
  return result;
}

Tensor random_tensor(Shape shape, const char* name) {
  Tensor t = Tensor::empty(std::move(shape));
  CounterRng rng(1, name);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(i)));
  return t;
}

// One GEMM shape of beam-small (MODELS.md §4; 1024 tokens per micro-batch, ~256 rows per expert),
// as training calls it: C = op(A) op(B), or C += for a weight gradient summed over micro-batches.
struct GemmCase {
  const char* what;
  bool ta, tb;
  std::int64_t m, n, k;
  bool accumulate = false;
};

void bench_gemm(const GemmCase& g) {
  const Tensor a = random_tensor({g.m * g.k}, "a"), b = random_tensor({g.k * g.n}, "b");
  Tensor c = Tensor::empty({g.m * g.n});
  const std::int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  const cpu::GemmShape shape{g.ta, g.tb, g.m, g.n, g.k, lda, ldb, g.n, g.accumulate};
  const double flops = 2.0 * static_cast<double>(g.m * g.n * g.k);
  auto atoll = [&](cpu::GemmOperands operands) {
    return best_seconds(7, [&] { cpu::gemm_f32(shape, a.data<float>(), b.data<float>(), c.data<float>(), operands); });
  };
  const double fp32_s = atoll(cpu::GemmOperands::f32), bf16_s = atoll(cpu::GemmOperands::bf16);
  const double amx_s = on_amx([&] { return atoll(cpu::GemmOperands::bf16); });
  const double blas_s = best_seconds(7, [&] {
    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, static_cast<int>(g.m),
                static_cast<int>(g.n), static_cast<int>(g.k), 1.0f, a.data<float>(), static_cast<int>(lda),
                b.data<float>(), static_cast<int>(ldb), g.accumulate ? 1.0f : 0.0f, c.data<float>(),
                static_cast<int>(g.n));
  });
  std::printf("  %-22s %c%c [%4lld x %4lld x %4lld]  atoll fp32 %6.1f  sgemm %6.1f  fp32/sgemm %.2f   atoll bf16 %6.1f  "
              "bf16/fp32 %.2f",
              g.what, g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', static_cast<long long>(g.m), static_cast<long long>(g.n),
              static_cast<long long>(g.k), flops / fp32_s * 1e-9, flops / blas_s * 1e-9, blas_s / fp32_s,
              flops / bf16_s * 1e-9, fp32_s / bf16_s);
  if (amx_s > 0) std::printf("   amx %6.1f  amx/fp32 %.2f", flops / amx_s * 1e-9, fp32_s / amx_s);
  std::printf("\n");
}

RunConfig bench_config(int dp_shard, const char* preset, std::int64_t rows, std::int64_t micro, std::int64_t seq,
                       int ep = 1) {
  return parse_run_config("model: {family: beam, preset: " + std::string(preset) + "}\n" +
                              "topology: {mesh: {dp_shard: " + std::to_string(dp_shard) +
                              ", ep: " + std::to_string(ep) + "}}\n" +
                              "train: {steps: 10, global_batch: " + std::to_string(rows) + ", micro_batch: " +
                              std::to_string(micro) + ", seq_len: " + std::to_string(seq) + ", lr: 1.0e-3, seed: 7}\n",
                          "bench");
}

// Mean seconds per step of `steps` steps (after one warm-up step) on the engine the factory builds;
// `last`: the last step's result.
double seconds_per_step(const RunConfig& config, const EngineFactory& factory, int steps,
                        std::unique_ptr<TrainingEngine>* keep = nullptr, double* allocations_per_step = nullptr,
                        StepResult* last = nullptr) {
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  auto engine = factory(EngineInputs{config, model, TensorMap::initialized(model->specs(), 7, model->init_std()),
                                     optimizer_settings(config.train)});
  auto data = make_data_source(config.data, model->unpadded_vocab_size(), 7);
  engine->step(data->next(config.train.global_batch, config.train.seq_len));
  const std::uint64_t allocations_before = host_allocation_count();
  auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) {
    StepResult r = engine->step(data->next(config.train.global_batch, config.train.seq_len));
    if (last) *last = std::move(r);
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count() / steps;
  if (allocations_per_step) {
    *allocations_per_step = static_cast<double>(host_allocation_count() - allocations_before) / steps;
  }
  if (keep) *keep = std::move(engine);
  return seconds;
}

struct TrainerRun {
  double tokens_per_s = 0;
  std::array<double, kKernelKinds> kernel_seconds{};  // when profiled
  double seconds = 0;
};

// The reference trainer on beam-small; `profile` turns the kernel clock on for the timed steps.
TrainerRun trainer_run(Precision precision, int threads, int steps, bool profile = false) {
  auto model = std::make_shared<const BeamModel>(beam_preset("beam-small"));  // the throughput yardstick
  DataConfig dc;
  auto data = make_data_source(dc, model->unpadded_vocab_size(), 7);
  OptimizerSettings opt;
  opt.total_steps = steps + 1;
  ReferenceTrainer trainer(model, TensorMap::initialized(model->specs(), 7, 0.02f), precision, 4, opt, threads);
  const std::int64_t rows = 8, seq = 256;
  trainer.step(data->next(rows, seq));  // warm-up step: first-touch allocations
  std::int64_t tokens = 0;
  kernel_clock_reset();
  kernel_clock_enable(profile);
  auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) tokens += trainer.step(data->next(rows, seq)).tokens;
  TrainerRun run;
  run.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  kernel_clock_enable(false);
  run.tokens_per_s = static_cast<double>(tokens) / run.seconds;
  run.kernel_seconds = kernel_clock_seconds();
  return run;
}

void print_step_fractions(const char* what, const TrainerRun& run) {
  std::printf("  %s, one thread, fraction of a step:", what);
  double counted = 0;
  for (int k = 0; k < kKernelKinds; ++k) {
    counted += run.kernel_seconds[k];
    std::printf(" %s %.3f", kernel_kind_name(static_cast<KernelKind>(k)), run.kernel_seconds[k] / run.seconds);
  }
  std::printf(" (rest: trainer, allocation, copies) %.3f\n", 1.0 - counted / run.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // no options: it measures this machine, all of it, for minutes
    const bool help = std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h";
    std::fprintf(help ? stdout : stderr,
                 "usage: %s\n  GEMM GFLOP/s against OpenBLAS on beam-small's shapes, the reference trainer's "
                 "tokens/s in fp32 and bf16, and the actor runtime's step times; takes no options\n",
                 argv[0]);
    return help ? 0 : 2;
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  // (The kernel OpenBLAS chose, not only the variable: unset on a CPU it does not know, it falls
  // back to an SSE3 kernel several times slower, which would flatter atoll's ratio.)
  std::printf("atoll-bench  (OpenBLAS anchor kernel %s, OPENBLAS_CORETYPE=%s; atoll's own kernels ignore both)\n",
              openblas_get_corename(), coretype ? coretype : "unset");
  std::printf("cpu kernels: %s\n", cpu::kernel_description(cpu::cpu_features()).c_str());
  if (cpu::detected_cpu_features().bf16_dot) {
    std::printf("vdpbf16ps multiply-adds per second vs fp32 FMA: %.2f (below 1 the bf16 chain runs on FMAs)\n",
                cpu::bf16_dot_rate_vs_fma());
  }
  // GFLOP/s on one thread each (OpenBLAS pinned to one thread, atoll without a compute pool).
  openblas_set_num_threads(1);
  std::printf("GEMM, beam-small shapes, one thread, GFLOP/s:\n");
  // Linear layers: y = x W^T (NT), dx = dy W (NN), dW += dy^T x (TN). Experts (weights [H, 2I] and
  // [I, H]): y = x W (NN), dx = dy W^T (NT), dW += x^T dy (TN). Every layer is MoE in beam-small.
  const GemmCase cases[] = {
      {"attn q/o proj fwd", false, true, 1024, 256, 256},
      {"attn k/v proj fwd", false, true, 1024, 128, 256},
      {"expert gate_up fwd", false, false, 256, 512, 256},
      {"expert down fwd", false, false, 256, 256, 256},
      {"attn proj bwd dx", false, false, 1024, 256, 256},
      {"attn q/o proj bwd dW", true, false, 256, 256, 1024, true},
      {"attn k/v proj bwd dW", true, false, 128, 256, 1024, true},
      {"expert gate_up bwd dx", false, true, 256, 256, 512},
      {"expert gate_up bwd dW", true, false, 256, 512, 256, true},
      {"expert down bwd dx", false, true, 256, 256, 256},
      {"expert down bwd dW", true, false, 256, 256, 256, true},
  };
  for (const GemmCase& g : cases) bench_gemm(g);

  const int cores = cpu::default_compute_threads(1);
  std::printf("reference trainer beam-small (8x256 tokens/step, micro-batch 4), tokens/s, best of 3 interleaved "
              "rounds:\n");
  double fp32_one = 0;
  // fp32 and bf16 alternate over three rounds and each keeps its best: on a shared machine a
  // neighbour's burst then spoils a round, not one precision's whole figure (single runs of 3
  // steps gave bf16/fp32 at 2 threads anywhere from 0.84 to 1.41 on the same build).
  constexpr int kRounds = 3;
  for (int threads : {1, cores}) {
    double fp32 = 0, bf16 = 0, amx = 0;
    for (int round = 0; round < kRounds; ++round) {
      fp32 = std::max(fp32, trainer_run(Precision::fp32, threads, 3).tokens_per_s);
      bf16 = std::max(bf16, trainer_run(Precision::bf16, threads, 3).tokens_per_s);
      amx = std::max(amx, on_amx([&] { return trainer_run(Precision::bf16, threads, 3).tokens_per_s; }));
    }
    if (threads == 1) fp32_one = fp32;
    std::printf("  compute.threads %d: fp32 %.0f, bf16 %.0f, bf16/fp32 %.3f, fp32 vs fp32 on one thread %.3f",
                threads, fp32, bf16, bf16 / fp32, fp32 / fp32_one);
    if (amx > 0) std::printf("; bf16 on amx %.0f, amx/fp32 %.3f", amx, amx / fp32);
    std::printf("\n");
    if (cores == 1) break;
  }
  print_step_fractions("fp32", trainer_run(Precision::fp32, 1, 3, true));
  print_step_fractions("bf16", trainer_run(Precision::bf16, 1, 3, true));
  on_amx([] {
    print_step_fractions("bf16 on amx", trainer_run(Precision::bf16, 1, 3, true));
    return 0.0;
  });

  // The actor runtime's overhead: beam-small, the same global batch (8 x 256 tokens, micro-batches
  // of 2 rows), reference trainer vs the actors simulating dp_shard = 4 in this process.
  double reference_allocations = 0, actors_allocations = 0;
  const double reference_s = seconds_per_step(bench_config(1, "beam-small", 8, 2, 256), make_reference_engine, 3,
                                              nullptr, &reference_allocations);
  std::unique_ptr<TrainingEngine> sharded;
  const double actors_s = seconds_per_step(bench_config(4, "beam-small", 8, 2, 256), make_actor_engine, 3, &sharded,
                                           &actors_allocations);
  std::printf("actor runtime beam-small step: reference %.3f s, actors dp_shard=4 (sim, 4 ranks on this machine) "
              "%.3f s, overhead ratio %.3f\n",
              reference_s, actors_s, actors_s / reference_s);
  std::printf("tensor allocations per step: reference %.0f, actors dp_shard=4 %.0f (all 4 ranks)\n",
              reference_allocations, actors_allocations);
  auto& actors = dynamic_cast<ActorEngine&>(*sharded);
  const std::size_t block = actors.plan().unit_index("model.layers.1");
  std::printf("unit gather round trip (model.layers.1 of beam-small, 4 ranks, sim): %.1f us\n",
              actors.gather_round_trip_us(block, 50));
  // Expert parallelism: beam-small on dp_shard 4 at ep 1, 2, 4 (all_to_all), the same batch as above.
  // Step time and the experts ops' bytes per step (dispatch + combine, forward) against ep 1.
  double ep1_s = 0;
  for (int ep : {1, 2, 4}) {
    StepResult last;
    const double s = seconds_per_step(bench_config(4, "beam-small", 8, 2, 256, ep), make_actor_engine, 3, nullptr,
                                      nullptr, &last);
    if (ep == 1) ep1_s = s;
    std::printf("expert parallelism beam-small dp_shard=4 ep=%d (sim): step %.3f s (ratio %.3f vs ep 1), "
                "all-to-all bytes/step %lld (dispatch %lld, combine %lld)\n",
                ep, s, s / ep1_s, static_cast<long long>(last.bytes_dispatch + last.bytes_combine),
                static_cast<long long>(last.bytes_dispatch), static_cast<long long>(last.bytes_combine));
  }
  std::unique_ptr<TrainingEngine> single;
  seconds_per_step(bench_config(1, "beam-tiny-moe", 4, 2, 32), make_actor_engine, 1, &single);
  auto& one = dynamic_cast<ActorEngine&>(*single);
  std::printf("unit gather round trip (model.layers.1 of beam-tiny-moe, 1 rank, sim): %.1f us\n",
              one.gather_round_trip_us(one.plan().unit_index("model.layers.1"), 500));
  return 0;
}

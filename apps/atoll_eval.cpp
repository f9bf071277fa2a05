// atoll-eval CONFIG --checkpoint DIR [--batches N] [--dump-logits FILE --tokens FILE]
// Loss and perplexity of a checkpoint over the config's data source; with --dump-logits, the
// fp32 logits of the token rows in --tokens as a safetensors file (tensor `logits` [B, S, V]).
// Exit codes: 0 done, 2 bad input (a checkpoint with NaN/inf weights too, unless
// --allow-nonfinite; one whose model settings differ from the config's, unless
// --allow-model-change), 3 the loss is not finite, 1 other failures.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <new>
#include <iostream>
#include <limits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/cli_checks.hpp"
#include "apps/end_message.hpp"
#include "apps/fatal_exit.hpp"
#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/data/data_source.hpp"
#include "graph/eval/evaluate.hpp"
#include "graph/training/output_path.hpp"
#include "graph/training/run.hpp"

namespace {

// The logits must not replace an input: the config, the --tokens file, the config's data file, any
// file of the checkpoint (its model file replaced, every later load would fail), or the records of
// the config's run.
void check_dump_replaces_no_input(const std::string& dump, const std::string& tokens, const std::string& checkpoint,
                                  const atl::RunConfig& config) {
  const std::filesystem::path run_dir(config.run_dir);
  atl::check_replaces_no_input(dump,
                               {{tokens, "the --tokens file", false},
                                {config.source_file, "the config file", false},
                                {config.data.path, "the data file (data.source)", false},
                                {(run_dir / "metrics.jsonl").string(), "the run's metrics.jsonl", false},
                                {(run_dir / "run.json").string(), "the run's run.json", false},
                                {checkpoint, "the --checkpoint directory", true}},
                               config.source_file, "--dump-logits");
}

}  // namespace

int main(int argc, char** argv) {
  atl::exit_on_escaped_exception("atoll-eval");
  atl::report_file_size_limit_as_write_error();
  CLI::App app{"atoll-eval: evaluate a checkpoint"};
  std::string config_path, checkpoint, dump_logits, tokens;
  std::vector<std::string> sets;
  std::int64_t batches = 8;
  app.add_option("config", config_path, "run config (model, precision, data, train.global_batch/seq_len)")
      ->required()
      ->check(atl::non_empty_path());
  app.add_option("--checkpoint", checkpoint, "a checkpoint directory (step-NNNNNNNN)")
      ->required()
      ->check(atl::non_empty_path());
  app.add_option("--set", sets, "override a config key (repeatable)");
  app.add_option("--batches", batches, "batches of train.global_batch x train.seq_len to score (default 8)")
      ->check(atl::positive_int64("a positive count"));
  auto* dump = app.add_option("--dump-logits", dump_logits, "write the fp32 logits of --tokens rows here")
                   ->check(atl::non_empty_path());
  auto* rows = app.add_option("--tokens", tokens, "safetensors file with input_ids, positions, valid [B, S]")
                   ->check(atl::non_empty_path());
  bool allow_nonfinite = false;
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "load a checkpoint whose weights hold NaN or infinities (to inspect a broken run)");
  bool allow_model_change = false;
  app.add_flag("--allow-model-change", allow_model_change,
               "score a checkpoint under model settings that differ from its config.json's (rope_theta, "
               "sliding_window, ...: the shapes must still match)");
  dump->needs(rows);
  rows->needs(dump);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    const atl::RunConfig config = atl::load_run_config(config_path, sets);
    if (!dump_logits.empty()) {
      atl::check_output_path(dump_logits, true, config.source_file, "--dump-logits");
      check_dump_replaces_no_input(dump_logits, tokens, checkpoint, config);
    }
    atl::use_bf16_gemm(config);  // as training multiplied; a bad ATOLL_CPU_ISA is refused here, not in a kernel
    const std::shared_ptr<const atl::Model> model = atl::make_model(config.model, config.source_file);
    const atl::TensorMap master = atl::checkpoint_weights(*model, checkpoint, allow_nonfinite, allow_model_change);
    if (!dump_logits.empty()) {
      atl::TensorMap out;
      out.insert("logits", atl::model_logits(*model, master, config.precision, atl::read_token_rows(tokens, model->unpadded_vocab_size())));
      atl::create_parent_folders(dump_logits);
      atl::write_safetensors(dump_logits, out);
      std::cout << "logits " << out.at("logits").describe() << " written to " << dump_logits << "\n";
      return 0;
    }
    auto data = atl::make_data_source(config.data, model->unpadded_vocab_size(), config.train.seed, config.source_file);
    const atl::EvalResult r = atl::evaluate(*model, master, config.precision, *data, config.train.global_batch,
                                            config.train.seq_len, batches);
    if (r.targets == 0) {  // a loss of 0 and a perplexity of 1 would read as a perfect model
      std::cerr << fmt::format("atoll-eval: {} batches of {} hold no target: nothing to evaluate\n", r.batches,
                               data->describe());
      return 2;
    }
    std::cout << fmt::format("eval loss={:.6f} perplexity={:.4f} targets={} batches={}\n", r.loss, r.perplexity,
                             r.targets, r.batches);
    if (!std::isfinite(r.loss)) {
      std::cerr << "atoll-eval: the loss is not finite\n";
      return 3;
    }
    return 0;
  } catch (const std::bad_alloc&) {  // a batch is one forward pass: its size is the config's, or the --tokens file's
    if (!tokens.empty()) {
      std::cerr << "atoll-eval: out of memory: the rows of " << tokens
                << " are scored in one forward pass; give fewer or shorter rows\n";
    } else {
      std::cerr << "atoll-eval: out of memory: a batch of train.global_batch x train.seq_len tokens is scored in one "
                   "forward pass; lower train.global_batch (--set train.global_batch=N)\n";
    }
    return 2;
  } catch (const std::exception& e) {
    return atl::report_failure("atoll-eval", e, sets);
  }
}

// atoll-convert export CHECKPOINT OUT [--dtype fp32|bf16] [--max-shard-bytes N]
// atoll-convert import HF_DIR OUT_ROOT [--config RUN.yaml [--set key=value ...]]
// Exit codes: 0 done, 2 bad input (config, checkpoint, HF files), 1 other failures.
#include <limits>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/cli_checks.hpp"
#include "apps/end_message.hpp"
#include "apps/fatal_exit.hpp"
#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/hf_export.hpp"
#include "graph/checkpoint/hf_import_config.hpp"

int main(int argc, char** argv) {
  atl::exit_on_escaped_exception("atoll-convert");
  atl::report_file_size_limit_as_write_error();
  CLI::App app{"atoll-convert: training checkpoints <-> HF safetensors layout"};
  app.require_subcommand(1);
  std::string checkpoint, out, dtype = "fp32", hf_dir, out_root, config_path;
  std::int64_t max_shard_bytes = std::int64_t{5} << 30;
  std::vector<std::string> sets;
  auto* exp = app.add_subcommand("export", "write a checkpoint's model in HF layout (model.safetensors, or shards and their index, and config.json)");
  exp->add_option("checkpoint", checkpoint, "a checkpoint directory (step-NNNNNNNN)")
      ->required()
      ->check(atl::non_empty_path());
  exp->add_option("out", out, "the HF directory to create")->required()->check(atl::non_empty_path());
  exp->add_option("--dtype", dtype, "bulk tensors in fp32 (the default) or bf16 (FP32 islands always stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  exp->add_option("--max-shard-bytes", max_shard_bytes, "split model files above this size (default 5 GiB)")
      ->check(atl::positive_int64("a positive byte count"));
  auto* imp = app.add_subcommand("import", "read an HF directory into a training checkpoint (step 0)");
  imp->add_option("hf_dir", hf_dir, "the HF directory")->required()->check(atl::non_empty_path());
  imp->add_option("out_root", out_root, "checkpoint root; the checkpoint is written to OUT_ROOT/step-00000000 (never over an existing one)")
      ->required()
      ->check(atl::non_empty_path());
  imp->add_option("--config", config_path,
                  "a run config whose model section states the model (default: the HF directory's config.json); "
                  "config.json must agree with it")
      ->check(atl::non_empty_path());
  imp->add_option("--set", sets, "override a config key (repeatable)");
  // (CLI11 would say only "A subcommand is required".)
  if (argc > 1 && argv[1][0] != '-' && std::string(argv[1]) != "export" && std::string(argv[1]) != "import") {
    std::cerr << "atoll-convert: '" << argv[1] << "' is not a subcommand; expected export or import (--help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (exp->parsed()) {
      atl::export_hf(checkpoint, out, dtype == "bf16" ? atl::DType::bf16 : atl::DType::f32, max_shard_bytes);
      std::cout << "exported " << checkpoint << " to " << out << "\n";
    } else {
      if (config_path.empty() && !sets.empty()) {
        std::cerr << "atoll-convert: --set changes the run config of --config; give --config too\n";
        return 2;
      }
      std::optional<atl::RunConfig> given;
      if (!config_path.empty()) given = atl::load_run_config(config_path, sets);
      std::vector<std::string> ignored;
      const auto path = atl::import_hf(hf_dir, atl::hf_import_config(hf_dir, given, &ignored), out_root);
      std::cout << "imported " << hf_dir << " to " << path.string() << "\n";
      if (!ignored.empty()) {
        std::cout << fmt::format("note: config.json fields atoll does not use were ignored: {}\n",
                                 fmt::join(ignored, ", "));
      }
    }
    return 0;
  } catch (const std::exception& e) {
    return atl::report_failure("atoll-convert", e, sets);
  }
}

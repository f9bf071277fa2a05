// MODELS.md §10.1.5 for Beam and Flint (Inkling2's test is in test_inkling2_model.cpp): columns
// >= Vu of the logits are -inf and the head rows >= Vu get exactly zero gradient, in fp32 and bf16.
// MODELS.md §10.5.2 for every family: an HF export with bulk dtype bf16 writes every FP32 island
// tensor as F32 and every bulk tensor as BF16, read from the safetensors headers themselves.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/hf_export.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/config.hpp"
#include "graph/models/beam/model.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/model.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
namespace fs = std::filesystem;

namespace {

// name -> dtype string ("F32", "BF16", ...) of every tensor in every *.safetensors file of `dir`,
// read from the raw headers (8-byte little-endian length, then the JSON header).
std::map<std::string, std::string> header_dtypes(const fs::path& dir, int* file_count) {
  std::map<std::string, std::string> dtypes;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    INFO(entry.path().string());
    const std::string bytes = checkpoint_testing::read_bytes(entry.path());
    REQUIRE(bytes.size() >= 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    REQUIRE(n <= bytes.size() - 8);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, static_cast<std::size_t>(n)));
    REQUIRE(header.is_object());
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") continue;
      INFO(name);
      CHECK(dtypes.count(name) == 0);  // in exactly one shard
      dtypes[name] = it.value().at("dtype").get<std::string>();
    }
  }
  if (file_count) *file_count = files;
  return dtypes;
}

// A value per spec index, distinct and exact in bf16 (8 significant bits), so a bulk tensor
// keeps its tag through the export's rounding and every file tensor names the spec it came from.
float tag_of(std::size_t i) { return std::ldexp(static_cast<float>(128 + i % 128), static_cast<int>(i / 128)); }

struct ExportCase {
  std::string family, preset;
  std::vector<std::pair<std::string, std::string>> by_hand;  // HF name -> file dtype, from MODELS.md
};

}  // namespace

TEST_CASE("Beam and Flint: padded vocabulary rows of lm_head get exactly zero gradient and -inf logits in fp32 "
          "and bf16 (MODELS.md 10.1.5)",
          "[beam][flint][bf16]") {
  const std::vector<std::shared_ptr<const Model>> models = {
      std::make_shared<const BeamModel>(beam_preset("beam-tiny-moe")),
      std::make_shared<const FlintModel>(flint_preset("flint-tiny"))};
  const std::int64_t rows = 2, seq = 32;
  const Batch batch = testing::synthetic_batch(rows, seq, 21);
  // A packed batch: several documents in every row, and targets to score.
  for (std::int64_t b = 0; b < rows; ++b) {
    std::int64_t starts = 0;
    for (std::int64_t t = 1; t < seq; ++t) starts += batch.positions.data<std::int64_t>()[b * seq + t] == 0;
    REQUIRE(starts >= 1);
  }
  REQUIRE(batch.target_count() > 0);

  for (const auto& model : models) {
    const std::int64_t vocab = model->vocab_size(), usable = model->unpadded_vocab_size();
    REQUIRE(usable < vocab);  // the tiny presets pad (Vu = 250, V = 256)
    const TensorMap master = TensorMap::initialized(model->specs(), 7, model->init_std());
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      INFO(model->family() << " " << precision_name(precision));
      const TensorMap w = compute_weights(model->specs(), master, precision);

      Tensor logits;
      model->forward(w, batch, precision, &logits);
      REQUIRE(logits.shape() == Shape{rows, seq, vocab});
      std::int64_t not_minus_inf = 0;
      for (std::int64_t t = 0; t < rows * seq; ++t) {
        for (std::int64_t v = usable; v < vocab; ++v) {
          not_minus_inf += !(logits.data<float>()[t * vocab + v] == -std::numeric_limits<float>::infinity());
        }
      }
      CHECK(not_minus_inf == 0);

      const TensorMap grads = TensorMap::zeros_like(model->specs());
      model->forward_backward(w, batch, precision, 1.0f, grads);
      const Tensor& gh = grads.at("lm_head.weight");
      REQUIRE(gh.dtype() == DType::f32);
      REQUIRE(gh.rank() == 2);
      REQUIRE(gh.size(0) == vocab);
      const std::int64_t hidden = gh.size(1);
      const float* g = gh.data<float>();
      // Every element of every padded row is exactly 0 (a NaN counts as non-zero).
      std::int64_t nonzero_padded = 0;
      for (std::int64_t i = usable * hidden; i < vocab * hidden; ++i) nonzero_padded += !(g[i] == 0.0f);
      CHECK(nonzero_padded == 0);
      // The usable rows do get a gradient (so the zero above is not a head that learns nothing).
      double usable_abs = 0;
      std::int64_t nonzero_usable = 0;
      for (std::int64_t i = 0; i < usable * hidden; ++i) {
        usable_abs += std::abs(static_cast<double>(g[i]));
        nonzero_usable += g[i] != 0.0f;
      }
      CHECK(std::isfinite(usable_abs));
      CHECK(usable_abs > 0.0);
      CHECK(nonzero_usable > usable * hidden / 2);
    }
  }
}

TEST_CASE("HF export in bf16 keeps every FP32 island tensor F32 and writes bulk tensors BF16 (MODELS.md 10.5.2)",
          "[checkpoint][export]") {
  const std::vector<ExportCase> cases = {
      {"beam",
       "beam-tiny-moe",
       {{"model.layers.0.mlp.gate.weight", "F32"},
        {"model.layers.3.mlp.gate.weight", "F32"},
        {"model.layers.0.mlp.gate.e_score_correction_bias", "F32"},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", "BF16"},
        {"model.layers.0.mlp.experts.3.up_proj.weight", "BF16"},
        {"model.layers.1.self_attn.output_gate_bias", "BF16"},
        {"model.embed_tokens.weight", "BF16"},
        {"model.norm.weight", "BF16"},
        {"lm_head.weight", "BF16"}}},  // §10.4.5: Beam's head is bulk
      {"flint",
       "flint-tiny",
       {{"model.layers.0.self_attn.softmax_offset", "F32"},  // sinks, §10.3.1
        {"model.layers.5.self_attn.softmax_offset", "F32"},
        {"lm_head.weight", "F32"},                    // §10.3.4: Flint's head is an island
        {"model.layers.2.mlp.gate.weight", "BF16"},  // §10.3.4: the router weight is bulk
        {"model.layers.3.mlp.experts.7.down_proj.weight", "BF16"},
        {"model.layers.2.mlp.shared_expert.gate_proj.weight", "BF16"},
        {"model.layers.0.mlp.gate_proj.weight", "BF16"},
        {"model.embed_tokens.weight", "BF16"}}},
      {"inkling2",
       "inkling2-tiny",
       {{"layers.1.attn_query.weight", "F32"},  // §10.2.10 names, §1.2 / §1.6 islands
        {"layers.3.attn_query.0.weight", "F32"},
        {"layers.3.attn_query.2.weight", "F32"},
        {"layers.0.mlp_query.weight", "F32"},
        {"output_query.weight", "F32"},
        {"layers.0.self_attn.q_l2_clip.scale", "F32"},
        {"layers.3.self_attn.rel_l2_clip.scale", "F32"},
        {"layers.2.mlp.gate.weight", "F32"},
        {"lm_head.weight", "BF16"},  // §10.2.8: bulk
        {"layers.3.self_attn.relative_table", "BF16"},  // §10.2.9: bulk
        {"layers.0.self_attn.k_sconv.weight", "BF16"},
        {"layers.1.attn_sconv.weight", "BF16"},
        {"layers.0.mlp.experts.gate_up_proj", "BF16"},
        {"layers.0.mlp.experts.down_proj", "BF16"},
        {"embed_tokens.weight", "BF16"}}},
  };
  REQUIRE(cases.size() == model_families().size());

  for (const ExportCase& c : cases) {
    INFO(c.family << " (" << c.preset << ")");
    const RunConfig rc = parse_run_config("model: {family: " + c.family + ", preset: " + c.preset +
                                              "}\ntrain: {steps: 1, global_batch: 2, micro_batch: 1, seq_len: 32, "
                                              "lr: 1.0e-3}\n",
                                          "export.yaml");
    const std::shared_ptr<const Model> model = make_model(rc.model, rc.source_file);
    REQUIRE(model->family() == c.family);
    const std::vector<ParamSpec>& specs = model->specs();

    // Weights tagged per spec; a checkpoint of them, as a run would save it.
    TensorMap tagged;
    std::map<float, std::size_t> spec_of_tag;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      tagged.insert(specs[i].name, Tensor::full(specs[i].shape, tag_of(i)));
      spec_of_tag[tag_of(i)] = i;
    }
    REQUIRE(spec_of_tag.size() == specs.size());
    CheckpointContents contents;
    contents.step = 0;
    contents.model = tagged;
    contents.exp_avg = TensorMap::zeros_like(specs);
    contents.exp_avg_sq = TensorMap::zeros_like(specs);
    contents.trainer_state = {{"step", 0},
                              {"family", model->family()},
                              {"preset", model->preset()},
                              {"config", to_json(rc)}};
    contents.model_config = model->hf_config();
    checkpoint_testing::TempDir tmp;
    const fs::path checkpoint = save_checkpoint(tmp.path / "checkpoints", contents, 0);

    // The model's own HF names (its adapter), for the tensors the export must write.
    const TensorMap hf_expected = model->to_hf(tagged);
    const std::set<std::string> expected_names(hf_expected.names().begin(), hf_expected.names().end());

    // One file, and shards small enough that the export must split the model.
    for (const std::int64_t shard_bytes : {kCheckpointShardBytes, std::int64_t{32} << 10}) {
      INFO("max_shard_bytes " << shard_bytes);
      const fs::path out = tmp.path / ("hf-" + std::to_string(shard_bytes));
      export_hf(checkpoint, out, DType::bf16, shard_bytes);
      // config.json names the bulk dtype for HF loaders (torch_dtype "auto").
      CHECK(read_json_file(out / "config.json").at("torch_dtype") == "bfloat16");
      int file_count = 0;
      const std::map<std::string, std::string> dtypes = header_dtypes(out, &file_count);
      if (shard_bytes == kCheckpointShardBytes) {
        CHECK(file_count == 1);
      } else {
        CHECK(file_count >= 2);
      }
      std::set<std::string> file_names;
      for (const auto& [name, dtype] : dtypes) file_names.insert(name);
      CHECK(file_names == expected_names);

      // Each file tensor's spec, from its tag; the expected dtype from that spec's island flag.
      const SafetensorsContents files = read_model_files(out);
      std::vector<int> seen(specs.size(), 0);
      int island_tensors = 0, bulk_tensors = 0;
      for (const auto& [name, dtype] : dtypes) {
        INFO("HF tensor " << name << " written as " << dtype);
        REQUIRE(files.tensors.contains(name));
        const Tensor values = files.tensors.at(name).to(DType::f32);
        REQUIRE(values.numel() > 0);
        const float tag = values.data<float>()[0];
        const auto found = spec_of_tag.find(tag);
        REQUIRE(found != spec_of_tag.end());
        std::int64_t off_tag = 0;
        for (const float v : values.span<float>()) off_tag += !(v == tag);
        CHECK(off_tag == 0);  // one spec per HF tensor, values intact
        const ParamSpec& spec = specs[found->second];
        INFO("from spec " << spec.name << (spec.island ? " (island)" : " (bulk)"));
        seen[found->second] += 1;
        CHECK(dtype == (spec.island ? "F32" : "BF16"));
        CHECK(files.tensors.at(name).dtype() == (spec.island ? DType::f32 : DType::bf16));
        (spec.island ? island_tensors : bulk_tensors) += 1;
      }
      CHECK(island_tensors > 0);
      CHECK(bulk_tensors > 0);
      for (std::size_t i = 0; i < specs.size(); ++i) {
        INFO("spec " << specs[i].name);
        CHECK(seen[i] > 0);  // every parameter is exported
      }

      // By hand, from MODELS.md, so a wrong island list or name mapping cannot hide everything.
      for (const auto& [name, dtype] : c.by_hand) {
        INFO("by hand: " << name);
        const auto it = dtypes.find(name);
        REQUIRE(it != dtypes.end());
        CHECK(it->second == dtype);
      }
    }
  }
}

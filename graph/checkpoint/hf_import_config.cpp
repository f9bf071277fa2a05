#include "graph/checkpoint/hf_import_config.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/config_value.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/models/model.hpp"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Fields of config.json that describe the file rather than the model's shape.
const std::set<std::string> kNotModelKeys = {"architectures", "model_type", "atoll_preset"};

// config.json fields whose model key has another name (hf_fields writes them under the HF name).
const std::map<std::string, std::string> kModelKeyOf = {{"initializer_range", "init_std"}};
std::string model_key(const std::string& hf_key) {
  const auto it = kModelKeyOf.find(hf_key);
  return it != kModelKeyOf.end() ? it->second : hf_key;
}

// Fields the ecosystem writes that change nothing atoll computes (dtype, tokenizer ids, library
// versions, inference switches): ignored without a note.
const std::set<std::string> kMetadataKeys = {
    "torch_dtype",       "dtype",          "transformers_version", "_name_or_path",        "bos_token_id",
    "eos_token_id",      "pad_token_id",   "use_cache",            "auto_map",             "output_attentions",
    "output_hidden_states", "return_dict", "max_position_embeddings"};

// Fields a family may not write whose other values would make another model than atoll builds
// (scaled RoPE, biases, dropout, another activation): absent or this value, else refused.
const std::map<std::string, json>& neutral_values() {
  static const std::map<std::string, json> values = {
      {"rope_scaling", nullptr},  {"attention_bias", false}, {"mlp_bias", false},
      {"attention_dropout", 0.0}, {"hidden_dropout", 0.0},   {"hidden_act", "silu"},
      {"partial_rotary_factor", 1.0}, {"tie_word_embeddings", false}};
  return values;
}

std::string model_yaml(const json& model) {
  json doc = {{"model", model},
              {"train", {{"steps", 1}, {"global_batch", 1}, {"micro_batch", 1}, {"seq_len", 2}, {"lr", 1e-3}}}};
  return doc.dump();  // JSON is YAML
}

}  // namespace

RunConfig hf_import_config(const fs::path& hf_dir, const std::optional<RunConfig>& given,
                           std::vector<std::string>* ignored) {
  if (!fs::is_directory(hf_dir)) {
    throw CheckpointError(hf_dir.string() + ": not an HF model directory (missing or not a directory)");
  }
  if (fs::exists(hf_dir / "trainer_state.json")) {  // the reverse of export's own mistake
    throw CheckpointError(hf_dir.string() + ": an atoll training checkpoint (it has trainer_state.json), not an HF "
                          "model folder: train, resume or evaluate from it as it is, or `atoll-convert export` it");
  }
  const fs::path file = hf_dir / "config.json";
  const json hf = read_json_file(file);  // an HF directory's config.json names the model
  if (!hf.is_object()) throw CheckpointError(file.string() + ": not a JSON object");
  if (!hf.contains("model_type") || !hf.at("model_type").is_string()) {
    throw CheckpointError(file.string() + ": model_type: missing (expected one of the families: beam, flint, inkling2)");
  }
  const std::string family = hf.at("model_type").get<std::string>();
  const auto& families = model_families();
  if (std::find(families.begin(), families.end(), family) == families.end()) {
    throw CheckpointError(fmt::format("{}: model_type: '{}' is not a family atoll trains (beam, flint, inkling2)",
                                      file.string(), family));
  }

  RunConfig config;
  if (given) {
    config = *given;
    if (config.model.family != family) {
      throw CheckpointError(fmt::format("{}: model_type: '{}', but the run config names model.family '{}'",
                                        file.string(), family, config.model.family));
    }
  } else {
    // Overrides: every config.json field the family takes as a model key; the family's reader
    // names the first key it does not take, which is dropped and the build retried.
    json model = {{"family", family}};
    if (hf.contains("atoll_preset") && hf.at("atoll_preset").is_string()) model["preset"] = hf.at("atoll_preset");
    for (const auto& [key, value] : hf.items()) {
      if (!kNotModelKeys.count(key)) model[model_key(key)] = value;
    }
    const std::string source = (hf_dir / "config.json").string();
    for (;;) {
      try {
        config = parse_run_config(model_yaml(model), source);
        make_model(config.model, config.source_file);
        break;
      } catch (const UnknownKeyError& e) {
        const std::string key = e.key().rfind("model.", 0) == 0 ? e.key().substr(6) : "";
        if (key.empty() || !model.contains(key)) throw CheckpointError(e.what());
        model.erase(key);  // not a model key of this family (e.g. torch_dtype); checked below if it matters
      } catch (const ConfigError& e) {
        std::string named_in_file;  // a renamed field is named as the file has it too
        for (const auto& [hf_key, key] : kModelKeyOf) {
          if (e.key() == "model." + key && hf.contains(hf_key)) named_in_file = " (config.json's " + hf_key + ")";
        }
        throw CheckpointError(e.what() + named_in_file);
      }
    }
  }
  // What the model would write must be what the file says, field by field; a field it does not
  // write either changes nothing atoll computes or is refused.
  const json mine = make_model(config.model, config.source_file)->hf_config();
  for (const auto& [key, value] : hf.items()) {
    if (key == "atoll_preset") continue;
    const auto it = mine.find(key);
    const json* expected = it != mine.end() ? &*it : nullptr;
    const auto neutral = neutral_values().find(key);
    if (!expected && neutral != neutral_values().end()) expected = &neutral->second;
    // "64" for 64: the value's form is wrong, not its size (a setting the model writes itself;
    // integers and floats are both numbers).
    if (it != mine.end() && !expected->is_null() && value.type() != expected->type() &&
        !(value.is_number() && expected->is_number())) {
      throw CheckpointError(fmt::format("{}: {}: expected a JSON {} (the model {} has {}), got {}", file.string(), key,
                                        expected->type_name(), given ? "the run config describes" : "built from it",
                                        expected->dump(),
                                        value.is_null() ? "null" : std::string("the ") + value.type_name() + " " + value.dump()));
    }
    if (expected && !same_config_value(value, *expected)) {
      throw CheckpointError(fmt::format("{}: {}: {} in the file, but the model {} has {}", file.string(), key,
                                        value.dump(), given ? "the run config describes" : "built from it",
                                        it != mine.end() ? expected->dump()
                                                         : expected->dump() + " (atoll's " + family + " has no other)"));
    }
    if (!expected && !kNotModelKeys.count(key) && !kMetadataKeys.count(key) && ignored) ignored->push_back(key);
  }
  return config;
}

}  // namespace atl

#include "graph/checkpoint/hf_import_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

// config.json's value at `key` ("hidden_size", or a list element "mlp_only_layers[1]"), or null.
const json* field_named(const json& hf, const std::string& key) {
  const std::size_t bracket = key.find('[');
  const std::string name = key.substr(0, bracket);
  if (name.empty() || !hf.contains(name)) return nullptr;
  const json* value = &hf.at(name);
  if (bracket == std::string::npos) return value;
  const std::size_t index = std::strtoull(key.c_str() + bracket + 1, nullptr, 10);
  return value->is_array() && index < value->size() ? &value->at(index) : nullptr;
}

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
// (Switches for parts every atoll family has, as other code bases name them, count too: false
// would remove the part.)
const std::map<std::string, json>& neutral_values() {
  static const std::map<std::string, json> values = {
      {"rope_scaling", nullptr},  {"attention_bias", false}, {"mlp_bias", false},
      {"attention_dropout", 0.0}, {"hidden_dropout", 0.0},   {"hidden_act", "silu"},
      {"partial_rotary_factor", 1.0}, {"tie_word_embeddings", false},
      {"use_qk_norm", true},      {"use_sliding_window", true}, {"ssmax", true},
      {"attention_output_gate", true}, {"attention_output_gate_bias", true}};
  return values;
}

// Fields a config.json without atoll_preset may leave out: they change nothing an imported model
// computes (init), or have the value every code base assumes (Inkling2's clip radii: sqrt(D),
// sqrt(D), sqrt(dr), what atoll builds when they are not set).
const std::set<std::string> kMayBeAbsent = {"architectures", "model_type", "atoll_preset", "initializer_range",
                                            "tie_word_embeddings", "router_weights_fp32", "l2_clip_radius_q",
                                            "l2_clip_radius_k", "l2_clip_radius_r"};

// Inkling2's clip radii may be null: the default, the square root of the named dimension.
const std::map<std::string, std::string> kNullIsSqrtOf = {
    {"l2_clip_radius_q", "head_dim"}, {"l2_clip_radius_k", "head_dim"}, {"l2_clip_radius_r", "d_rel"}};

// rope_parameters, as newer HF configs write RoPE, read as atoll's rope_theta: the plain form
// {"rope_type": "default", "rope_theta": T}, or Beam's keyed by layer type with full layers
// without RoPE ({"sliding_attention": {...}, "full_attention": null}). Anything else would be
// another model: refused.
double rope_theta_of(const json& rope, const std::string& family, const fs::path& file) {
  auto refuse = [&](const std::string& why) -> double {
    throw CheckpointError(fmt::format("{}: rope_parameters: {} in the file; expected {{\"rope_type\": \"default\", "
                                      "\"rope_theta\": T}}{}",
                                      file.string(), why,
                                      family == "beam" ? " or that keyed by layer type with \"full_attention\": null "
                                                         "(Beam's full layers have no RoPE)"
                                                       : ""));
  };
  auto plain = [&](const json& p) {
    if (!p.is_object()) return refuse(std::string("a ") + p.type_name());
    for (const auto& [key, value] : p.items()) {
      if (key == "rope_type" && value == "default") continue;
      if (key == "rope_theta" && value.is_number()) continue;
      return refuse("\"" + key + "\": " + (value.is_structured() ? std::string(value.type_name()) : value.dump()));
    }
    if (!p.contains("rope_theta")) return refuse("no rope_theta");
    return p.at("rope_theta").get<double>();
  };
  if (!rope.is_object()) return refuse(std::string("a ") + rope.type_name());
  if (family != "beam" || rope.contains("rope_theta") || rope.contains("rope_type")) return plain(rope);
  for (const auto& [key, value] : rope.items()) {
    if (key != "sliding_attention" && key != "full_attention") return refuse("a layer type '" + key + "'");
  }
  if (rope.contains("full_attention") && !rope.at("full_attention").is_null()) {
    return refuse("RoPE on full_attention layers");
  }
  if (!rope.contains("sliding_attention")) return refuse("no sliding_attention entry");
  return plain(rope.at("sliding_attention"));
}

// The file's fields as model keys read them: rope_parameters as rope_theta, a null softcap as 0
// (none), a null clip radius as absent (its default). Without atoll_preset, fields with an HF meaning when absent get it: the usable
// vocabulary is the whole vocabulary, and no softcap.
json normalized_fields(const json& hf, const std::string& family, const fs::path& file, bool preset_named) {
  json fields = hf;
  if (fields.contains("rope_parameters")) {
    const double theta = rope_theta_of(fields.at("rope_parameters"), family, file);
    if (fields.contains("rope_theta") && !same_config_value(fields.at("rope_theta"), json(theta))) {
      throw CheckpointError(fmt::format("{}: rope_theta {} and rope_parameters' {} differ", file.string(),
                                        fields.at("rope_theta").dump(), json(theta).dump()));
    }
    fields["rope_theta"] = theta;
    fields.erase("rope_parameters");
  }
  const bool softcapped = family != "flint";
  if (softcapped && fields.contains("final_logit_softcapping") && fields.at("final_logit_softcapping").is_null()) {
    fields["final_logit_softcapping"] = 0.0;
  }
  for (const auto& [key, dim] : kNullIsSqrtOf) {
    if (family == "inkling2" && fields.contains(key) && fields.at(key).is_null()) fields.erase(key);  // checked below
  }
  if (!preset_named) {
    if (!fields.contains("unpadded_vocab_size") && fields.contains("vocab_size")) {
      fields["unpadded_vocab_size"] = fields.at("vocab_size");
    }
    if (softcapped && !fields.contains("final_logit_softcapping")) fields["final_logit_softcapping"] = 0.0;
  }
  return fields;
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

  const bool preset_named = hf.contains("atoll_preset") && hf.at("atoll_preset").is_string();
  const json fields = normalized_fields(hf, family, file, preset_named || given.has_value());
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
    if (preset_named) model["preset"] = hf.at("atoll_preset");
    for (const auto& [key, value] : fields.items()) {
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
        std::string hf_key = e.key().rfind("model.", 0) == 0 ? e.key().substr(6) : "";
        for (const auto& [from, key] : kModelKeyOf) {
          if (e.key() == "model." + key && hf.contains(from)) named_in_file = " (config.json's " + from + ")", hf_key = from;
        }
        // "64" for 64: a JSON string reaches the config reader quoted, a string; name its form
        // (a field's, or a list element's: "mlp_only_layers[1]").
        const bool boolean = e.problem().find("true or false") != std::string::npos;
        const bool scalar = e.problem().find("a list") == std::string::npos;  // (a list's own message says so)
        if (const json* value = field_named(hf, hf_key); value && value->is_string() && scalar) {
          throw CheckpointError(fmt::format("{}: {}: expected a JSON {}, got the string {}", file.string(), hf_key,
                                            boolean ? "boolean" : "number", value->dump()));
        }
        throw CheckpointError(e.what() + named_in_file);
      }
    }
  }
  // What the model would write must be what the file says, field by field; a field it does not
  // write either changes nothing atoll computes or is refused.
  const std::shared_ptr<const Model> built = make_model(config.model, config.source_file);
  const json mine = normalized_fields(built->hf_config(), family, file, true);
  if (!given && !preset_named) {
    // Without a preset named, a field left out would be the family's default preset's (tiny
    // sizes and choices): silently another model than the file's.
    std::vector<std::string> missing;
    for (const auto& [key, value] : mine.items()) {
      if (!fields.contains(key) && !kMayBeAbsent.count(key)) missing.push_back(key);
    }
    if (!missing.empty()) {
      throw CheckpointError(fmt::format(
          "{}: {}: missing; without atoll_preset they would be taken from atoll's {} preset, not from the model the "
          "file describes. Give them in config.json, or describe the model with --config",
          file.string(), fmt::join(missing, ", "), built->preset()));
    }
  }
  for (const auto& [key, dim] : kNullIsSqrtOf) {  // null or absent: the default, which the model must have
    const bool stated = hf.contains(key) && !hf.at(key).is_null();
    if (stated || !mine.contains(key)) continue;
    const json dflt = std::sqrt(mine.at(dim).get<float>());
    if (!same_config_value(mine.at(key), dflt)) {
      throw CheckpointError(fmt::format("{}: {}: {} (the default, sqrt({}) = {}) in the file, but the model {} has {}",
                                        file.string(), key, hf.contains(key) ? "null" : "absent", dim, dflt.dump(),
                                        given ? "the run config describes" : "built from it", mine.at(key).dump()));
    }
  }
  for (const auto& [key, value] : fields.items()) {
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

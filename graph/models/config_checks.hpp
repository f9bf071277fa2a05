// The checks a family's validate() shares with the others (beam, flint, inkling2): each throws
// std::invalid_argument "model.<field>: <what was expected>, got <the values>", which the config
// reader turns into a ConfigError naming the file.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace atl::model_checks {

inline void require(bool ok, const std::string& field, const std::string& expected) {
  if (!ok) throw std::invalid_argument("model." + field + ": " + expected);
}

inline std::string num(std::int64_t v) { return std::to_string(v); }

inline void sizes(std::int64_t hidden_size, std::int64_t num_hidden_layers, std::int64_t head_dim) {
  require(hidden_size > 0 && num_hidden_layers > 0 && head_dim > 0, "hidden_size",
          "hidden_size, num_hidden_layers and head_dim must be positive, got " + num(hidden_size) + ", " +
              num(num_hidden_layers) + ", " + num(head_dim));
}

inline void heads(std::int64_t num_attention_heads, std::int64_t num_key_value_heads) {
  require(num_attention_heads > 0, "num_attention_heads", "must be positive, got " + num(num_attention_heads));
  require(num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0, "num_key_value_heads",
          "must divide num_attention_heads (" + num(num_attention_heads) + "), got " + num(num_key_value_heads));
}

inline void vocab(std::int64_t unpadded_vocab_size, std::int64_t vocab_size) {
  require(unpadded_vocab_size > 0 && unpadded_vocab_size <= vocab_size, "unpadded_vocab_size",
          "must be in [1, vocab_size = " + num(vocab_size) + "], got " + num(unpadded_vocab_size));
}

inline void layer_types(const std::vector<std::string>& types, std::int64_t num_hidden_layers) {
  require(static_cast<std::int64_t>(types.size()) == num_hidden_layers, "layer_types",
          "needs one entry per layer (" + num(num_hidden_layers) + "), got " + num(static_cast<std::int64_t>(types.size())));
  for (const auto& t : types) {
    require(t == "sliding_attention" || t == "full_attention", "layer_types",
            "entries must be sliding_attention or full_attention, got '" + t + "'");
  }
}

// top-k of `experts` routed experts, chosen within the best topk_group of n_group groups.
inline void routing(const char* experts_key, std::int64_t experts, std::int64_t num_experts_per_tok,
                    std::int64_t n_group, std::int64_t topk_group) {
  require(experts > 0, experts_key, "must be positive, got " + num(experts));
  require(num_experts_per_tok > 0 && num_experts_per_tok <= experts, "num_experts_per_tok",
          std::string("must be in [1, ") + experts_key + " = " + num(experts) + "], got " + num(num_experts_per_tok));
  require(n_group > 0 && experts % n_group == 0, "n_group",
          std::string("must divide ") + experts_key + " (" + num(experts) + "), got " + num(n_group));
  require(topk_group > 0 && topk_group <= n_group, "topk_group",
          "must be in [1, n_group = " + num(n_group) + "], got " + num(topk_group));
  require(topk_group * (experts / n_group) >= num_experts_per_tok, "topk_group",
          "the kept groups must hold at least num_experts_per_tok (" + num(num_experts_per_tok) + ") experts; " +
              num(topk_group) + " of " + num(n_group) + " groups hold " + num(topk_group * (experts / n_group)));
}

}  // namespace atl::model_checks

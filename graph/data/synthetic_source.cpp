#include "graph/data/synthetic_source.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace atl {

SyntheticSource::SyntheticSource(std::uint64_t seed, std::int64_t vocab, SyntheticOptions options)
    : seed_(seed),
      vocab_(vocab),
      options_(options),
      length_rng_(seed, "atoll.data.synthetic.length"),
      token_rng_(seed, "atoll.data.synthetic.token") {
  if (vocab < 1) throw DataError(fmt::format("synthetic data: vocab: expected a positive integer, got {}", vocab));
  if (options.branching < 1 || options.branching > vocab) {
    throw DataError(fmt::format("synthetic data: synthetic_branching: expected an integer in [1, {}] (the usable vocab), got {}",
                                vocab, options.branching));
  }
  if (options.min_doc < 1) {
    throw DataError(fmt::format("synthetic data: synthetic_min_doc: expected a positive integer, got {}", options.min_doc));
  }
  if (options.max_doc < std::max<std::int64_t>(options.min_doc, 2)) {
    throw DataError(fmt::format("synthetic data: synthetic_max_doc: expected an integer >= synthetic_min_doc ({}) and "
                                ">= 2 (one-token documents hold no target), got {}",
                                options.min_doc, options.max_doc));
  }
  const std::int64_t b = options.branching;
  double total = 0.0;
  for (std::int64_t j = 0; j < b; ++j) total += 1.0 / static_cast<double>(j + 1);
  double running = 0.0;
  for (std::int64_t j = 0; j < b; ++j) {
    profile_.push_back(1.0 / static_cast<double>(j + 1) / total);
    running += profile_.back();
    cumulative_.push_back(running);
  }
  cumulative_.back() = 1.0;
  entropy_ = entropy_nats(profile_);

  // Distinct successors by rejection: draw k of token v uses counter (v << 32) + k.
  CounterRng successor_rng(seed, "atoll.data.synthetic.successors");
  successor_table_.resize(static_cast<std::size_t>(vocab * b));
  for (std::int64_t v = 0; v < vocab; ++v) {
    std::int64_t* row = successor_table_.data() + v * b;
    std::uint64_t draw = static_cast<std::uint64_t>(v) << 32;
    for (std::int64_t j = 0; j < b;) {
      auto candidate = static_cast<std::int64_t>(successor_rng.below(draw++, static_cast<std::uint64_t>(vocab)));
      if (std::find(row, row + j, candidate) == row + j) row[j++] = candidate;
    }
  }
  load_document(0);
}

double SyntheticSource::entropy_nats(const std::vector<double>& probabilities) {
  double h = 0.0;
  for (double p : probabilities) {
    if (p > 0.0) h -= p * std::log(p);
  }
  return h;
}

std::vector<std::int64_t> SyntheticSource::successors(std::int64_t token) const {
  if (token < 0 || token >= vocab_) {
    throw std::out_of_range(fmt::format("SyntheticSource::successors: token {} outside [0, {})", token, vocab_));
  }
  auto first = successor_table_.begin() + token * options_.branching;
  return {first, first + options_.branching};
}

std::vector<std::int64_t> SyntheticSource::document(std::uint64_t d) const {
  const auto span = static_cast<std::uint64_t>(options_.max_doc - options_.min_doc + 1);
  const auto length = static_cast<std::size_t>(options_.min_doc + static_cast<std::int64_t>(length_rng_.below(d, span)));
  // Token t of document d uses counter d * max_doc + t: distinct for every (d, t).
  const std::uint64_t base = d * static_cast<std::uint64_t>(options_.max_doc);
  std::vector<std::int64_t> tokens(length);
  tokens[0] = static_cast<std::int64_t>(token_rng_.below(base, static_cast<std::uint64_t>(vocab_)));
  for (std::size_t t = 1; t < length; ++t) {
    const double u = token_rng_.uniform(base + t);
    const auto j = static_cast<std::int64_t>(
        std::upper_bound(cumulative_.begin(), cumulative_.end() - 1, u) - cumulative_.begin());
    tokens[t] = successor_table_[static_cast<std::size_t>(tokens[t - 1] * options_.branching + j)];
  }
  return tokens;
}

void SyntheticSource::load_document(std::uint64_t d) {
  document_index_ = d;
  document_ = document(d);
  offset_ = 0;
}

StreamToken SyntheticSource::peek() const {
  return {document_[offset_], static_cast<std::int64_t>(offset_), true};
}

void SyntheticSource::advance() {
  if (++offset_ == document_.size()) load_document(document_index_ + 1);
}

nlohmann::json SyntheticSource::cursor() const {
  return {{"source", "synthetic"}, {"document", document_index_}, {"offset", offset_}};
}

void SyntheticSource::restore(const nlohmann::json& cursor) {
  const std::string what = "synthetic data";
  check_cursor_source(cursor, "synthetic", what);
  const std::int64_t d = cursor_integer(cursor, "document", 0, std::numeric_limits<std::int64_t>::max(), what);
  std::vector<std::int64_t> tokens = document(static_cast<std::uint64_t>(d));
  const std::int64_t offset = cursor_integer(cursor, "offset", 0, static_cast<std::int64_t>(tokens.size()) - 1, what);
  document_index_ = static_cast<std::uint64_t>(d);
  document_ = std::move(tokens);
  offset_ = static_cast<std::size_t>(offset);
}

std::string SyntheticSource::describe() const {
  return fmt::format("synthetic(seed {}, vocab {}, branching {}, documents of {}..{} tokens, floor {:.6f} nats/token)",
                     seed_, vocab_, options_.branching, options_.min_doc, options_.max_doc, entropy_);
}

}  // namespace atl

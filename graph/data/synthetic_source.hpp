// A seeded random Markov corpus whose entropy is known exactly, so a run's loss can be judged
// against its floor.
//
// Every token v in [0, vocab) has `branching` distinct successors, chosen by the seeded RNG in a
// random order; successor j gets probability profile[j], profile[j] proportional to 1/(j+1). Each row of
// the transition matrix is thus a permutation of one profile and has entropy H(profile) exactly.
// Documents have a length uniform in [min_doc, max_doc] and start with a uniform token. A
// document's last token is never scored (the next token starts a new document), so every scored
// target is one Markov transition and the best achievable loss is H(profile) nats per target.
//
// Document d is a pure function of (seed, d) (kernels/rng.hpp CounterRng); the cursor is
// {"source": "synthetic", "document": d, "offset": k} and restores exactly.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/data/data_source.hpp"
#include "kernels/rng.hpp"

namespace atl {

struct SyntheticOptions {
  std::int64_t branching = 4;
  std::int64_t min_doc = 8;
  std::int64_t max_doc = 64;
};

class SyntheticSource : public PackedSource {
 public:
  SyntheticSource(std::uint64_t seed, std::int64_t vocab, SyntheticOptions options = {});

  nlohmann::json cursor() const override;
  void restore(const nlohmann::json& cursor) override;
  std::optional<double> entropy_nats_per_token() const override { return entropy_; }
  std::string describe() const override;

  // The transition structure, for tests and diagnostics.
  const std::vector<double>& profile() const { return profile_; }
  // successors(v)[j] is taken with probability profile()[j].
  std::vector<std::int64_t> successors(std::int64_t token) const;
  // The tokens of document d.
  std::vector<std::int64_t> document(std::uint64_t d) const;
  // -sum p log p of a probability vector, in nats.
  static double entropy_nats(const std::vector<double>& probabilities);

 protected:
  StreamToken peek() const override;
  void advance() override;

 private:
  void load_document(std::uint64_t d);

  std::uint64_t seed_;
  std::int64_t vocab_;
  SyntheticOptions options_;
  std::vector<double> profile_;
  std::vector<double> cumulative_;           // running sums of profile_, last entry forced to 1
  std::vector<std::int64_t> successor_table_;  // [vocab, branching]
  double entropy_ = 0.0;
  CounterRng length_rng_;
  CounterRng token_rng_;

  std::uint64_t document_index_ = 0;
  std::vector<std::int64_t> document_;  // tokens of document_index_
  std::size_t offset_ = 0;
};

}  // namespace atl

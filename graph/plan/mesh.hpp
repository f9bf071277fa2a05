// The device mesh (MODELS.md §5.1): ranks laid out outer -> inner as (pp, dp_replicate, dp_shard,
// cp), so rank = ((pp * dp_replicate + r) * dp_shard + s) * cp + c. ep re-factors the dp x cp
// ranks of a pp stage; it is not a factor of the world size. tp is 1 (not implemented).
//
// The FSDP shard group of a rank is dp_shard x cp flattened (CP ranks shard parameters too);
// with dp_replicate > 1 the replicate group all-reduces the reduce-scattered shards (HSDP).
//
// The MoE mesh of a pp stage (MODELS.md §5.1): the stage's dp_replicate x dp_shard x cp ranks,
// taken in rank order as a local index i, re-factored as (ep_shard, ep) with ep fastest: ep index
// i % ep, ep_shard index i / ep. An ep group is ep consecutive ranks; an ep_shard group holds
// the ranks with the same ep index (they FSDP-shard one EP rank's experts).
//
// The planner lays out every axis; the runtime does not run pp or cp > 1 yet (require_runnable
// says so).
#pragma once
#include <string>
#include <vector>

#include "kernels/rank_group.hpp"
#include "graph/config.hpp"

namespace atl {

struct RankCoord {
  int pp = 0, dp_replicate = 0, dp_shard = 0, cp = 0;
  bool operator==(const RankCoord&) const = default;
};

class Mesh {
 public:
  Mesh() = default;  // one rank
  // Validates the sizes: non-positive ones, and an ep that does not divide dp_replicate x
  // dp_shard x cp, throw ConfigError naming `source_file` and topology.mesh.<axis>.
  explicit Mesh(const MeshConfig& config, std::string source_file = "");
  // The axes the runtime cannot run yet (pp, cp > 1) throw ConfigError naming the axis.
  void require_runnable() const;

  const MeshConfig& config() const { return config_; }
  const std::string& source_file() const { return source_file_; }
  int pp() const { return pp_; }
  int dp_replicate() const { return dp_replicate_; }
  int dp_shard() const { return dp_shard_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }

  int world_size() const { return pp_ * dp_replicate_ * dp_shard_ * cp_; }
  int dp_size() const { return dp_replicate_ * dp_shard_; }
  int shard_group_size() const { return dp_shard_ * cp_; }  // FSDP shard count of every unit
  int stage_size() const { return dp_replicate_ * dp_shard_ * cp_; }  // ranks of one pp stage
  int ep_shard() const { return stage_size() / ep_; }

  RankCoord coord(int rank) const;    // throws std::out_of_range outside [0, world)
  int rank_of(RankCoord coord) const;  // throws std::out_of_range for a coordinate off the mesh
  // Which block of the global batch's micro-batches the rank owns: dp_replicate_idx * dp_shard +
  // dp_shard_idx (cp ranks of one dp index see the same rows).
  int dp_index(int rank) const;

  // The data-parallel indices of `ranks`, increasing and distinct (a process's blocks of the batch).
  std::vector<int> dp_indices(const std::vector<int>& ranks) const;

  // Axis "dp_shard": the ranks of this rank's (pp, dp_replicate) slice, dp_shard then cp
  // increasing (cp fastest), i.e. increasing rank order.
  Group shard_group(int rank) const;
  // Axis "dp_replicate": the ranks that share this rank's (pp, dp_shard, cp), dp_replicate increasing.
  Group replicate_group(int rank) const;
  // Axis "cp": the ranks of this rank's (pp, dp_replicate, dp_shard), cp increasing.
  Group cp_group(int rank) const;
  // Axis "pp": the ranks of this rank's (dp_replicate, dp_shard, cp), one per stage, stage order.
  Group pp_group(int rank) const;
  // Axis "ep": the ep ranks of this rank's ep_shard index in its stage, ep index increasing.
  Group ep_group(int rank) const;
  // Axis "ep_shard": the ranks of this rank's stage with its ep index, ep_shard index increasing.
  Group ep_shard_group(int rank) const;
  // Axis "world": every rank, in rank order (the step's report).
  Group world_group() const;
  // Every distinct group of each axis, in order of their first rank: dp_shard and dp_replicate
  // always (size-1 groups included: a unit always names its groups), then cp, pp, ep and
  // ep_shard for the axes that are larger than 1.
  std::vector<Group> all_groups() const;

  // A launcher that starts `ranks` ranks must match the mesh; ConfigError on topology.mesh otherwise.
  void check_world_size(int ranks) const;

  std::string describe() const;  // "pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 (ep 1) = 4 ranks"

 private:
  Group along_axis(int rank, const char* axis, int RankCoord::*field, int size) const;

  MeshConfig config_;
  std::string source_file_;
  int pp_ = 1, dp_replicate_ = 1, dp_shard_ = 1, cp_ = 1, ep_ = 1;
};

}  // namespace atl

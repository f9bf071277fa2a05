#include "graph/plan/mesh.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "graph/config_reader.hpp"

namespace atl {

namespace {

// Far beyond any machine; keeps rank arithmetic in int.
constexpr std::int64_t max_world_size = 1 << 24;

}  // namespace

Mesh::Mesh(const MeshConfig& config, std::string source_file) : config_(config), source_file_(std::move(source_file)) {
  const std::pair<const char*, std::int64_t> axes[] = {{"pp", config.pp},
                                                       {"dp_replicate", config.dp_replicate},
                                                       {"dp_shard", config.dp_shard},
                                                       {"cp", config.cp},
                                                       {"ep", config.ep}};
  for (const auto& [axis, size] : axes) {
    if (size < 1) {
      throw ConfigError(source_file_, std::string("topology.mesh.") + axis,
                        fmt::format("expected a positive integer, got {}", size));
    }
    if (size > max_world_size) {
      throw ConfigError(source_file_, std::string("topology.mesh.") + axis,
                        fmt::format("expected at most {} ranks, got {}", max_world_size, size));
    }
  }
  // Multiplied axis by axis: four axes of up to 2^24 would overflow the product itself.
  std::int64_t world = 1;
  for (const std::int64_t size : {config.pp, config.dp_replicate, config.dp_shard, config.cp}) {
    world *= size;
    if (world > max_world_size) {
      throw ConfigError(source_file_, "topology.mesh",
                        fmt::format("expected at most {} ranks in all (pp x dp_replicate x dp_shard x cp), got more",
                                    max_world_size));
    }
  }
  pp_ = static_cast<int>(config.pp);
  dp_replicate_ = static_cast<int>(config.dp_replicate);
  dp_shard_ = static_cast<int>(config.dp_shard);
  cp_ = static_cast<int>(config.cp);
  ep_ = static_cast<int>(config.ep);
  if (stage_size() % ep_ != 0) {
    throw ConfigError(source_file_, "topology.mesh.ep",
                      fmt::format("expected a divisor of dp_replicate x dp_shard x cp = {} (ep re-factors the ranks "
                                  "of a pipeline stage as ep_shard x ep), got {}",
                                  stage_size(), ep_));
  }
}

void Mesh::require_runnable() const {
  struct Unimplemented {
    const char* axis;
    const char* feature;
    int size;
  };
  const Unimplemented unimplemented[] = {{"pp", "pipeline parallelism", pp_},
                                         {"cp", "context parallelism", cp_}};
  for (const auto& [axis, feature, size] : unimplemented) {
    if (size != 1) {
      throw ConfigError(source_file_, std::string("topology.mesh.") + axis,
                        fmt::format("{} is not implemented yet (issue: pipeline/context parallelism); "
                                    "expected 1, got {} (atoll-plan prints the layout)",
                                    feature, size));
    }
  }
}

RankCoord Mesh::coord(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw std::out_of_range(fmt::format("rank {} is outside the mesh {}", rank, describe()));
  }
  RankCoord c;
  c.cp = rank % cp_;
  rank /= cp_;
  c.dp_shard = rank % dp_shard_;
  rank /= dp_shard_;
  c.dp_replicate = rank % dp_replicate_;
  c.pp = rank / dp_replicate_;
  return c;
}

int Mesh::rank_of(RankCoord c) const {
  if (c.pp < 0 || c.pp >= pp_ || c.dp_replicate < 0 || c.dp_replicate >= dp_replicate_ || c.dp_shard < 0 ||
      c.dp_shard >= dp_shard_ || c.cp < 0 || c.cp >= cp_) {
    throw std::out_of_range(fmt::format("coordinate (pp {}, dp_replicate {}, dp_shard {}, cp {}) is outside the mesh {}",
                                        c.pp, c.dp_replicate, c.dp_shard, c.cp, describe()));
  }
  return ((c.pp * dp_replicate_ + c.dp_replicate) * dp_shard_ + c.dp_shard) * cp_ + c.cp;
}

int Mesh::dp_index(int rank) const {
  const RankCoord c = coord(rank);
  return c.dp_replicate * dp_shard_ + c.dp_shard;
}

// The ranks that differ from `rank` only in one coordinate, that coordinate increasing.
Group Mesh::along_axis(int rank, const char* axis, int RankCoord::*field, int size) const {
  RankCoord c = coord(rank);
  Group g{axis, {}};
  for (int i = 0; i < size; ++i) {
    c.*field = i;
    g.ranks.push_back(rank_of(c));
  }
  return g;
}

std::vector<int> Mesh::dp_indices(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int rank : ranks) out.push_back(dp_index(rank));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Group Mesh::shard_group(int rank) const {
  RankCoord c = coord(rank);
  Group g{"dp_shard", {}};
  for (int s = 0; s < dp_shard_; ++s) {
    for (int k = 0; k < cp_; ++k) {
      c.dp_shard = s;
      c.cp = k;
      g.ranks.push_back(rank_of(c));
    }
  }
  return g;
}

Group Mesh::replicate_group(int rank) const { return along_axis(rank, "dp_replicate", &RankCoord::dp_replicate, dp_replicate_); }

Group Mesh::cp_group(int rank) const { return along_axis(rank, "cp", &RankCoord::cp, cp_); }

Group Mesh::pp_group(int rank) const { return along_axis(rank, "pp", &RankCoord::pp, pp_); }

Group Mesh::ep_group(int rank) const {
  const int first_of_stage = coord(rank).pp * stage_size();
  const int local = rank - first_of_stage;
  Group g{"ep", {}};
  for (int e = 0; e < ep_; ++e) g.ranks.push_back(first_of_stage + local / ep_ * ep_ + e);
  return g;
}

Group Mesh::ep_shard_group(int rank) const {
  const int first_of_stage = coord(rank).pp * stage_size();
  const int local = rank - first_of_stage;
  Group g{"ep_shard", {}};
  for (int s = 0; s < ep_shard(); ++s) g.ranks.push_back(first_of_stage + s * ep_ + local % ep_);
  return g;
}

Group Mesh::world_group() const {
  Group g{"world", {}};
  for (int r = 0; r < world_size(); ++r) g.ranks.push_back(r);
  return g;
}

std::vector<Group> Mesh::all_groups() const {
  using GroupOf = Group (Mesh::*)(int) const;
  struct Axis {
    GroupOf group_of;
    bool listed;
  };
  const Axis axes[] = {{&Mesh::shard_group, true}, {&Mesh::replicate_group, true}, {&Mesh::cp_group, cp_ > 1},
                       {&Mesh::pp_group, pp_ > 1},  {&Mesh::ep_group, ep_ > 1},       {&Mesh::ep_shard_group, ep_ > 1}};
  // An axis's groups partition the world: each is made once, from its first rank (linear in the
  // world size; a search of the groups made so far was quadratic, minutes for 10^5 ranks).
  std::vector<Group> out;
  for (const auto& axis : axes) {
    if (!axis.listed) continue;
    std::vector<bool> placed(static_cast<std::size_t>(world_size()), false);
    for (int r = 0; r < world_size(); ++r) {
      if (placed[static_cast<std::size_t>(r)]) continue;
      Group g = (this->*axis.group_of)(r);
      for (int member : g.ranks) placed[static_cast<std::size_t>(member)] = true;
      out.push_back(std::move(g));
    }
  }
  return out;
}

void Mesh::check_world_size(int ranks) const {
  if (ranks != world_size()) {
    throw ConfigError(source_file_, "topology.mesh",
                      fmt::format("the mesh needs pp x dp_replicate x dp_shard x cp = {} x {} x {} x {} = {} ranks, "
                                  "but the launcher started {}",
                                  pp_, dp_replicate_, dp_shard_, cp_, world_size(), ranks));
  }
}

std::string Mesh::describe() const {
  return fmt::format("pp {} x dp_replicate {} x dp_shard {} x cp {} (ep {}) = {} ranks", pp_, dp_replicate_, dp_shard_,
                     cp_, ep_, world_size());
}

}  // namespace atl

#include "graph/plan/mesh.hpp"

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
  // The planner lays these axes out, but no runtime runs them yet.
  struct Unimplemented {
    const char* axis;
    const char* feature;
    std::int64_t size;
  };
  const Unimplemented unimplemented[] = {{"pp", "pipeline parallelism", config.pp},
                                         {"cp", "context parallelism", config.cp},
                                         {"ep", "expert parallelism", config.ep}};
  for (const auto& [axis, feature, size] : unimplemented) {
    if (size != 1) {
      throw ConfigError(source_file_, std::string("topology.mesh.") + axis,
                        fmt::format("{} is not implemented yet (issue: expert/pipeline/context parallelism); "
                                    "expected 1, got {}",
                                    feature, size));
    }
  }
  if (config.world_size() > max_world_size) {
    throw ConfigError(source_file_, "topology.mesh",
                      fmt::format("expected at most {} ranks in all, got {}", max_world_size, config.world_size()));
  }
  pp_ = static_cast<int>(config.pp);
  dp_replicate_ = static_cast<int>(config.dp_replicate);
  dp_shard_ = static_cast<int>(config.dp_shard);
  cp_ = static_cast<int>(config.cp);
  ep_ = static_cast<int>(config.ep);
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

Group Mesh::replicate_group(int rank) const {
  RankCoord c = coord(rank);
  Group g{"dp_replicate", {}};
  for (int r = 0; r < dp_replicate_; ++r) {
    c.dp_replicate = r;
    g.ranks.push_back(rank_of(c));
  }
  return g;
}

std::vector<Group> Mesh::all_groups() const {
  std::vector<Group> shard, replicate;
  auto add = [](std::vector<Group>& list, Group g) {
    for (const auto& existing : list) {
      if (existing == g) return;
    }
    list.push_back(std::move(g));
  };
  for (int r = 0; r < world_size(); ++r) {
    add(shard, shard_group(r));
    add(replicate, replicate_group(r));
  }
  shard.insert(shard.end(), replicate.begin(), replicate.end());
  return shard;
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

// A process group: the global ranks that take part in a collective, in group order. It lives
// below comm/ and graph/: the plan names groups, comm/ runs collectives on them.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace atl {

struct Group {
  std::string axis;        // "dp_shard", "dp_replicate", "ep", "pp", "cp", "world"
  std::vector<int> ranks;  // global ranks in group order (index 0 first)

  int size() const { return static_cast<int>(ranks.size()); }
  // Position of a global rank inside the group; throws if it is not a member.
  int index_of(int rank) const {
    auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " is not in group " + describe());
    }
    return static_cast<int>(it - ranks.begin());
  }
  std::string describe() const {
    std::string s = axis;
    s.append("[");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (i) s.append(",");
      s.append(std::to_string(ranks[i]));
    }
    s.append("]");
    return s;
  }
  bool operator==(const Group&) const = default;
};

}  // namespace atl

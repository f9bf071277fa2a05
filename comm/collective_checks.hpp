// The argument rules of every collective (communicator.hpp states them), checked the same way by
// every backend before anything is posted: a call one backend accepts, every backend accepts, and
// a refusal names the backend, group, rank, tag and what was expected (std::invalid_argument).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rank_group.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// "[1,0,3]": all_to_all_v counts in messages.
std::string counts_text(const std::vector<std::int64_t>& counts);

class CollectiveChecks {
 public:
  // backend: "sim", "ucx", ...; rank: this member's global rank in `group`.
  CollectiveChecks(std::string backend, const Group& group, int rank);

  void all_gather(const Tensor& send, const Tensor& recv, const std::string& tag) const;
  void reduce_scatter(const Tensor& send, const Tensor& recv, const std::string& tag) const;
  void all_reduce(const Tensor& inout, const std::string& tag) const;
  void broadcast(const Tensor& inout, int root, const std::string& tag) const;
  void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts, const Tensor& recv,
                    const std::vector<std::int64_t>& recv_counts, const std::string& tag) const;
  // send and recv: `peer` is another member's index.
  void point_to_point(const char* op, const Tensor& tensor, int peer, const std::string& tag) const;

 private:
  [[noreturn]] void fail(const char* op, const std::string& tag, const std::string& what) const;
  void cpu_tensor(const char* op, const std::string& tag, const char* name, const Tensor& t) const;
  void reducible(const char* op, const std::string& tag, const Tensor& t) const;
  void counts(const std::string& tag, const char* which, const std::vector<std::int64_t>& c, const Tensor& t) const;

  std::string backend_;
  std::string group_;  // Group::describe()
  int size_, rank_, member_;
};

}  // namespace atl

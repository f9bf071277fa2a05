#include "comm/collective_checks.hpp"

#include <cstddef>
#include <stdexcept>
#include <utility>

namespace atl {

namespace {

// Whether byte ranges [a, a + a_bytes) and [b, b + b_bytes) share no byte.
bool apart(const Tensor& a, const Tensor& b) {
  const auto* x = static_cast<const std::byte*>(a.raw());
  const auto* y = static_cast<const std::byte*>(b.raw());
  return x + a.bytes() <= y || y + b.bytes() <= x;
}

// Whether `part` is exactly block `index` of `whole` (blocks of part's size).
bool is_block(const Tensor& part, const Tensor& whole, int index) {
  return part.raw() == static_cast<const std::byte*>(whole.raw()) + static_cast<std::size_t>(index) * part.bytes();
}

}  // namespace

std::string counts_text(const std::vector<std::int64_t>& counts) {
  std::string s = "[";
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (i) s.append(",");
    s.append(std::to_string(counts[i]));  // append, not "a" + b: GCC 12 -O3 warns falsely (-Wrestrict)
  }
  s.append("]");
  return s;
}

CollectiveChecks::CollectiveChecks(std::string backend, const Group& group, int rank)
    : backend_(std::move(backend)), group_(group.describe()), size_(group.size()), rank_(rank),
      member_(group.index_of(rank)) {}

void CollectiveChecks::fail(const char* op, const std::string& tag, const std::string& what) const {
  throw std::invalid_argument(backend_ + " comm " + op + " in group " + group_ + " (rank " + std::to_string(rank_) +
                              ", tag '" + tag + "'): " + what);
}

void CollectiveChecks::cpu_tensor(const char* op, const std::string& tag, const char* name, const Tensor& t) const {
  if (!t.defined()) fail(op, tag, std::string(name) + " is undefined");
  if (t.device() != Device::cpu) fail(op, tag, std::string(name) + " " + t.describe() + " must be a CPU tensor");
}

void CollectiveChecks::reducible(const char* op, const std::string& tag, const Tensor& t) const {
  if (t.dtype() != DType::f32) fail(op, tag, "only f32 reductions are supported, got " + t.describe());
}

void CollectiveChecks::all_gather(const Tensor& send, const Tensor& recv, const std::string& tag) const {
  cpu_tensor("all_gather", tag, "send", send);
  cpu_tensor("all_gather", tag, "recv", recv);
  if (send.dtype() != recv.dtype() || recv.numel() != size_ * send.numel()) {
    fail("all_gather", tag, "recv must have send's dtype and group size (" + std::to_string(size_) +
                                ") times its elements; got send " + send.describe() + ", recv " + recv.describe());
  }
  // Blocks arrive in recv while send still travels: send may be recv's own block (in place) but
  // no other part of it.
  if (!apart(send, recv) && !is_block(send, recv, member_)) {
    fail("all_gather", tag, "send must lie apart from recv, or be exactly recv's block " + std::to_string(member_) +
                                " (this member's)");
  }
}

void CollectiveChecks::reduce_scatter(const Tensor& send, const Tensor& recv, const std::string& tag) const {
  cpu_tensor("reduce_scatter", tag, "send", send);
  cpu_tensor("reduce_scatter", tag, "recv", recv);
  reducible("reduce_scatter", tag, send);
  if (recv.dtype() != send.dtype() || send.numel() != size_ * recv.numel()) {
    fail("reduce_scatter", tag, "send must have recv's dtype and group size (" + std::to_string(size_) +
                                    ") times its elements; got send " + send.describe() + ", recv " +
                                    recv.describe());
  }
  // Sums land in recv while the other members still read send's blocks: recv may be send's own
  // block (in place) but no other part of it.
  if (!apart(send, recv) && !is_block(recv, send, member_)) {
    fail("reduce_scatter", tag, "recv must lie apart from send, or be exactly send's block " +
                                    std::to_string(member_) + " (this member's)");
  }
}

void CollectiveChecks::all_reduce(const Tensor& inout, const std::string& tag) const {
  cpu_tensor("all_reduce", tag, "inout", inout);
  reducible("all_reduce", tag, inout);
}

void CollectiveChecks::broadcast(const Tensor& inout, int root, const std::string& tag) const {
  cpu_tensor("broadcast", tag, "inout", inout);
  if (root < 0 || root >= size_) {
    fail("broadcast", tag, "root " + std::to_string(root) + " is not a member index in [0, " +
                               std::to_string(size_) + ")");
  }
}

void CollectiveChecks::counts(const std::string& tag, const char* which, const std::vector<std::int64_t>& c,
                              const Tensor& t) const {
  if (static_cast<int>(c.size()) != size_) {
    fail("all_to_all_v", tag, std::string(which) + "_counts has " + std::to_string(c.size()) +
                                  " entries, expected one per member (" + std::to_string(size_) + ")");
  }
  std::int64_t total = 0;
  for (std::int64_t n : c) {
    if (n < 0) fail("all_to_all_v", tag, std::string(which) + "_counts " + counts_text(c) + " is negative");
    total += n;
  }
  if (total != t.numel()) {
    fail("all_to_all_v", tag, std::string(which) + "_counts " + counts_text(c) + " sum to " + std::to_string(total) +
                                  " but " + which + " is " + t.describe());
  }
}

void CollectiveChecks::all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts,
                                    const Tensor& recv, const std::vector<std::int64_t>& recv_counts,
                                    const std::string& tag) const {
  cpu_tensor("all_to_all_v", tag, "send", send);
  cpu_tensor("all_to_all_v", tag, "recv", recv);
  if (send.dtype() != recv.dtype()) {
    fail("all_to_all_v", tag, "send " + send.describe() + " and recv " + recv.describe() + " differ in dtype");
  }
  counts(tag, "send", send_counts, send);
  counts(tag, "recv", recv_counts, recv);
  if (!apart(send, recv)) fail("all_to_all_v", tag, "send and recv must not overlap (blocks arrive while others leave)");
  const auto self = static_cast<std::size_t>(member_);
  if (send_counts[self] != recv_counts[self]) {  // its own block would overrun, or leave a gap in, recv
    fail("all_to_all_v", tag, "sends " + std::to_string(send_counts[self]) +
                                  " elements to itself but receives " + std::to_string(recv_counts[self]) +
                                  " (expected as many elements to itself as from itself)");
  }
}

void CollectiveChecks::point_to_point(const char* op, const Tensor& tensor, int peer, const std::string& tag) const {
  cpu_tensor(op, tag, "tensor", tensor);
  if (peer < 0 || peer >= size_ || peer == member_) {
    fail(op, tag, "peer " + std::to_string(peer) + " is not another member's index in [0, " +
                      std::to_string(size_) + ") (this member is " + std::to_string(member_) + ")");
  }
}

}  // namespace atl

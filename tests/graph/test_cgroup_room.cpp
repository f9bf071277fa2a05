// The memory preflight's cgroup room: this process's own cgroup (from /proc/self/cgroup) and its
// ancestors, v2 or v1; it read only the v2 mount root, so a job limited by Slurm, systemd-run or a
// v1 host was sized by the machine's free memory and met the OOM killer instead of a refusal.
#include <catch2/catch.hpp>

#include "graph/training/preflight.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using namespace atl::checkpoint_testing;

namespace {

void write_cgroup(const fs::path& dir, const char* limit_file, const std::string& limit, const char* usage_file,
                  const std::string& usage) {
  fs::create_directories(dir);
  write_bytes(dir / limit_file, limit + "\n");
  write_bytes(dir / usage_file, usage + "\n");
}

}  // namespace

TEST_CASE("cgroup room: v2, the process's own cgroup and the tightest of its ancestors", "[preflight]") {
  TempDir tmp;
  const fs::path mount = tmp.path / "cgroup";
  fs::create_directories(mount);
  write_bytes(mount / "cgroup.controllers", "cpu memory\n");
  write_cgroup(mount, "memory.max", "max", "memory.current", "5000000");
  write_cgroup(mount / "job", "memory.max", "3000000", "memory.current", "1000000");  // room 2,000,000
  write_cgroup(mount / "job" / "step", "memory.max", "max", "memory.current", "900000");
  write_bytes(tmp.path / "self", "0::/job/step\n");
  CHECK(cgroup_memory_room(mount, tmp.path / "self") == Approx(2000000.0));
  // A tighter limit of its own wins.
  write_cgroup(mount / "job" / "step", "memory.max", "1500000", "memory.current", "900000");
  CHECK(cgroup_memory_room(mount, tmp.path / "self") == Approx(600000.0));
  // No limit anywhere: none.
  write_bytes(tmp.path / "root", "0::/\n");
  CHECK_FALSE(cgroup_memory_room(mount, tmp.path / "root").has_value());
  // A path not under the mount (a container's own cgroup mounted as the root): the root's limit.
  write_cgroup(mount, "memory.max", "8000000", "memory.current", "5000000");
  write_bytes(tmp.path / "elsewhere", "0::/docker/abc\n");
  CHECK(cgroup_memory_room(mount, tmp.path / "elsewhere") == Approx(3000000.0));
}

TEST_CASE("cgroup room: v1, the memory controller's line, unlimited read as no limit", "[preflight]") {
  TempDir tmp;
  const fs::path mount = tmp.path / "cgroup";
  const char* limit = "memory.limit_in_bytes";
  const char* usage = "memory.usage_in_bytes";
  write_cgroup(mount / "memory", limit, "9223372036854771712", usage, "7000000");
  write_cgroup(mount / "memory" / "slurm" / "job_7", limit, "4000000", usage, "2500000");
  write_bytes(tmp.path / "self", "9:cpu,cpuacct:/other\n4:memory:/slurm/job_7\n0::/\n");
  CHECK(cgroup_memory_room(mount, tmp.path / "self") == Approx(1500000.0));
  write_bytes(tmp.path / "root", "4:memory:/\n");
  CHECK_FALSE(cgroup_memory_room(mount, tmp.path / "root").has_value());
  // Usage over the limit leaves no room, not a negative one.
  write_cgroup(mount / "memory" / "slurm" / "job_7", limit, "4000000", usage, "4100000");
  CHECK(cgroup_memory_room(mount, tmp.path / "self") == 0.0);
}

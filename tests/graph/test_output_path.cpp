// Output paths: node_trace_path, the --trace file each node of a multi-process job writes.
#include <catch2/catch.hpp>

#include "graph/training/output_path.hpp"

namespace atl {

TEST_CASE("node_trace_path: node 0 keeps the path, node N adds .nodeN before the extension", "[run]") {
  CHECK(node_trace_path("out/trace.json", 0) == "out/trace.json");
  CHECK(node_trace_path("out/trace.json", 1) == "out/trace.node1.json");
  CHECK(node_trace_path("trace.json", 12) == "trace.node12.json");
  CHECK(node_trace_path("/abs/dir/trace", 3) == "/abs/dir/trace.node3");  // no extension: appended
  CHECK(node_trace_path("a.b/trace.tar.json", 2) == "a.b/trace.tar.node2.json");  // the last extension only
}

}  // namespace atl

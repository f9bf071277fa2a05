// Output paths: node_trace_path, the --trace file each node of a multi-process job writes, and
// the inputs an output file must not replace.
#include <catch2/catch.hpp>

#include "graph/config_reader.hpp"
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

namespace atl {

TEST_CASE("check_replaces_no_input: an output that is an input file, or inside an input folder, is refused", "[run]") {
  const std::vector<RunInput> inputs = {{"cfg/run.yaml", "the config file", false},
                                        {"", "an unset input", false},
                                        {"ckpt/step-00000002", "the checkpoint.load directory", true}};
  auto error_of = [&](const std::string& out) {
    try {
      check_replaces_no_input(out, inputs, "cfg/run.yaml", "--trace");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error_of("cfg/../cfg/run.yaml") ==
        "cfg/run.yaml: --trace: 'cfg/../cfg/run.yaml' is the config file; expected another file");
  CHECK(error_of("ckpt/step-00000002/model.safetensors") ==
        "cfg/run.yaml: --trace: 'ckpt/step-00000002/model.safetensors' is inside the checkpoint.load directory "
        "ckpt/step-00000002; expected a file outside it");
  CHECK(error_of("cfg/run.yaml.trace.json") == "accepted");
  CHECK(error_of("ckpt/step-00000002.trace.json") == "accepted");  // beside the folder, not in it
  CHECK(error_of("trace.json") == "accepted");
}

}  // namespace atl

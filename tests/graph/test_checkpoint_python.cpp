// Interoperability with Hugging Face's Python `safetensors` package: files atoll writes load there
// with the right values, and files it writes load here. Skipped with a warning (not failed) when no
// interpreter has the package (scripts/setup.sh installs it into .venv-tools).
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "graph/checkpoint/safetensors.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using namespace atl::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string quoted(const fs::path& p) { return std::string("'").append(p.string()).append("'"); }

// The first of .venv-tools' python and /usr/bin/python3 that can import safetensors.numpy; when
// none can, `why` says what was tried.
std::optional<fs::path> python_with_safetensors(std::string& why) {
  std::vector<fs::path> candidates;
  if (const char* source = std::getenv("ATOLL_SOURCE_DIR")) {
    fs::path venv = fs::path(source) / ".venv-tools" / "bin" / "python";
    if (fs::exists(venv)) candidates.push_back(venv);
    else why += venv.string() + " does not exist; ";
  } else {
    why += "ATOLL_SOURCE_DIR is not set (no .venv-tools to look in); ";
  }
  if (fs::exists("/usr/bin/python3")) candidates.push_back("/usr/bin/python3");
  else why += "/usr/bin/python3 does not exist; ";
  for (const auto& python : candidates) {
    CommandResult r = run_command(quoted(python) + " -c 'import numpy, safetensors.numpy'");
    if (r.exit_code == 0) return python;
    why += python.string() + " cannot import safetensors.numpy and numpy; ";
  }
  why += "run scripts/setup.sh to create .venv-tools";
  return std::nullopt;
}

}  // namespace

TEST_CASE("safetensors: files load in the Python safetensors package and back", "[checkpoint][safetensors][python]") {
  std::string why;
  std::optional<fs::path> python = python_with_safetensors(why);
  if (!python) {
    if (std::getenv("ATOLL_REQUIRE_PYTHON_TESTS")) FAIL("ATOLL_REQUIRE_PYTHON_TESTS is set, but " << why);
    WARN("Python interoperability test skipped: " << why);
    return;
  }
  TempDir tmp;

  // atoll -> Python: fp32 and i64 values that are exact in both languages.
  TensorMap tensors;
  std::vector<float> weights;
  for (int i = 0; i < 6; ++i) weights.push_back(0.5f * static_cast<float>(i) - 1.0f);
  tensors.insert("layer.weight", Tensor::from_floats({2, 3}, weights));
  Tensor positions = Tensor::empty({4}, DType::i64);
  const std::int64_t position_values[4] = {std::int64_t{1} << 40, -3, 0, std::int64_t{1} << 62};
  for (int i = 0; i < 4; ++i) positions.data<std::int64_t>()[i] = position_values[i];
  tensors.insert("positions", positions);
  const fs::path from_atoll = tmp.path / "from_atoll.safetensors";
  write_safetensors(from_atoll, tensors);

  const fs::path check_script = tmp.path / "check.py";
  write_bytes(check_script, R"(import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
d = load_file(sys.argv[1])
assert sorted(d) == ["layer.weight", "positions"], sorted(d)
w = d["layer.weight"]
assert w.dtype == np.float32 and w.shape == (2, 3), (w.dtype, w.shape)
assert (w == np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1).all(), w
p = d["positions"]
assert p.dtype == np.int64 and p.shape == (4,), (p.dtype, p.shape)
assert p.tolist() == [2**40, -3, 0, 2**62], p.tolist()
with safe_open(sys.argv[1], framework="np") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
print("ok")
)");
  CommandResult checked = run_command(quoted(*python) + " " + quoted(check_script) + " " + quoted(from_atoll));
  INFO(checked.output);
  CHECK(checked.exit_code == 0);
  CHECK_THAT(checked.output, Contains("ok"));

  // Every dtype, incl. bf16 (which numpy lacks), through the package's own parser: same bytes.
  TensorMap mixed;
  mixed.insert("w.bf16", random_tensor({3, 5}, DType::bf16, 11));
  mixed.insert("m.bool", random_tensor({7}, DType::boolean, 12));
  mixed.insert("i.i32", random_tensor({3}, DType::i32, 13));
  mixed.insert("p.i64", random_tensor({2}, DType::i64, 14));
  mixed.insert("s.f32", random_tensor({}, DType::f32, 15));
  mixed.insert("e.empty", Tensor::empty({0, 2}, DType::f32));
  const fs::path mixed_file = tmp.path / "mixed.safetensors";
  write_safetensors(mixed_file, mixed);
  const fs::path dump_script = tmp.path / "dump.py";
  write_bytes(dump_script, R"(import sys
from safetensors import deserialize
for name, info in sorted(deserialize(open(sys.argv[1], "rb").read())):
    print(name, info["dtype"], list(info["shape"]), bytes(info["data"]).hex())
)");
  CommandResult dumped = run_command(quoted(*python) + " " + quoted(dump_script) + " " + quoted(mixed_file));
  INFO(dumped.output);
  REQUIRE(dumped.exit_code == 0);
  std::string expected;
  for (const auto& name : {"e.empty", "i.i32", "m.bool", "p.i64", "s.f32", "w.bf16"}) {
    const Tensor& t = mixed.at(name);
    std::string shape = "[";
    for (std::size_t d = 0; d < t.shape().size(); ++d) shape += (d ? ", " : "") + std::to_string(t.shape()[d]);
    std::string hex;
    const auto* bytes = static_cast<const unsigned char*>(t.raw());
    for (std::size_t i = 0; i < t.bytes(); ++i) {
      const char* digits = "0123456789abcdef";
      hex += digits[bytes[i] >> 4];
      hex += digits[bytes[i] & 15];
    }
    expected += std::string(name) + " " + std::string(safetensors_dtype_name(t.dtype())) + " " + shape + "] " + hex + "\n";
  }
  CHECK(dumped.output == expected);

  // Python -> atoll: f32, i64 and bool written by the package read here with the same values.
  const fs::path from_python = tmp.path / "from_python.safetensors";
  const fs::path write_script = tmp.path / "write.py";
  write_bytes(write_script, R"(import sys
import numpy as np
from safetensors.numpy import save_file
save_file({"b": np.arange(5, dtype=np.float32) * 0.25, "a": np.array([7, -(2**40)], dtype=np.int64),
           "m": np.array([True, False, True])}, sys.argv[1], metadata={"format": "pt"})
)");
  CommandResult written = run_command(quoted(*python) + " " + quoted(write_script) + " " + quoted(from_python));
  INFO(written.output);
  REQUIRE(written.exit_code == 0);
  SafetensorsContents back = read_safetensors(from_python);
  CHECK(back.metadata.at("format") == "pt");
  const Tensor& b = back.tensors.at("b");
  REQUIRE(b.shape() == Shape{5});
  for (int i = 0; i < 5; ++i) CHECK(b.data<float>()[i] == 0.25f * static_cast<float>(i));
  const Tensor& a = back.tensors.at("a");
  REQUIRE(a.dtype() == DType::i64);
  CHECK(a.data<std::int64_t>()[0] == 7);
  CHECK(a.data<std::int64_t>()[1] == -(std::int64_t{1} << 40));
  const Tensor& m = back.tensors.at("m");
  REQUIRE(m.dtype() == DType::boolean);
  CHECK((m.data<bool>()[0] && !m.data<bool>()[1] && m.data<bool>()[2]));
}

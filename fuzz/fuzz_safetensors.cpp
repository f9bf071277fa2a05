// libFuzzer target: the safetensors reader (header JSON, dtypes, shapes, offsets) on arbitrary
// bytes. Every input must either load or be refused with CheckpointError; anything else (a crash,
// a sanitizer report, another exception type) is a finding.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz/fuzz_support.hpp"
#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path file = atl::fuzz::write_input("model.safetensors", data, size);
  try {
    const atl::SafetensorsContents contents = atl::read_safetensors(file);
    for (const auto& name : contents.tensors.names()) (void)contents.tensors.at(name).bytes();
  } catch (const atl::CheckpointError&) {
  }
  return 0;
}

// libFuzzer target: the pre-tokenized file reader (uint16 ids, an end-of-document id, packing into
// rows) on arbitrary bytes. Every input must be read or be refused with DataError.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_support.hpp"
#include "graph/data/file_sources.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = atl::fuzz::write_input("tokens.u16", data, size);
  try {
    atl::TokenFileSource source(file.string(), 250, 0, std::int64_t{7}, true);
    for (int i = 0; i < 3; ++i) (void)source.next(2, 16);
    source.restore(source.cursor());
  } catch (const atl::DataError&) {
  }
  return 0;
}

// A data file truncated while it is memory-mapped turns the next read of the lost pages into
// SIGBUS (so does an I/O error of its storage): by default a crash with no word about the file
// (under UCX, its backtrace). While a mapping is registered here, a fault inside it prints which
// file and exits 1 (the environment, not the input: a restart's resume then refuses a changed file
// by its content hash). Any other SIGBUS goes to the handler that was there before. (A file
// rewritten in place at the same size faults nothing: the mapping shows the new bytes, and only
// the next resume's hash check finds the change.)
#pragma once
#include <cstddef>
#include <string>

namespace atl {

// Registers [base, base + size) as the mapping of `path`; returns a slot for unguard_mapping, or -1
// when every slot is taken (the mapping is then unguarded). Installs the handler on first use.
int guard_mapping(const unsigned char* base, std::size_t size, const std::string& path);
void unguard_mapping(int slot);

}  // namespace atl

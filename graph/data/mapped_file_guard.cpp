#include "graph/data/mapped_file_guard.hpp"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace atl {

namespace {

struct Slot {
  std::atomic<const unsigned char*> base{nullptr};
  std::size_t size = 0;
  char message[PATH_MAX + 256] = {};  // the longest path and the text around it
  std::size_t length = 0;
};

constexpr int kSlots = 32;
Slot g_slots[kSlots];
std::mutex g_registration;  // registration only; the handler reads the atomics
struct sigaction g_previous {};
bool g_installed = false;

// Async-signal-safe: atomics, write(2), _exit(2) and sigaction(2) only.
extern "C" void on_sigbus(int, siginfo_t* info, void*) {
  if (!info || info->si_code <= 0) {  // sent (kill, raise), not a fault: the previous disposition takes it
    ::sigaction(SIGBUS, &g_previous, nullptr);
    ::raise(SIGBUS);  // pending until this handler returns
    return;
  }
  const auto* address = static_cast<const unsigned char*>(info->si_addr);
  for (Slot& slot : g_slots) {
    const unsigned char* base = slot.base.load(std::memory_order_acquire);
    if (base && address >= base && address < base + slot.size) {
      (void)!::write(STDERR_FILENO, slot.message, slot.length);
      ::_exit(1);
    }
  }
  // Not a data file's page: the previous disposition handles the fault when it repeats.
  ::sigaction(SIGBUS, &g_previous, nullptr);
}

}  // namespace

int guard_mapping(const unsigned char* base, std::size_t size, const std::string& path) {
  if (!base || size == 0) return -1;
  const std::lock_guard<std::mutex> lock(g_registration);
  if (!g_installed) {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGBUS, &action, &g_previous) != 0) return -1;
    g_installed = true;
  }
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = g_slots[i];
    if (slot.base.load(std::memory_order_relaxed)) continue;
    const std::string text = "atoll: data file " + path +
                             " could not be read: it was truncated while the run read it (or its storage failed); "
                             "restore it and resume (exit 1)\n";
    slot.length = std::min(text.size(), sizeof slot.message);
    std::memcpy(slot.message, text.data(), slot.length);
    slot.message[slot.length - 1] = '\n';  // a line even if cut
    slot.size = size;
    slot.base.store(base, std::memory_order_release);
    return i;
  }
  return -1;
}

void unguard_mapping(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  const std::lock_guard<std::mutex> lock(g_registration);
  g_slots[slot].base.store(nullptr, std::memory_order_release);
}

}  // namespace atl

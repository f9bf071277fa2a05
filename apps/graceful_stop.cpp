#include "apps/graceful_stop.hpp"

#include <atomic>
#include <csignal>

namespace atl {

namespace {

// Written in a signal handler, read by the run loop's thread: a lock-free atomic is safe for both.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) {
  if (g_signal.load() != 0) {  // the second request: no more grace
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_signal.store(signal);
}

}  // namespace

void install_graceful_stop() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls in flight carry on; the run loop polls the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int graceful_stop_signal() { return g_signal.load(); }

}  // namespace atl

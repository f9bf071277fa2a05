#include "apps/graceful_stop.hpp"

#include <csignal>

namespace atl {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int signal) {
  if (g_signal != 0) {  // the second request: no more grace
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_signal = signal;
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

int graceful_stop_signal() { return g_signal; }

}  // namespace atl

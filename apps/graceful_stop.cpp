#include "apps/graceful_stop.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>

namespace atl {

namespace {

// Written in a signal handler, read by the run loop's thread: lock-free atomics are safe for both.
std::atomic<int> g_signal{0};
std::atomic<bool> g_first_from_launcher{false};
std::atomic<std::int64_t> g_first_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free);
// scripts/launch's pid when it started this process (it forwards stop signals), else 0.
pid_t g_launcher = 0;

std::int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int signal, siginfo_t* info, void*) {
  const bool from_launcher = g_launcher != 0 && info != nullptr && info->si_pid == g_launcher;
  if (g_signal.load() == 0) {
    g_first_ns.store(monotonic_ns());
    g_first_from_launcher.store(from_launcher);
    g_signal.store(signal);
    return;
  }
  // Under scripts/launch one stop can arrive twice, forwarded by the launcher and sent directly
  // (a scheduler signals every process of the job): neither copy is the second request. The
  // launcher turns a second request of its own into SIGKILL.
  if (from_launcher) return;
  if (g_first_from_launcher.load() && monotonic_ns() - g_first_ns.load() < 2000000000) return;
  std::signal(signal, SIG_DFL);  // the second request: no more grace
  std::raise(signal);
}

}  // namespace

void install_graceful_stop() {
  const char* launched = std::getenv("ATOLL_LAUNCH_STARTED");
  if (launched != nullptr && *launched != '\0') {
    g_launcher = ::getppid();
    if (const char* pid = std::getenv("ATOLL_LAUNCH_PID"); pid != nullptr) {  // a positive number, else ignored
      char* end = nullptr;
      const long value = std::strtol(pid, &end, 10);
      if (end != pid && *end == '\0' && value > 0) g_launcher = static_cast<pid_t>(value);
    }
  }
  struct sigaction action {};
  action.sa_sigaction = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;  // blocking calls in flight carry on; the run loop polls
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  if (g_launcher != 0) {
    // A launcher that dies unable to forward a stop (SIGKILL, the OOM killer) must not leave its
    // nodes training unsupervised (they run in sessions of their own): its death is a stop
    // request, saved like any other. Only when it is this process's parent: under a wrapper (a
    // setsid that forked, a PID namespace) the parent is another process, whose end says nothing.
    if (::getppid() == g_launcher) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != g_launcher) std::raise(SIGTERM);  // it died between the check and the call
    }
  }
}

int graceful_stop_signal() { return g_signal.load(); }

}  // namespace atl

#include "apps/fatal_exit.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

namespace atl {

namespace {

// A plain array: a thread that ends the process during static destruction still reads it.
char program_name[128] = "atoll";

[[noreturn]] void on_terminate() {
  if (const std::exception_ptr escaped = std::current_exception()) {
    // fputs/fprintf to the unbuffered stderr: no allocation on the way out.
    try {
      std::rethrow_exception(escaped);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "%s: out of memory in a runtime thread (std::bad_alloc escaped it)\n", program_name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: an exception escaped a runtime thread: %s\n", program_name, e.what());
    } catch (...) {
      std::fprintf(stderr, "%s: error: a non-standard exception escaped a runtime thread\n", program_name);
    }
    std::_Exit(1);
  }
  std::abort();
}

}  // namespace

void exit_on_escaped_exception(const std::string& program) {
  std::snprintf(program_name, sizeof program_name, "%s", program.c_str());
  std::set_terminate(on_terminate);
}

void report_file_size_limit_as_write_error() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace atl

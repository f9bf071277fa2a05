// An exception that escapes a runtime thread (a CAF worker, a backend thread) ends the process
// through std::terminate. Under memory pressure that is a std::bad_alloc thrown where nothing can
// catch it; rather than abort with a core dump, the process prints what escaped and exits 1, like
// every other runtime failure (docs/failures.md). A terminate without an exception still aborts.
#pragma once
#include <string>

namespace atl {

// program: how the message begins ("[node 1] atoll-train" on a job's other nodes); may be set again.
void exit_on_escaped_exception(const std::string& program);

// A write past the file size limit (ulimit -f) ends the process with SIGXFSZ by default: mid-file,
// with no message. Ignored, the write fails with EFBIG and is reported like any failed write (the
// file named, exit 1, its temporary removed).
void report_file_size_limit_as_write_error();

}  // namespace atl

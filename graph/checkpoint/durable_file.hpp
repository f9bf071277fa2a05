// Durable writes: the bytes go to a temporary name in the destination's directory, are fsync'd,
// and only then renamed over the destination (and the directory fsync'd), so the destination name
// never holds a half-written file, even after a crash or power loss.
#pragma once
#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace atl {

// A file could not be written: no space, a quota, a file size limit, an I/O error, a folder gone.
// The environment's fault, not the input's (so not a CheckpointError: atoll-train exits 1, and a
// launcher may restart). Messages start with the file asked for; its temporary is gone, and
// nothing already on disk was changed.
class FileWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Streams bytes into `.<name>.tmp-<temporary_tag()>` (temporary_prefix) beside `path`; commit() makes them appear under `path`.
// Destroyed without commit() (an exception on the way), it removes the temporary file.
class DurableFileWriter {
 public:
  explicit DurableFileWriter(std::filesystem::path path);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  void write(const void* bytes, std::size_t count);
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
};

void write_file_durably(const std::filesystem::path& path, std::string_view contents);

// "<host name>-<pid>", the end of this process's temporaries' names: writers on other machines
// sharing a folder are told apart.
std::string temporary_tag();
// The fixed part of the temporaries' names for `name`: lead + name + trail, a long name cut (and a
// hash of the whole put after the cut) so that with temporary_tag() the whole fits in a file
// name's 255 bytes: an output named near that limit can be written. The same for the same name,
// so remove_abandoned_temporaries finds the ones a killed writer left.
std::string temporary_prefix(std::string_view lead, const std::string& name, std::string_view trail);
// "" when every name in `path` fits a file name's 255 bytes, else what is wrong ("the name
// 'abc...' in '/x' has 300 bytes; expected at most 255 ..."): checked before the work whose output
// it is, which would otherwise fail only at the write.
std::string name_length_problem(const std::filesystem::path& path);
// Removes the entries of `folder` named `<prefix><host>-<pid>`, this machine's, whose process is
// gone: the temporaries of a writer killed before it could remove them (a whole model copy, for
// an export). One whose pid is alive (another writer, or a number reused since) stays, as does
// any other machine's. Errors are ignored: a cleanup.
void remove_abandoned_temporaries(const std::filesystem::path& folder, const std::string& prefix);

// The folder that holds `path` ("." for a bare file name): where its renames are made durable.
std::filesystem::path parent_folder(const std::filesystem::path& path);

// Makes renames and creations inside `dir` durable.
void fsync_directory(const std::filesystem::path& dir);

// Creates `dir` and its missing ancestors, each made durable in its parent: a file written
// durably inside a new folder must not lose the folder to a crash. Throws std::filesystem_error.
void create_directories_durably(const std::filesystem::path& dir);

}  // namespace atl

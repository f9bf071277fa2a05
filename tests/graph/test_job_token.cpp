// The job token (issue 11): from ATOLL_JOB_TOKEN or topology.job_token_file; a file that cannot be
// read, is empty, or disagrees with the variable is an error that names it; a file other users can
// read gets a warning.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>

#include "graph/launch/job_token.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using checkpoint_testing::TempDir;

namespace {

std::string write_token(const TempDir& dir, const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

std::string error_of(const std::string& file, const std::optional<std::string>& env) {
  try {
    resolve_job_token(file, env);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("job token: from the variable, from a file, or from both when they agree", "[graph][launch]") {
  TempDir dir;
  CHECK_FALSE(resolve_job_token("", std::nullopt).token);
  CHECK(*resolve_job_token("", std::string("abc")).token == "abc");
  CHECK(*resolve_job_token("", std::string(" abc\n")).token == "abc");  // as a file's: surrounding whitespace goes
  CHECK_THROWS_WITH(resolve_job_token("", std::string("   ")), "ATOLL_JOB_TOKEN is blank; expected a token (one word)");
  CHECK_THROWS_WITH(resolve_job_token("", std::string("two words")),
                    "ATOLL_JOB_TOKEN holds more than one word; expected one token");

  const std::string file = write_token(dir, "token", "  s3cret\n", 0600);
  const JobToken from_file = resolve_job_token(file, std::nullopt);
  CHECK(*from_file.token == "s3cret");
  CHECK(from_file.warning.empty());
  CHECK(*resolve_job_token(file, std::string("s3cret")).token == "s3cret");
}

TEST_CASE("job token: a bad file is an error naming it, one others can read gets a warning", "[graph][launch]") {
  TempDir dir;
  const std::string missing = (dir.path / "nowhere").string();
  CHECK(error_of(missing, std::nullopt) == "cannot read the job token file '" + missing + "': No such file or directory");
  const std::string empty = write_token(dir, "empty", " \n", 0600);
  CHECK(error_of(empty, std::nullopt) == "the job token file '" + empty + "' is blank; expected a token (one word)");
  const std::string two = write_token(dir, "two", "a b\n", 0600);
  CHECK(error_of(two, std::nullopt).find("holds more than one word") != std::string::npos);
  CHECK(error_of(dir.path.string(), std::nullopt) ==
        "the job token file '" + dir.path.string() + "' is a directory; expected a file");
  const std::string file = write_token(dir, "token", "s3cret", 0600);
  CHECK(error_of(file, std::string("other")) == "ATOLL_JOB_TOKEN and the job token file '" + file +
                                                    "' give different tokens; expected one source, or the same token");
  const std::string open = write_token(dir, "open", "s3cret", 0644);
  const JobToken readable = resolve_job_token(open, std::nullopt);
  CHECK(*readable.token == "s3cret");
  CHECK(readable.warning == "the job token file '" + open + "' is readable by other users (chmod 600 it)");
  CHECK(resolve_job_token(write_token(dir, "exec", "s3cret", 0700), std::nullopt).warning.empty());
}

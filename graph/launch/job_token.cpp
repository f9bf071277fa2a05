#include "graph/launch/job_token.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace atl {

namespace {

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// The one word `text` holds (surrounding whitespace ignored); `what` names its source. A blank one
// would be a token anyone can guess.
std::string one_token(const std::string& text, const std::string& what) {
  const std::string token = trimmed(text);
  if (token.empty()) throw std::invalid_argument(what + " is blank; expected a token (one word)");
  if (token.find_first_of(" \t\r\n") != std::string::npos) {
    throw std::invalid_argument(what + " holds more than one word; expected one token");
  }
  return token;
}

}  // namespace

JobToken resolve_job_token(const std::string& token_file, const std::optional<std::string>& env_token) {
  JobToken out;
  if (env_token && !env_token->empty()) out.token = one_token(*env_token, "ATOLL_JOB_TOKEN");
  if (token_file.empty()) return out;
  struct stat st{};
  if (::stat(token_file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw std::invalid_argument("the job token file '" + token_file + "' is a directory; expected a file");
  }
  std::ifstream in(token_file, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("cannot read the job token file '" + token_file + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  const std::string token = one_token(text.str(), "the job token file '" + token_file + "'");
  if (out.token && *out.token != token) {
    throw std::invalid_argument("ATOLL_JOB_TOKEN and the job token file '" + token_file +
                                "' give different tokens; expected one source, or the same token");
  }
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    out.warning = "the job token file '" + token_file + "' is readable by other users (chmod 600 it)";
  }
  out.token = token;
  return out;
}

}  // namespace atl

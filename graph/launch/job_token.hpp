// The job token of a multi-process job (issue 11): every connection to node 0 presents it first.
// It comes from ATOLL_JOB_TOKEN (scripts/launch generates one) or from the file that
// topology.job_token_file names (on a shared file system, say, so no secret travels on a
// command line or in a batch script's environment).
#pragma once
#include <optional>
#include <string>

namespace atl {

struct JobToken {
  std::optional<std::string> token;  // none: neither source gave one
  std::string warning;               // non-empty: something to tell the user (a file others can read)
};

// `token_file` from the config ("" for none), `env_token` from ATOLL_JOB_TOKEN. Throws
// std::invalid_argument saying what is wrong: the file cannot be read or holds no token, or both
// sources give different tokens, or either is blank or more than one word. Surrounding whitespace
// is ignored.
JobToken resolve_job_token(const std::string& token_file, const std::optional<std::string>& env_token);

}  // namespace atl

// SIGTERM and SIGINT as a request to stop: the first one is recorded and the run loop ends after
// the current step (saving a checkpoint); a second one ends the process at once, as the default
// action would. Clusters (Slurm preemption, Kubernetes) send SIGTERM and wait a grace period.
// Under scripts/launch a copy forwarded by the launcher, or one arriving directly within 2 s of
// the launcher's, is the same request, not a second one; the launcher's death is a request too.
#pragma once

namespace atl {

void install_graceful_stop();
// The signal that asked to stop (SIGTERM or SIGINT), or 0.
int graceful_stop_signal();

}  // namespace atl

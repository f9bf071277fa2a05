// How the runtime's actors fail (internal to actors/; includes CAF). An actor that dies leaves
// its peers waiting on collectives it will never post, so nothing may die silently: an escaping
// exception becomes the actor's exit reason, and the trainer, which monitors every actor of its
// process, fails the step (or export) in flight with it.
#pragma once
#include <string>

#include "caf/all.hpp"

namespace atl {

// An exception that escapes one of `self`'s handlers (std::bad_alloc in a tensor allocation,
// say) ends the actor with the exception's message as its exit reason (CAF's default prints to
// stdout and keeps only the error code); the trainer names the actor.
void exit_with_exception_message(caf::scheduled_actor* self);

// The text of an error: its message when it carries one (the runtime's errors do), else CAF's
// rendering of it.
std::string error_text(caf::actor_system& system, const caf::error& error);

}  // namespace atl

#include "actors/supervision.hpp"

namespace atl {

void exit_with_exception_message(caf::scheduled_actor* self) {
  self->set_exception_handler([](caf::scheduled_actor*, std::exception_ptr& thrown) -> caf::error {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      return caf::make_error(caf::sec::runtime_error, e.what());
    } catch (...) {
      return caf::make_error(caf::sec::runtime_error, "an exception not derived from std::exception");
    }
  });
}

std::string error_text(caf::actor_system& system, const caf::error& error) {
  const caf::message& context = error.context();
  if (context.match_elements<std::string>()) return context.get_as<std::string>(0);
  return system.render(error);
}

}  // namespace atl

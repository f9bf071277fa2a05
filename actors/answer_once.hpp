// A response promise answered once. Copies of a CAF 0.17 promise do not see each other's
// deliveries (a copy still reads pending() after another delivered), so handlers that may each
// answer (one per unit, or a result beside several errors) share one of these instead.
#pragma once
#include <memory>
#include <utility>

#include <caf/typed_response_promise.hpp>

namespace atl {

template <class T>
class AnswerOnce {
 public:
  explicit AnswerOnce(caf::typed_response_promise<T> promise)
      : state_(std::make_shared<State>(State{std::move(promise), false})) {}
  // The first call answers; later ones are dropped.
  template <class X>
  void deliver(X&& x) const {
    if (state_->done) return;
    state_->done = true;
    state_->promise.deliver(std::forward<X>(x));
  }
  bool pending() const { return !state_->done; }
  caf::typed_response_promise<T> promise() const { return state_->promise; }

 private:
  struct State {
    caf::typed_response_promise<T> promise;
    bool done;
  };
  std::shared_ptr<State> state_;  // shared by the copies the handlers capture
};

}  // namespace atl

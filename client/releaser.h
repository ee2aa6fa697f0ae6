// Runs a function when the last shard that borrows a payload lets go: the
// borrowed pushes hold one in a shared_ptr that every shard of the payload
// (on one daemon or on several) shares.
#ifndef ZENFLOW_CLIENT_RELEASER_H_
#define ZENFLOW_CLIENT_RELEASER_H_

#include <functional>
#include <utility>

namespace zenflow {

struct Releaser {
  explicit Releaser(std::function<void()> f) : fn(std::move(f)) {}
  ~Releaser() {
    if (fn) fn();
  }
  Releaser(const Releaser&) = delete;
  Releaser& operator=(const Releaser&) = delete;
  std::function<void()> fn;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_RELEASER_H_

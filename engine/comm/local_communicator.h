// The `local` backend: ranks are threads of one process sharing memory. Create one LocalGroup, hand it to N
// threads, and let each take its rank's communicator. Reductions combine ranks in rank order, so every rank gets
// bit-identical results.
#pragma once

#include <chrono>
#include <memory>

#include "comm/communicator.h"

namespace servetune {

class LocalGroup : public std::enable_shared_from_this<LocalGroup> {
 public:
  // A group of `size` ranks; a rank waiting longer than `timeout` for the others fails the group.
  static std::shared_ptr<LocalGroup> create(int size, std::chrono::milliseconds timeout = kDefaultCommTimeout);
  ~LocalGroup();
  int size() const;
  std::chrono::milliseconds timeout() const;
  // The communicator of `rank` (each rank's is taken once). Destroying it without finishing tells the peers that
  // the rank left: their next collective throws instead of waiting for the timeout.
  std::unique_ptr<Communicator> communicator(int rank);

  struct State;

 private:
  LocalGroup(int size, std::chrono::milliseconds timeout);
  std::unique_ptr<State> state_;
};

}  // namespace servetune

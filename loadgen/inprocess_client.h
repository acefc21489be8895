// Client for the built-in engine without HTTP: requests go to Engine::submit at their arrival times; TTFT and
// ITL come from the engine-side timestamps of the TokenEvents (steady clock, same as the run's), prompt and
// output token counts from the engine's usage; client lag is each event's drain time minus its engine timestamp.
#pragma once

#include "loadgen/client.h"

namespace servetune {
class Engine;
}

namespace servetune::loadgen {

class InProcessClient : public Client {
 public:
  explicit InProcessClient(Engine& engine) : engine_(engine) {}
  RunResult run(const RunSpec& spec) override;

 private:
  Engine& engine_;
};

}  // namespace servetune::loadgen

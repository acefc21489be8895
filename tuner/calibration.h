// A fixed reference workload timed in CPU time, measured next to each benchmark run of the built-in engine, so the
// CI check can compare "engine CPU time per token" in units of "this machine's speed right now": a shared or
// throttled machine slows both alike, a slower engine only the first.
#pragma once

namespace servetune::tuner {

// CPU milliseconds this thread spends on the reference workload (streaming multiply-adds over a 64 MiB buffer,
// larger than the caches, as decoding streams weights); the median of five measurements.
double calibration_ms();

}  // namespace servetune::tuner

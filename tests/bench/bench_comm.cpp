// gloo collective latency between two processes of this machine (the peer is forked at the first benchmark): the
// all-reduce of one SmolLM2 decode step's activations (32 tokens x 576 floats) and the all-gather of its logits
// shards (32 x 24576 floats per rank). `bench_comm` prints the time per collective.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "child_process.h"
#include "comm/communicator.h"

namespace servetune {
namespace {

enum Op : int64_t { kStop = 0, kAllReduce = 1, kAllGather = 2 };

void run_op(Communicator& c, int64_t op, size_t count, int64_t times, std::vector<float>& a, std::vector<float>& b) {
  a.resize(count, 1.0f);
  b.resize(2 * count);
  for (int64_t i = 0; i < times; ++i) {
    if (op == kAllReduce) c.all_reduce(a.data(), count, ReduceOp::kSum);
    else c.all_gather(a.data(), b.data(), count);
  }
}

// Rank 0 of a two-process gloo group; the forked rank 1 repeats whatever rank 0 announces until told to stop.
struct Group {
  Group() {
    CommSpec spec;
    spec.size = 2;
    spec.dist_init_addr = "127.0.0.1:" + std::to_string(testing::free_port());
    pid = ::fork();
    spec.rank = pid == 0 ? 1 : 0;
    comm = make_communicator("gloo", spec);
    if (pid != 0) return;
    std::vector<float> a, b;
    for (;;) {
      int64_t msg[3] = {0, 0, 0};
      comm->broadcast(msg, 3, 0);
      if (msg[0] == kStop) ::_exit(0);
      run_op(*comm, msg[0], static_cast<size_t>(msg[1]), msg[2], a, b);
    }
  }
  ~Group() {
    int64_t stop[3] = {kStop, 0, 0};
    comm->broadcast(stop, 3, 0);
    ::waitpid(pid, nullptr, 0);
  }
  std::unique_ptr<Communicator> comm;
  pid_t pid = 0;
};

Communicator& group() {
  static Group g;
  return *g.comm;
}

void bench(benchmark::State& state, Op op) {
  Communicator& c = group();
  const auto count = static_cast<size_t>(state.range(0));
  std::vector<float> a, b;
  int64_t msg[3] = {op, state.range(0), static_cast<int64_t>(state.max_iterations)};
  c.broadcast(msg, 3, 0);
  int64_t done = 0;
  for (auto _ : state) {
    run_op(c, op, count, 1, a, b);
    ++done;
  }
  if (done != msg[2]) std::abort();  // the peer ran max_iterations collectives
}

void BM_GlooAllReduce(benchmark::State& state) { bench(state, kAllReduce); }
void BM_GlooAllGather(benchmark::State& state) { bench(state, kAllGather); }
BENCHMARK(BM_GlooAllReduce)->Arg(576)->Arg(32 * 576)->UseRealTime();
BENCHMARK(BM_GlooAllGather)->Arg(32 * 24576)->UseRealTime();

}  // namespace
}  // namespace servetune

// Rank 0 -> worker messages of a multi-process tensor-parallel group (see step_channel.h).
#include "runtime/step_channel.h"

#include <iterator>
#include <string>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "model/model_config.h"
#include "model/parallel.h"

namespace servetune {
namespace {

// Appends `v` to `out`.
void put(std::vector<int32_t>& out, const std::vector<int32_t>& v) { out.insert(out.end(), v.begin(), v.end()); }

// Takes the next `n` values of `in` at `at`.
void take(const std::vector<int32_t>& in, size_t& at, size_t n, std::vector<int32_t>& v) {
  v.assign(in.begin() + static_cast<long>(at), in.begin() + static_cast<long>(at + n));
  at += n;
}

// Header flags of a step.
constexpr int64_t kReturnHidden = 1, kTree = 2;

// The tree masks as int32 pairs (low word first) and back.
void put_masks(std::vector<int32_t>& out, const std::vector<uint64_t>& masks) {
  for (const uint64_t m : masks) {
    out.push_back(static_cast<int32_t>(static_cast<uint32_t>(m)));
    out.push_back(static_cast<int32_t>(static_cast<uint32_t>(m >> 32)));
  }
}
void take_masks(const std::vector<int32_t>& in, size_t& at, size_t n, std::vector<uint64_t>& masks) {
  masks.resize(n);
  for (size_t i = 0; i < n; ++i, at += 2) {
    masks[i] = static_cast<uint64_t>(static_cast<uint32_t>(in[at])) | static_cast<uint64_t>(static_cast<uint32_t>(in[at + 1])) << 32;
  }
}

}  // namespace

int64_t model_fingerprint(const ModelConfig& c, int tp_size, const ExpertSplit& experts, int moe_ranks, bool moe_all_to_all) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the shape and split
  const auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (int64_t v : {c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab, c.context_length,
                    static_cast<int64_t>(tp_size), static_cast<int64_t>(experts.ep_size), static_cast<int64_t>(moe_ranks),
                    static_cast<int64_t>(moe_all_to_all), static_cast<int64_t>(experts.redundant_experts)}) {
    mix(static_cast<uint64_t>(v));
  }
  // The placement file by name: the ranks read it each on its own node, and must agree on it.
  for (char ch : c.architecture + '\0' + experts.expert_location) mix(static_cast<unsigned char>(ch));
  return static_cast<int64_t>(h >> 1);
}

int64_t model_fingerprint(const ModelConfig& c, const ParallelContext& parallel) {
  return model_fingerprint(c, parallel.tp_size, parallel.experts(), parallel.moe_comm ? parallel.moe_comm->size() : 0,
                           parallel.moe_all_to_all);
}

CommSpec replica_channel_spec(const std::string& dist_init_addr, int replica, bool engine_side, std::chrono::milliseconds timeout) {
  const auto [host, port] = parse_host_port(dist_init_addr, "dist_init_addr");
  if (port + replica > 65535) {
    throw_usage("dist_init_addr port " + std::to_string(port) + " + " + std::to_string(replica) +
                ": DP attention over gloo meets each replica's worker at the next ports, which run past 65535");
  }
  CommSpec spec;
  spec.rank = engine_side ? 0 : 1;
  spec.size = 2;
  spec.timeout = timeout;
  spec.dist_init_addr = host + ":" + std::to_string(port + replica);
  return spec;
}

std::vector<int64_t> StepChannel::exchange(const std::vector<int64_t>& mine, size_t worker_count) {
  std::vector<size_t> counts(static_cast<size_t>(comm_.size()), worker_count);
  counts[0] = kHeader;
  std::vector<int64_t> gathered(kHeader + worker_count * static_cast<size_t>(comm_.size() - 1));
  comm_.all_gatherv(mine.data(), gathered.data(), counts);
  return gathered;
}

std::vector<std::vector<int64_t>> StepChannel::worker_values(const std::vector<int64_t>& gathered, size_t worker_count) const {
  std::vector<std::vector<int64_t>> out;
  for (int r = 1; r < comm_.size(); ++r) {
    const auto begin = gathered.begin() + static_cast<long>(kHeader + worker_count * static_cast<size_t>(r - 1));
    out.emplace_back(begin, begin + static_cast<long>(worker_count));
  }
  return out;
}

void StepChannel::send_handshake(const KvLayout& kv, int64_t fingerprint) {
  const std::vector<int64_t> header = {static_cast<int64_t>(RankMessage::kHandshake), kv.num_blocks, kv.page_size,
                                       static_cast<int64_t>(kv.dtype), fingerprint, 0};
  const auto fingerprints = worker_values(exchange(header, 1), 1);
  for (size_t w = 0; w < fingerprints.size(); ++w) {
    if (fingerprints[w][0] != fingerprint) {
      throw_usage("tensor-parallel rank " + std::to_string(w + 1) + " loaded a model of another shape, tp_size or ep_size than rank 0; "
                  "start every node with the same --model, --tp-size and --ep-size");
    }
  }
}

std::vector<std::vector<int64_t>> StepChannel::send_step(const Batch& b, size_t previous_collectives) {
  const int64_t flags = (b.return_hidden ? kReturnHidden : 0) | (b.has_tree() ? kTree : 0);
  const std::vector<int64_t> header = {static_cast<int64_t>(RankMessage::kStep), b.n_tokens(),
                                       static_cast<int64_t>(b.block_tables.size()), b.max_blocks_per_seq,
                                       static_cast<int64_t>(b.logits_indices.size()), flags};
  auto durations = worker_values(exchange(header, previous_collectives), previous_collectives);
  payload_.clear();
  for (const auto* v : {&b.tokens, &b.positions, &b.seq_of_token, &b.slot_mapping, &b.block_tables, &b.logits_indices}) put(payload_, *v);
  if (b.has_tree()) {
    put(payload_, b.tree_base);
    put_masks(payload_, b.tree_mask);
  }
  comm_.broadcast(payload_.data(), payload_.size(), 0);
  return durations;
}

std::vector<std::vector<int64_t>> StepChannel::send(RankMessage kind, size_t previous_collectives) {
  const std::vector<int64_t> header = {static_cast<int64_t>(kind), 0, 0, 0, 0, 0};
  return worker_values(exchange(header, previous_collectives), previous_collectives);
}

std::vector<std::vector<int64_t>> StepChannel::send_move_kv(const KvMove& move, size_t previous_collectives) {
  if (move.from.size() != move.to.size()) throw Error(ErrorKind::kInternal, "KV move: from and to differ in length");
  const std::vector<int64_t> header = {static_cast<int64_t>(RankMessage::kMoveKv), static_cast<int64_t>(move.from.size()), 0, 0, 0, 0};
  auto durations = worker_values(exchange(header, previous_collectives), previous_collectives);
  payload_.clear();
  put(payload_, move.from);
  put(payload_, move.to);
  comm_.broadcast(payload_.data(), payload_.size(), 0);
  return durations;
}

KvLayout StepChannel::receive_handshake(int64_t fingerprint) {
  const auto header = exchange({fingerprint}, 1);
  if (header[0] != static_cast<int64_t>(RankMessage::kHandshake)) {
    throw Error(ErrorKind::kInternal, "tensor-parallel worker expected the handshake, got message " + std::to_string(header[0]));
  }
  if (header[4] != fingerprint) {
    throw_usage("this tensor-parallel worker loaded a model of another shape, tp_size or ep_size than rank 0; start every "
                "node with the same --model, --tp-size and --ep-size");
  }
  return KvLayout{header[1], header[2], static_cast<DType>(header[3])};
}

RankMessage StepChannel::receive(const std::vector<int64_t>& previous_durations, Batch& b, KvMove& move) {
  const auto header = exchange(previous_durations, previous_durations.size());
  const auto kind = static_cast<RankMessage>(header[0]);
  if (kind == RankMessage::kKeepAlive || kind == RankMessage::kShutdown) return kind;
  if (kind == RankMessage::kMoveKv) {
    const auto n = static_cast<size_t>(header[1]);
    payload_.resize(2 * n);
    comm_.broadcast(payload_.data(), payload_.size(), 0);
    size_t at = 0;
    take(payload_, at, n, move.from);
    take(payload_, at, n, move.to);
    return kind;
  }
  if (kind != RankMessage::kStep) {
    throw Error(ErrorKind::kInternal, "tensor-parallel worker got an unexpected message " + std::to_string(header[0]));
  }
  const auto n_tokens = static_cast<size_t>(header[1]), n_tables = static_cast<size_t>(header[2]);
  const auto n_logits = static_cast<size_t>(header[4]);
  const bool tree = (header[5] & kTree) != 0;
  payload_.resize(4 * n_tokens + n_tables + n_logits + (tree ? 3 * n_tokens : 0));
  comm_.broadcast(payload_.data(), payload_.size(), 0);
  size_t at = 0;
  for (auto* v : {&b.tokens, &b.positions, &b.seq_of_token, &b.slot_mapping}) take(payload_, at, n_tokens, *v);
  take(payload_, at, n_tables, b.block_tables);
  take(payload_, at, n_logits, b.logits_indices);
  b.tree_base.clear();
  b.tree_mask.clear();
  if (tree) {
    take(payload_, at, n_tokens, b.tree_base);
    take_masks(payload_, at, n_tokens, b.tree_mask);
  }
  b.max_blocks_per_seq = header[3];
  b.return_hidden = (header[5] & kReturnHidden) != 0;
  return kind;
}

void StepChannel::send_reply(std::vector<float>& logits, const ExpertLoad& load, std::vector<float>& hidden) {
  int64_t counters[] = {load.experts, load.routed, load.busiest, load.ep_groups, load.busiest_group};
  comm_.broadcast(counters, std::size(counters), 1);
  if (!logits.empty()) comm_.broadcast(logits.data(), logits.size(), 1);
  if (!hidden.empty()) comm_.broadcast(hidden.data(), hidden.size(), 1);
}

void StepChannel::receive_reply(size_t rows, size_t vocab, std::vector<float>& logits, ExpertLoad& load,
                                size_t hidden_floats, std::vector<float>& hidden) {
  int64_t counters[5] = {};
  comm_.broadcast(counters, std::size(counters), 1);
  load = ExpertLoad{counters[0], counters[1], counters[2], counters[3], counters[4]};
  logits.resize(rows * vocab);
  if (!logits.empty()) comm_.broadcast(logits.data(), logits.size(), 1);
  hidden.resize(hidden_floats);
  if (!hidden.empty()) comm_.broadcast(hidden.data(), hidden.size(), 1);
}

}  // namespace servetune

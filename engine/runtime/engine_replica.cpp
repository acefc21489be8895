// One engine replica: loads the model onto its tensor-parallel ranks, sizes the KV cache (kv_plan.h), and builds the
// scheduler, model runner and speculator that its engine thread (step_loop.h) drives. The Engine front (engine.cpp)
// routes requests to one or more of them.
#include "runtime/engine_replica.h"

#include <algorithm>
#include <thread>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/checkpoint.h"
#include "runtime/block_manager.h"
#include "runtime/kv_plan.h"
#include "runtime/model_runner.h"
#include "runtime/request_state.h"
#include "runtime/scheduler.h"
#include "runtime/speculator.h"
#include "runtime/step_loop.h"
#include "runtime/tensor_parallel_group.h"
#include "runtime/worker_launcher.h"
#include "tokenizer/tokenizer.h"

namespace servetune {

class EngineReplica::Impl {
 public:
  Impl(const EngineConfig& config, ReplicaLinks links) : config_(config) {
    checkpoint_ = std::make_unique<Checkpoint>(config_.model, config_.load_format, config_.seed);
    // A bad tokenizer fails before a long weight load; dummy weights first say whether they fit in memory at all.
    const bool dummy = checkpoint_->format() == LoadFormat::kDummy;
    if (!dummy) tokenizer_ = checkpoint_->load_tokenizer();
    start_ranks(std::move(links));
    if (dummy) tokenizer_ = checkpoint_->load_tokenizer();
    model_config_ = ranks_->config();
    context_length_ = model_config_.context_length;
    if (config_.context_length) {
      if (*config_.context_length > context_length_) {
        throw_usage("context_length " + std::to_string(*config_.context_length) + " exceeds the model's " +
                    std::to_string(context_length_));
      }
      context_length_ = *config_.context_length;
    }

    const KvPlan kv = plan_kv_cache(config_, *ranks_, context_length_);
    ranks_->create_kv(kv.num_blocks, kv.page_size, kv.dtype);
    blocks_ = std::make_unique<BlockManager>(kv.num_blocks, kv.page_size, !config_.disable_radix_cache);
    SchedulerConfig sc;
    sc.max_running_requests = config_.max_running_requests;
    sc.max_batched_tokens = config_.max_prefill_tokens;
    sc.chunked_prefill_size = config_.chunked_prefill_size;
    sc.policy = config_.schedule_policy;
    scheduler_ = std::make_unique<Scheduler>(sc, *blocks_);
    runner_ = std::make_unique<ModelRunner>(*ranks_);
    SpeculatorContext spec_context;
    spec_context.backend = &ranks_->backend(0);
    spec_context.target_tokenizer = tokenizer_.get();
    spec_context.target_vocab = model_config_.vocab;
    spec_context.kv_tokens = kv.tokens();  // the draft cache holds as many tokens as the target's
    spec_context.page_size = kv.page_size;
    spec_context.kv_dtype = kv.dtype;
    spec_context.max_batch_tokens = config_.max_prefill_tokens;
    spec_context.target = checkpoint_.get();
    spec_context.target_hidden = ranks_->supports_hidden();
    spec_context.prefix_caching = !config_.disable_radix_cache;
    speculator_ = make_speculator(config_, spec_context);
    runner_->set_return_hidden(speculator_ && speculator_->wants_hidden());

    StepParts parts;
    parts.ranks = ranks_.get();
    parts.blocks = blocks_.get();
    parts.scheduler = scheduler_.get();
    parts.runner = runner_.get();
    parts.speculator = speculator_.get();
    parts.num_draft_tokens = speculative_draft_tokens(config_);
    parts.disable_by_batch_size = config_.speculative_disable_by_batch_size;
    parts.vocab = model_config_.vocab;
    loop_ = std::make_unique<StepLoop>(parts);
  }

  ~Impl() { shutdown(); }

  PreparedRequest prepare(Request request) const {
    validate_sampling_params(request.sampling);
    std::vector<int32_t> ids;
    if (!request.prompt_ids.empty()) {
      if (!request.prompt.empty()) throw Error(ErrorKind::kInvalidRequest, "give either a text prompt or prompt token ids, not both");
      ids = std::move(request.prompt_ids);
      for (int32_t id : ids) {
        if (id < 0 || id >= model_config_.vocab) {
          throw Error(ErrorKind::kInvalidRequest, "prompt token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                                      std::to_string(model_config_.vocab - 1) + ")");
        }
      }
    } else {
      ids = tokenizer_->encode(request.prompt, request.add_special_tokens, request.parse_special);
    }
    if (ids.empty()) throw Error(ErrorKind::kInvalidRequest, "the prompt is empty");
    const auto total = static_cast<int64_t>(ids.size()) + request.sampling.max_tokens;
    if (total > context_length_) {
      throw Error(ErrorKind::kInvalidRequest, "prompt (" + std::to_string(ids.size()) + " tokens) + max_tokens (" +
                                                  std::to_string(request.sampling.max_tokens) + ") exceeds the context length " +
                                                  std::to_string(context_length_));
    }
    if (total > kv_capacity_tokens()) {
      throw Error(ErrorKind::kInvalidRequest, "prompt + max_tokens (" + std::to_string(total) + " tokens) exceeds the KV cache capacity (" +
                                                  std::to_string(kv_capacity_tokens()) + " tokens); raise max_total_tokens");
    }
    return PreparedRequest{std::move(ids), std::move(request.sampling), request.detokenize, request.prompt_logits};
  }

  std::shared_ptr<RequestStream> enqueue(uint64_t id, PreparedRequest request, std::function<void()> notify) {
    auto stream = std::make_shared<RequestStream>(id);
    if (notify) stream->set_notifier(std::move(notify));
    const uint64_t seed = config_.seed * 0x9e3779b97f4a7c15ull + id;
    auto state = std::make_unique<RequestState>(id, *tokenizer_, context_length_, request.sampling, seed,
                                                std::move(request.prompt_ids), stream);
    state->detokenize = request.detokenize;
    state->seq.prompt_logits = request.prompt_logits;
    loop_->enqueue(std::move(state));
    return stream;
  }

  void shutdown() {
    if (loop_) loop_->shutdown();
  }

  int64_t kv_capacity_tokens() const { return blocks_->num_blocks() * blocks_->page_size(); }

  EngineConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<WorkerProcess>> local_workers_;  // outlive ranks_, whose end stops them
  std::unique_ptr<TensorParallelGroup> ranks_;  // every rank's backend, weight shard and KV cache shard
  ModelConfig model_config_;
  int64_t context_length_ = 0;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Speculator> speculator_;
  std::unique_ptr<StepLoop> loop_;  // last: its thread stops before the parts it drives go

 private:
  // The replica's threads split evenly over its tensor-parallel ranks in this process (validate() ensures one each
  // at least): all of them with the local communicator, rank 0 alone with gloo (the others are worker processes).
  void start_ranks(ReplicaLinks links) {
    const int threads = config_.threads > 0 ? config_.threads : available_cpus();
    const std::chrono::milliseconds timeout = std::chrono::seconds(config_.dist_timeout);
    const bool all_to_all = config_.moe_a2a_backend == MoeA2aBackend::kDeepep;
    if (links.worker) {
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device), std::move(links.worker),
                                                     std::move(links.sync), timeout, expert_split(config_), all_to_all);
    } else if (links.moe) {
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device), 1, threads, compile_options(config_), timeout,
                                                     expert_split(config_), std::move(links.moe), all_to_all, std::move(links.sync));
    } else if (config_.comm_backend == CommBackend::kGloo) {
      local_workers_ = start_local_workers(config_);  // this node's other ranks, when it hosts several
      CommSpec spec = node_rank_spec(config_.tp_size, config_.nnodes, 0, 0, config_.dist_init_addr);
      spec.timeout = timeout;
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device), std::max(1, threads / ranks_per_node(config_)),
                                                     make_communicator("gloo", spec), timeout, compile_options(config_),
                                                     expert_split(config_));
    } else {
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device), config_.tp_size, std::max(1, threads / config_.tp_size),
                                                     compile_options(config_), timeout, expert_split(config_));
    }
  }
};

EngineReplica::EngineReplica(const EngineConfig& config, ReplicaLinks links) : impl_(std::make_unique<Impl>(config, std::move(links))) {}
EngineReplica::~EngineReplica() { shutdown(); }
PreparedRequest EngineReplica::prepare(Request request) const { return impl_->prepare(std::move(request)); }
std::shared_ptr<RequestStream> EngineReplica::enqueue(uint64_t id, PreparedRequest request, std::function<void()> notify) {
  return impl_->enqueue(id, std::move(request), std::move(notify));
}
bool EngineReplica::abort(uint64_t id) { return impl_->loop_->abort(id); }
int64_t EngineReplica::flush_prefix_cache() { return impl_->loop_->flush_prefix_cache(); }
EngineStats EngineReplica::stats() const { return impl_->loop_->stats(); }
std::vector<std::vector<int64_t>> EngineReplica::expert_distribution() const { return impl_->ranks_->expert_distribution(); }
int64_t EngineReplica::num_live() const { return impl_->loop_->num_live(); }
const ModelConfig& EngineReplica::model_config() const { return impl_->model_config_; }
const Tokenizer& EngineReplica::tokenizer() const { return *impl_->tokenizer_; }
int64_t EngineReplica::kv_capacity_tokens() const { return impl_->kv_capacity_tokens(); }
void EngineReplica::shutdown() {
  if (impl_) impl_->shutdown();
}

}  // namespace servetune

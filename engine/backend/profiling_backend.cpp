// ProfilingBackend: per-op wall times of a forwarded backend (see profiling_backend.h).
#include "backend/profiling_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <utility>
#include <vector>

#include "core/error.h"

namespace servetune {
namespace {

std::string matrix_key(const WeightMatrix& w) {
  return std::to_string(w.rows) + "x" + std::to_string(w.cols) + " " + std::string(dtype_name(w.type));
}

}  // namespace

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner, std::string destination)
    : inner_(std::move(inner)), destination_(std::move(destination)) {
  static std::atomic<int> created{0};
  instance_ = ++created;
}

ProfilingBackend::~ProfilingBackend() {
  const std::string table = report();
  if (destination_ == "-") {
    std::cerr << table << std::flush;
    return;
  }
  std::ofstream out(destination_, std::ios::app);
  out << table;
  if (!out) std::cerr << "SERVETUNE_PROFILE_OPS: cannot write " << destination_ << "\n" << table << std::flush;
}

template <class F>
void ProfilingBackend::timed(const std::string& op, int64_t n, F&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  try {
    inner_->synchronize();
  } catch (const Error& e) {  // the wait after each op doubles as a fault check: name the op that faulted
    throw Error(e.kind(), "after op " + op + ": " + e.what());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  OpStats& stats = ops_[op];
  stats.all.add(n, seconds);
  if (n > 0) stats.by_size[tokens_per_call_class(n)].add(n, seconds);
}

namespace {

// Each size class's largest token count (the last has none) and its label.
constexpr int64_t kClassMaxTokens[kTokensPerCallClasses - 1] = {1, 16, 64, 512};
constexpr const char* kClassLabels[kTokensPerCallClasses] = {"1 token", "2-16 tokens", "17-64 tokens", "65-512 tokens",
                                                             ">512 tokens"};

}  // namespace

int tokens_per_call_class(int64_t n) {
  int c = 0;
  while (c < kTokensPerCallClasses - 1 && n > kClassMaxTokens[c]) ++c;
  return c;
}

const char* tokens_per_call_label(int size_class) {
  return kClassLabels[std::clamp(size_class, 0, kTokensPerCallClasses - 1)];
}

std::string ProfilingBackend::report() const {
  std::vector<std::pair<std::string, OpStats>> by_name;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    by_name.assign(ops_.begin(), ops_.end());
  }
  std::vector<std::pair<std::string, OpTotals>> rows;
  for (const auto& [op, stats] : by_name) rows.emplace_back(op, stats.all);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0.0;
  for (const auto& [op, t] : rows) total += t.seconds;
  // Several backends in one process (tensor-parallel ranks, data-parallel replicas) each write a table: numbered.
  std::string out = "servetune op profile, backend " + std::to_string(instance_) + " of this process (" + inner_->name() +
                    "; wall time of each op, synchronized)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-44s %10s %12s %12s %7s %11s\n", "op", "calls", "tokens", "total ms", "share",
                "us/call");
  out += line;
  for (const auto& [op, t] : rows) {
    std::snprintf(line, sizeof line, "%-44s %10lld %12lld %12.1f %6.1f%% %11.1f\n", op.c_str(),
                  static_cast<long long>(t.calls), static_cast<long long>(t.tokens), t.seconds * 1e3,
                  total > 0.0 ? 100.0 * t.seconds / total : 0.0, t.calls > 0 ? t.seconds * 1e6 / t.calls : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-44s %10s %12s %12.1f\n", "all ops", "", "", total * 1e3);
  out += line;
  out += "by tokens per call\n";
  std::snprintf(line, sizeof line, "%-44s %-14s %10s %12s %12s %7s %11s\n", "op", "tokens/call", "calls", "tokens",
                "total ms", "share", "us/token");
  out += line;
  for (const auto& [op, stats] : by_name) {
    for (int c = 0; c < kTokensPerCallClasses; ++c) {
      const OpTotals& t = stats.by_size[c];
      if (t.calls == 0) continue;
      std::snprintf(line, sizeof line, "%-44s %-14s %10lld %12lld %12.1f %6.1f%% %11.2f\n", op.c_str(),
                    tokens_per_call_label(c), static_cast<long long>(t.calls), static_cast<long long>(t.tokens),
                    t.seconds * 1e3, total > 0.0 ? 100.0 * t.seconds / total : 0.0,
                    t.seconds * 1e6 / static_cast<double>(t.tokens));
      out += line;
    }
  }
  return out;
}

void ProfilingBackend::upload(Buffer& dst, size_t offset, const void* src, size_t bytes) {
  timed("upload", 0, [&] { inner_->upload(dst, offset, src, bytes); });
}
void ProfilingBackend::download(void* dst, const Buffer& src, size_t offset, size_t bytes) {
  timed("download", 0, [&] { inner_->download(dst, src, offset, bytes); });
}
void ProfilingBackend::embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) {
  timed("embed", n, [&] { inner_->embed(table, ids, n, out); });
}
void ProfilingBackend::rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  timed("rms_norm", n, [&] { inner_->rms_norm(x, w, y, n, dim, eps); });
}
void ProfilingBackend::matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) {
  timed("matmul " + matrix_key(w), n, [&] { inner_->matmul(w, bias, x, n, y); });
}
void ProfilingBackend::matmuls(std::span<const MatmulOut> outs, const float* x, int64_t n) {
  std::string key = "matmuls";
  const char* separator = " ";
  for (const MatmulOut& o : outs) {
    key += separator + matrix_key(*o.w);
    separator = " + ";
  }
  timed(key, n, [&] { inner_->matmuls(outs, x, n); });
}
void ProfilingBackend::rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) {
  timed("rope", n, [&] { inner_->rope(x, positions, n, n_heads, p); });
}
void ProfilingBackend::scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n,
                                        int64_t width, float* dst) {
  timed("scatter_add_rows", n, [&] { inner_->scatter_add_rows(src, rows, weights, n, width, dst); });
}
void ProfilingBackend::group_by_expert(const MoeRouting& routing, const float* logits, const float* bias, int64_t n,
                                       const int32_t* real_tokens, int32_t* rows, float* weights, int32_t* offsets) {
  timed("group_by_expert", n,
        [&] { inner_->group_by_expert(routing, logits, bias, n, real_tokens, rows, weights, offsets); });
}
void ProfilingBackend::expert_mlps_grouped(std::span<const ExpertWeights> experts, const int32_t* offsets, int64_t rows,
                                           const float* x, float* y) {
  timed("expert_mlps_grouped", rows, [&] { inner_->expert_mlps_grouped(experts, offsets, rows, x, y); });
}
void ProfilingBackend::expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) {
  int64_t rows = 0;
  for (const ExpertMlp& e : experts) rows += e.count;
  timed("expert_mlps", rows, [&] { inner_->expert_mlps(experts, x, y); });
}
void ProfilingBackend::head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides,
                                   int64_t n, float* y, HeadStrides y_strides) {
  timed("head_matmul", n, [&] { inner_->head_matmul(w, n_heads, x, x_strides, n, y, y_strides); });
}
void ProfilingBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n,
                                 int64_t width) {
  timed("copy_rows", n, [&] { inner_->copy_rows(src, src_stride, dst, dst_stride, n, width); });
}
void ProfilingBackend::store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width,
                                    const float* rope_key, const int32_t* slots, int64_t n) {
  timed("store_latent", n, [&] { inner_->store_latent(kv, latent, latent_width, rope_key, slots, n); });
}
void ProfilingBackend::attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q,
                                        int64_t n_heads, int64_t v_dim, float scale, float* out) {
  timed("attention_latent", batch.n_tokens, [&] { inner_->attention_latent(kv, batch, q, n_heads, v_dim, scale, out); });
}
void ProfilingBackend::store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots,
                                int64_t n) {
  timed("store_kv", n, [&] { inner_->store_kv(kv, k, v, slots, n); });
}
void ProfilingBackend::attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                                 float scale, float* out) {
  timed("attention", batch.n_tokens, [&] { inner_->attention(kv, batch, q, n_heads, scale, out); });
}
void ProfilingBackend::prefetch_attention(const KvLayerView& kv, const AttentionBatch& batch) {
  timed("prefetch_attention", batch.n_tokens, [&] { inner_->prefetch_attention(kv, batch); });
}
void ProfilingBackend::silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn,
                                float* out) {
  timed("silu_mul", n, [&] { inner_->silu_mul(gate, up, in_stride, n, ffn, out); });
}
void ProfilingBackend::silu_mul_matmul(const WeightMatrix& w, const float* gate, const float* up, int64_t in_stride,
                                       int64_t n, float* act, float* y) {
  timed("silu_mul + matmul " + matrix_key(w), n, [&] { inner_->silu_mul_matmul(w, gate, up, in_stride, n, act, y); });
}
void ProfilingBackend::add(float* x, const float* y, int64_t n) {
  timed("add", 0, [&] { inner_->add(x, y, n); });
}
void ProfilingBackend::add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim,
                                    float eps) {
  timed("add_rms_norm", n, [&] { inner_->add_rms_norm(x, residual, w, y, n, dim, eps); });
}
void ProfilingBackend::rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions,
                                      const int32_t* slots, int64_t n, int64_t n_heads, const RopeParams& p,
                                      float* q_out) {
  timed("rope_store_qkv", n, [&] { inner_->rope_store_qkv(kv, qkv, positions, slots, n, n_heads, p, q_out); });
}
void ProfilingBackend::sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows,
                              int32_t* tokens) {
  timed("sample", n, [&] { inner_->sample(logits, n, vocab, rows, tokens); });
}

}  // namespace servetune

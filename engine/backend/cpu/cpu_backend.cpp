// CPU backend: parallel loops over the reference ops, SIMD matmul, host buffers aligned for AVX-512.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <string>

#include <sys/mman.h>

#include "backend/cpu/activation_simd.h"
#include "backend/cpu/attention_simd.h"
#include "backend/cpu/kv_layout.h"
#include "core/quant.h"
#include "backend/cpu/matmul.h"
#include "core/cpu_features.h"
#include "backend/cpu/ops_reference.h"
#include "backend/cpu/rope_simd.h"
#include "backend/cpu/sample_row.h"
#include "backend/cpu/vector_math.h"
#include "core/error.h"

namespace servetune {
namespace cpu {
namespace {

// Host memory, 64-byte aligned. Buffers of 2 MB and more (the KV cache's layers, a prefill's activations) are
// mapped on 2 MB boundaries and advised to use transparent huge pages: their first touch costs one page fault per
// 2 MB instead of per 4 KB (on virtual machines a first touch is expensive), and the attention's scattered
// KV reads miss the TLB less. Without THP the mapping simply stays on 4 KB pages.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : size_(bytes) {
    const size_t padded = (bytes + 63) / 64 * 64 + 64;
    if (padded < kHugePage) {
      data_ = std::aligned_alloc(64, padded);
      if (data_ == nullptr) throw std::bad_alloc();
      return;
    }
    mapped_bytes_ = (padded + kHugePage - 1) / kHugePage * kHugePage + kHugePage;  // room to align the start
    mapping_ = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping_ == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<uintptr_t>(mapping_);
    data_ = reinterpret_cast<void*>((start + kHugePage - 1) / kHugePage * kHugePage);
    ::madvise(data_, padded, MADV_HUGEPAGE);
  }
  ~HostBuffer() override {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
    else std::free(data_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  void* data_ = nullptr;
  size_t size_;
  void* mapping_ = nullptr;  // mmap'ed buffers: the whole mapping, unmapped on destruction
  size_t mapped_bytes_ = 0;
};

// Rows per task so each task has a few thousand values of work.
int64_t grain_for(int64_t width) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1)); }

}  // namespace

CpuBackend::CpuBackend(int threads) : pool_(threads), scratch_(static_cast<size_t>(threads)) {}

std::unique_ptr<Buffer> CpuBackend::allocate(size_t bytes) { return std::make_unique<HostBuffer>(bytes); }

void CpuBackend::make_resident(Buffer& buffer) {
  constexpr uintptr_t kPage = 4096;
  constexpr int64_t kChunk = int64_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(buffer.data()) / kPage * kPage;
  const auto end = reinterpret_cast<uintptr_t>(buffer.data()) + buffer.size();
  const int64_t chunks = static_cast<int64_t>((end - begin + kChunk - 1) / kChunk);
  std::atomic<int> error{0};
  pool_.parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    const uintptr_t from = begin + static_cast<uintptr_t>(first * kChunk);
    const uintptr_t to = std::min(end, begin + static_cast<uintptr_t>(last * kChunk));
    if (::madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) {  // EINVAL: a kernel before 5.14; touch the pages instead
      error.store(errno);
      return;
    }
    const uintptr_t first_byte = std::max(from, reinterpret_cast<uintptr_t>(buffer.data()));
    for (uintptr_t byte = first_byte; byte < to; byte = (byte + kPage) / kPage * kPage) {
      auto* p = reinterpret_cast<volatile uint8_t*>(byte);
      *p = *p;
    }
  });
  if (const int e = error.load(); e != 0) {
    throw_usage("could not back " + std::to_string(buffer.size() >> 20) + " MiB of host memory: " + std::strerror(e));
  }
}

void CpuBackend::upload(Buffer& dst, size_t offset, const void* src, size_t bytes) {
  std::memcpy(static_cast<uint8_t*>(dst.data()) + offset, src, bytes);
}

void CpuBackend::download(void* dst, const Buffer& src, size_t offset, size_t bytes) {
  std::memcpy(dst, static_cast<const uint8_t*>(const_cast<Buffer&>(src).data()) + offset, bytes);
}

void CpuBackend::embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) {
  if (table.type == DType::kFP8_E4M3_B128) {
    throw_unsupported("the cpu backend has no embedding lookup in a block-scaled FP8 table (" +
                      std::to_string(table.rows) + "x" + std::to_string(table.cols) +
                      " FP8_E4M3_B128); FP8 checkpoints such as DeepSeek-V3's keep token embeddings in bf16");
  }
  ref::embed(table, ids, n, out);
}

void CpuBackend::rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  const auto kernel = for_selected_isa(&detail::rms_norm_avx512, &detail::rms_norm_avx2, &ref::rms_norm);
  pool_.parallel_for(n, grain_for(dim), [&](int64_t begin, int64_t end) {
    kernel(x + begin * dim, w, y + begin * dim, end - begin, dim, eps);
  });
}

namespace {

MatrixView view_of(const WeightMatrix& w) { return {w.data, w.type, w.rows, w.cols, w.row_bytes, w.scales}; }

void add_bias(const float* bias, int64_t rows, int64_t n, float* y) {
  if (bias == nullptr) return;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) y[t * rows + r] += bias[r];
  }
}

}  // namespace

void CpuBackend::matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) {
  cpu::matmul(view_of(w), x, n, w.cols, y, w.rows, pool_, background());
  add_bias(bias, w.rows, n, y);
}

void CpuBackend::matmuls(std::span<const MatmulOut> outs, const float* x, int64_t n) {
  constexpr size_t kMaxTargets = 8;
  bool shared = !outs.empty() && outs.size() <= kMaxTargets;
  for (const MatmulOut& o : outs) {
    shared = shared && o.w->cols == outs[0].w->cols && matmul_shares_activations(o.w->type, outs[0].w->type);
  }
  if (!shared) {
    Backend::matmuls(outs, x, n);
    return;
  }
  MatmulTarget targets[kMaxTargets];
  for (size_t i = 0; i < outs.size(); ++i) targets[i] = {view_of(*outs[i].w), outs[i].y, outs[i].w->rows};
  cpu::matmul_multi(targets, static_cast<int>(outs.size()), x, n, outs[0].w->cols, pool_, background());
  for (const MatmulOut& o : outs) add_bias(o.bias, o.w->rows, n, o.y);
}

const float* CpuBackend::rope_rows(const RopeParams& p, int32_t max_position) {
  const bool same = p.rope_dim == rope_key_.rope_dim && p.theta == rope_key_.theta &&
                    p.freq_scale == rope_key_.freq_scale && p.freq_factors == rope_key_.freq_factors;
  if (!same) {
    rope_key_ = p;
    rope_rows_.clear();
  }
  const auto have = static_cast<int64_t>(rope_rows_.size()) / std::max<int64_t>(p.rope_dim, 1);
  if (max_position >= have) {
    rope_rows_.resize(static_cast<size_t>((max_position + 1) * p.rope_dim));
    for (int64_t pos = have; pos <= max_position; ++pos) {
      ref::rope_cache(static_cast<float>(pos), p, rope_rows_.data() + pos * p.rope_dim);
    }
  }
  return rope_rows_.data();
}

const float* CpuBackend::rope_table_for(const int32_t* positions, int64_t n, const RopeParams& p) {
  constexpr int32_t kTabledPositions = 1 << 16;
  int32_t max_position = 0, min_position = 0;
  for (int64_t t = 0; t < n; ++t) {
    max_position = std::max(max_position, positions[t]);
    min_position = std::min(min_position, positions[t]);
  }
  if (max_position >= kTabledPositions || min_position < 0 || p.rope_dim <= 0) return nullptr;
  return rope_rows(p, max_position);
}

void CpuBackend::rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) {
  const float* rows = rope_table_for(positions, n, p);
  if (rows == nullptr) {
    pool_.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      ref::rope(x + begin * n_heads * p.head_dim, positions + begin, end - begin, n_heads, p);
    });
    return;
  }
  const auto rope_heads = for_selected_isa(&detail::rope_heads_avx512, &detail::rope_heads_avx2, &ref::rope_heads);
  pool_.parallel_for(n, std::max<int64_t>(1, 64 / n_heads), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos_sin = rows + static_cast<int64_t>(positions[t]) * p.rope_dim;
      rope_heads(x + t * n_heads * p.head_dim, n_heads, cos_sin, p);
    }
  });
}

namespace {

void check_slots(const KvLayerView& kv, const int32_t* slots, int64_t n) {
  const int64_t capacity = kv.num_blocks * kv.page_size;
  for (int64_t t = 0; t < n; ++t) {
    if (slots[t] < 0 || slots[t] >= capacity) throw Error(ErrorKind::kInternal, "KV slot out of range");
  }
}

// ref::store_v_row / store_k_row with f16 and fp8 rows converted by the vector converters (the same rounding); bf16
// (and f32) rows by quantize_row, as the reference does.
void convert_row(const KvLayerView& kv, const float* row, void* out) {
  const auto width = static_cast<size_t>(kv.n_kv_heads * kv.head_dim);
  if (kv.dtype == DType::kF16) {
    to_f16({row, width}, static_cast<uint16_t*>(out));
  } else if (kv.dtype == DType::kFP8_E4M3) {
    to_fp8_e4m3({row, width}, static_cast<uint8_t*>(out));
  } else {
    quantize_row(kv.dtype, row, static_cast<uint8_t*>(out), static_cast<int64_t>(width));
  }
}

void store_v(const KvLayerView& kv, const float* row, int64_t slot) {
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  convert_row(kv, row, static_cast<uint8_t*>(kv.v) + slot * width * static_cast<int64_t>(dtype_info(kv.dtype).type_size));
}

// `converted`: room for one row in the cache's element type.
void store_k(const KvLayerView& kv, const float* row, int64_t slot, std::vector<uint8_t>& converted) {
  const auto elem = static_cast<int64_t>(dtype_info(kv.dtype).type_size);
  converted.resize(static_cast<size_t>(kv.n_kv_heads * kv.head_dim * elem));
  convert_row(kv, row, converted.data());
  scatter_k_row(kv, converted.data(), elem, slot);
}

}  // namespace

void CpuBackend::store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) {
  check_slots(kv, slots, n);
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  // A decode batch's rows stay on this thread (under two grains); a prefill chunk's are split.
  pool_.parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> converted;
    for (int64_t t = begin; t < end; ++t) {
      store_k(kv, k + t * width, slots[t], converted);
      store_v(kv, v + t * width, slots[t]);
    }
  });
}

void CpuBackend::copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n) {
  check_slots(kv, src, n);
  check_slots(kv, dst, n);
  const auto elem = static_cast<int64_t>(dtype_info(kv.dtype).type_size);
  const int64_t row = kv.n_kv_heads * kv.head_dim * elem;
  auto* k = static_cast<uint8_t*>(kv.k);
  auto* v = static_cast<uint8_t*>(kv.v);
  for (int64_t i = 0; i < n; ++i) {
    if (v == nullptr) {  // a latent cache: one plain row per slot
      std::memmove(k + dst[i] * row, k + src[i] * row, static_cast<size_t>(row));
      continue;
    }
    std::memmove(v + dst[i] * row, v + src[i] * row, static_cast<size_t>(row));
    // K is transposed within pages (kv_layout.h): one element at a time.
    for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
      for (int64_t d = 0; d < kv.head_dim; ++d) {
        std::memcpy(k + k_cache_index(kv, dst[i], h, d) * elem, k + k_cache_index(kv, src[i], h, d) * elem,
                    static_cast<size_t>(elem));
      }
    }
  }
}

void CpuBackend::prefetch_attention(const KvLayerView& kv, const AttentionBatch& batch) {
  // Only batches the AVX-512 token-lane tiles (which walk the ranges) run on, reading more cache than an L2 holds;
  // at most what the L3 keeps until the attention. The prefetch threads slow the matmuls in between a little, and
  // the attention, starting on cached KV, gains more.
  constexpr int64_t kMinTokens = 16, kMinBytes = 1 << 20, kMaxBytes = 16 << 20;
  background_.clear();
  if (batch.n_tokens < kMinTokens || cpu_selected_isa() != CpuIsa::kAvx512) return;
  std::vector<PrefetchRange> ranges = attention_cache_ranges(kv, batch, kMaxBytes);
  int64_t total = 0;
  for (const PrefetchRange& r : ranges) total += r.bytes;
  if (total >= kMinBytes) background_.publish(std::move(ranges), pool_.size());
}

void CpuBackend::attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                           float scale, float* out) {
  background_.clear();
  const int64_t hd = kv.head_dim;
  detail::AttentionGroupKernel group_kernel = nullptr;
  if (supports_kv_dtype(kv.dtype)) {
    const CpuIsa isa = cpu_selected_isa();
    if (isa == CpuIsa::kAvx512 && detail::attention_simd_supports(hd, 16)) {
      group_kernel = &detail::attention_group_avx512;
    } else if (isa >= CpuIsa::kAvx2 && detail::attention_simd_supports(hd, 8)) {
      group_kernel = &detail::attention_group_avx2;
    }
  }
  // A run is consecutive tokens of one sequence (a verify step's draft tokens, a draft tree, a prefill chunk's
  // stretch): the kernel reads each K/V row once for all of them. Its score rows stay within about an L2's worth.
  constexpr int64_t kRunScoreBytes = 512 << 10;
  const int64_t max_run = group_kernel != nullptr ? detail::kMaxRunTokens : 1;
  runs_.clear();
  int64_t max_ctx = 0, longest_run = 1;  // the scratch's sizes
  for (int64_t t = 0; t < batch.n_tokens;) {
    int64_t end = t + 1, span = attention_span(batch, t);
    while (end < batch.n_tokens && end - t < max_run && batch.seq_of_token[end] == batch.seq_of_token[t]) {
      const int64_t wider = std::max(span, attention_span(batch, end));
      if ((end - t + 1) * n_heads * (wider + 16) * static_cast<int64_t>(sizeof(float)) > kRunScoreBytes) break;
      span = wider;
      ++end;
    }
    runs_.push_back({t, end});
    max_ctx = std::max(max_ctx, span);
    longest_run = std::max(longest_run, end - t);
    t = end;
  }
  const auto n_runs = static_cast<int64_t>(runs_.size());
  // A task is one run's heads when there are runs enough to balance the threads (each K/V row read whole, in one
  // stretch: two cores reading interleaved stretches of the same rows are slower); one run's group of heads sharing
  // a KV head while the groups split evenly over the threads or are many (the group's heads share each K row's load
  // and widening); else a run's heads in equal ranges, as many per run as make the tasks a multiple of the threads
  // (a decode step of one sequence: SmolLM2's 3 groups on 2 threads would leave one thread idle a third of the time;
  // two ranges of 5 and 4 heads read one KV head twice instead). Task k of a run has heads [n_heads * k / ranges,
  // n_heads * (k + 1) / ranges): with ranges = n_kv_heads exactly the groups.
  const int64_t threads = pool_.size();
  const int64_t groups = n_runs * kv.n_kv_heads;
  const int64_t ranges = group_kernel == nullptr                          ? n_heads
                         : n_runs >= 8 * threads                          ? 1
                         : groups % threads == 0 || groups >= 4 * threads ? kv.n_kv_heads
                                                                          : std::min(n_heads, threads / std::gcd(n_runs, threads));
  const int64_t range_heads = (n_heads + ranges - 1) / ranges;  // the most heads in one range
  const int64_t scratch_floats =
      group_kernel != nullptr ? detail::attention_scratch_floats(longest_run * range_heads, max_ctx) : max_ctx;
  for (auto& s : scratch_) {
    if (static_cast<int64_t>(s.size()) < scratch_floats) s.resize(static_cast<size_t>(scratch_floats));
  }
  // Tasks differ in context length and a thread may be preempted: they are handed out dynamically, in chunks of
  // a few when there are many (a prefill chunk's thousands of short tasks would otherwise contend on the counter).
  const int64_t total = n_runs * ranges;
  const int64_t chunk = std::max<int64_t>(1, total / (64 * threads));
  std::atomic<int64_t> next{0};
  pool_.run([&](int thread, int) {
    float* scratch = scratch_[static_cast<size_t>(thread)].data();
    for (int64_t first = next.fetch_add(chunk, std::memory_order_relaxed); first < total;
         first = next.fetch_add(chunk, std::memory_order_relaxed)) {
      for (int64_t i = first; i < std::min(total, first + chunk); ++i) {
        const auto [t0, t1] = runs_[static_cast<size_t>(i / ranges)];
        const int64_t k = i % ranges, h = n_heads * k / ranges, h_end = n_heads * (k + 1) / ranges;
        if (group_kernel != nullptr) {
          group_kernel(kv, batch, q, n_heads, scale, t0, t1, h, h_end - h, scratch, out);
        } else {
          ref::attention_head(kv, batch, q, n_heads, scale, t0, h, scratch, out + (t0 * n_heads + h) * hd);
        }
      }
    }
  });
}

void CpuBackend::sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows,
                        int32_t* tokens) {
  if (static_cast<int64_t>(rows.size()) != n) {
    throw Error(ErrorKind::kInternal, "CPU sample: one SampleRow per logits row");
  }
  for (const SampleRow& r : rows) {
    if (const std::string problem = sample_row_problem(r); !problem.empty()) {
      throw Error(ErrorKind::kInternal, "CPU sample: " + problem);
    }
  }
  pool_.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
    thread_local SampleScratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      const std::span<const float> row(logits + i * vocab, static_cast<size_t>(vocab));
      tokens[i] = logits_usable(row) ? draw_row(row, rows[static_cast<size_t>(i)], scratch) : -1;
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) {
      throw Error(ErrorKind::kInternal, "CPU sample: logits row " + std::to_string(i) +
                                            " holds NaN or +inf (the forward pass produced non-finite values)");
    }
  }
}

void CpuBackend::silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  const auto kernel =
      for_selected_isa(&detail::silu_mul_f32_avx512, &detail::silu_mul_f32_avx2, &ref::silu_mul);
  pool_.parallel_for(n, grain_for(ffn), [&](int64_t begin, int64_t end) {
    kernel(gate + begin * in_stride, up + begin * in_stride, in_stride, end - begin, ffn, out + begin * ffn);
  });
}

void CpuBackend::silu_mul_matmul(const WeightMatrix& w, const float* gate, const float* up, int64_t in_stride,
                                 int64_t n, float* act, float* y) {
  const auto kernel =
      for_selected_isa(&detail::silu_mul_f32_avx512, &detail::silu_mul_f32_avx2, &ref::silu_mul);
  cpu::matmul_swiglu(view_of(w), {gate, up, in_stride, kernel}, n, act, y, w.rows, pool_, background());
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
  // A decode batch's residual add stays on this thread (under two grains); a prefill chunk's megabytes are split.
  pool_.parallel_for(n, 64 * 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
  });
}

void CpuBackend::add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  const auto kernel =
      for_selected_isa(&detail::add_rms_norm_avx512, &detail::add_rms_norm_avx2, &ref::add_rms_norm);
  pool_.parallel_for(n, grain_for(dim), [&](int64_t begin, int64_t end) {
    kernel(x + begin * dim, residual + begin * dim, w, y + begin * dim, end - begin, dim, eps);
  });
}

void CpuBackend::rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots,
                                int64_t n, int64_t n_heads, const RopeParams& p, float* q_out) {
  const int64_t hd = p.head_dim, kv_width = kv.n_kv_heads * hd, q_width = n_heads * hd, row = q_width + 2 * kv_width;
  check_slots(kv, slots, n);
  const float* table = rope_table_for(positions, n, p);
  const auto rope_heads = for_selected_isa(&detail::rope_heads_avx512, &detail::rope_heads_avx2, &ref::rope_heads);
  pool_.parallel_for(n, std::max<int64_t>(1, 64 / n_heads), [&](int64_t begin, int64_t end) {
    std::vector<float> cos_sin(table == nullptr ? static_cast<size_t>(p.rope_dim) : 0);
    std::vector<float> k(static_cast<size_t>(kv_width));
    std::vector<uint8_t> converted;
    for (int64_t t = begin; t < end; ++t) {
      const float* in = qkv + t * row;
      float* q = q_out + t * q_width;
      if (table == nullptr) {
        ref::rope_store_qkv_row(kv, in, static_cast<float>(positions[t]), slots[t], n_heads, p, q, cos_sin.data(),
                                k.data());
        continue;
      }
      const float* angles = table + static_cast<int64_t>(positions[t]) * p.rope_dim;
      std::copy(in, in + q_width, q);
      rope_heads(q, n_heads, angles, p);
      std::copy(in + q_width, in + q_width + kv_width, k.data());
      rope_heads(k.data(), kv.n_kv_heads, angles, p);
      store_k(kv, k.data(), slots[t], converted);
      store_v(kv, in + q_width + kv_width, slots[t]);
    }
  });
}

}  // namespace cpu

}  // namespace servetune

// matmul driver: validates shapes, prepares activations (quantize / round) once per call, then hands chunks of
// (rows × tokens) to the selected ISA's range kernel across the thread pool, balancing chunks dynamically.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "backend/cpu/matmul_internal.h"
#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace detail {

ActKind act_kind(DType weight_type) {
  switch (weight_type) {
    case DType::kF32:
    case DType::kFP8_E4M3_B128:  // dequantized inside the kernels, which read the f32 activations as given
      return ActKind::kF32;
    case DType::kF16:
      return ActKind::kF16Rounded;
    case DType::kBF16:
      return ActKind::kBF16Rounded;
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
      return ActKind::kQ8_0;
    case DType::kQ4_1:
    case DType::kQ5_1:
      return ActKind::kQ8_1;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return ActKind::kQ8_K;
    default:
      return ActKind::kDequantF32;
  }
}

namespace {

struct ScratchBuffers {
  static constexpr int kSlots = 5;
  void* ptr[kSlots] = {};
  size_t cap[kSlots] = {};
  ScratchBuffers() = default;
  ScratchBuffers(const ScratchBuffers&) = delete;
  ScratchBuffers& operator=(const ScratchBuffers&) = delete;
  ~ScratchBuffers() {
    for (void* p : ptr) ::operator delete(p, std::align_val_t(64));
  }
};

thread_local ScratchBuffers t_scratch;

}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  const int i = static_cast<int>(slot);
  if (t_scratch.cap[i] < bytes) {
    ::operator delete(t_scratch.ptr[i], std::align_val_t(64));
    t_scratch.ptr[i] = nullptr;
    t_scratch.cap[i] = 0;
    const size_t cap = std::max(bytes + bytes / 4, size_t{4096});
    t_scratch.ptr[i] = ::operator new(cap, std::align_val_t(64));
    t_scratch.cap[i] = cap;
  }
  return t_scratch.ptr[i];
}

}  // namespace detail

namespace {

using namespace detail;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const IsaKernels& kernels_for(CpuIsa isa) {
  if (!cpu_supports(isa)) {
    throw_usage("CPU ISA level " + std::string(cpu_isa_name(isa)) +
                " is not supported by this CPU (best: " + std::string(cpu_isa_name(cpu_best_isa())) + ")");
  }
  switch (isa) {
    case CpuIsa::kAvx512:
      return avx512_kernels();
    case CpuIsa::kAvx2:
      return avx2_kernels();
    case CpuIsa::kReference:
      break;
  }
  return reference_kernels();
}

void validate(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, const float* y,
              int64_t y_stride) {
  if (!matmul_supports(w.type)) {
    throw_unsupported("matmul: weight type " + std::string(dtype_name(w.type)) + " is not supported on CPU");
  }
  const std::optional<int64_t> bytes = dtype_row_bytes(w.type, w.cols);
  const std::string shape =
      std::to_string(w.rows) + "x" + std::to_string(w.cols) + " " + std::string(dtype_name(w.type));
  if (w.rows < 0 || w.cols <= 0 || !bytes) {
    throw_usage("matmul: bad weight shape " + shape + " (cols must be a positive multiple of the block size)");
  }
  if (w.row_bytes < *bytes) throw_usage("matmul: row_bytes " + std::to_string(w.row_bytes) + " too small for " + shape);
  if (w.type == DType::kFP8_E4M3_B128) {
    const int64_t blocks = (w.cols + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
    if (w.scales.data == nullptr || w.scales.stride < blocks || w.scales.row_offset < 0 ||
        w.scales.row_offset >= kFp8ScaleBlock) {
      throw_usage("matmul: " + shape + " needs block scales (a row of " + std::to_string(blocks) +
                  " per 128 rows, a row offset in [0, 128)); got stride " + std::to_string(w.scales.stride) +
                  ", row offset " + std::to_string(w.scales.row_offset) +
                  (w.scales.data == nullptr ? ", no scales" : ""));
    }
  }
  if (n_tokens < 0) throw_usage("matmul: negative n_tokens");
  if (n_tokens > 0 && w.rows > 0) {
    if (w.data == nullptr || x == nullptr || y == nullptr) throw_usage("matmul: null data pointer");
    if (x_stride < w.cols) throw_usage("matmul: x_stride smaller than cols for " + shape);
    if (n_tokens > 1 && y_stride < w.rows) throw_usage("matmul: y_stride smaller than rows for " + shape);
  }
}

// Scratch layout for prepared activations; q/d/s for quantized kinds, f for rounded float kinds.
struct ActStorage {
  int8_t* q = nullptr;
  float* d = nullptr;
  float* s = nullptr;
  float* f = nullptr;
  int16_t* bsums = nullptr;
  int8_t* xp = nullptr;
  float* dt = nullptr;
  float* st = nullptr;
  int32_t* nxs = nullptr;
  int32_t* bst = nullptr;
};

// `token_lanes`: also reserve the token-lane layout of the whole 16-token groups (see Activations).
ActStorage allocate_activations(ActKind kind, int64_t n_tokens, int64_t cols, Activations& a,
                                bool token_lanes = false) {
  ActStorage st;
  if (kind == ActKind::kQ8_0 || kind == ActKind::kQ8_1) {
    a.nb = cols / kQBlock;
    a.d_stride = round_up(a.nb, 16);
    a.q_stride = round_up(cols, kActAlign);
    a.n_groups = token_lanes ? n_tokens / kTokenGroup : 0;
    const int64_t q_bytes = a.q_stride * n_tokens;
    const int64_t scale_bytes = a.d_stride * n_tokens * static_cast<int64_t>(sizeof(float));
    const int64_t lane_tokens = a.n_groups * kTokenGroup;
    // Token-lane quads, scales and sums, and the blocks' negated sums (Q8_0 activations only).
    const int64_t lane_bytes =
        lane_tokens * (a.q_stride + (kind == ActKind::kQ8_0 ? 3 : 2) * a.d_stride * static_cast<int64_t>(sizeof(float)));
    auto* base = static_cast<uint8_t*>(
        thread_scratch(ScratchSlot::kActivations, static_cast<size_t>(q_bytes + 2 * scale_bytes + lane_bytes)));
    st.q = reinterpret_cast<int8_t*>(base);
    st.d = reinterpret_cast<float*>(base + q_bytes);
    if (kind == ActKind::kQ8_1) st.s = reinterpret_cast<float*>(base + q_bytes + scale_bytes);
    a.q = st.q;
    a.d = st.d;
    a.s = st.s;
    if (a.n_groups > 0) {
      uint8_t* lanes = base + q_bytes + 2 * scale_bytes;
      st.xp = reinterpret_cast<int8_t*>(lanes);
      st.dt = reinterpret_cast<float*>(lanes + lane_tokens * a.q_stride);
      if (kind == ActKind::kQ8_1) st.st = st.dt + lane_tokens * a.d_stride;
      if (kind == ActKind::kQ8_0) st.nxs = reinterpret_cast<int32_t*>(st.dt + 2 * lane_tokens * a.d_stride);
      a.xp = st.xp;
      a.dt = st.dt;
      a.st = st.st;
      a.nxs = st.nxs;
    }
  } else if (kind == ActKind::kQ8_K) {
    a.nb = cols / kQK_K;
    a.d_stride = round_up(a.nb, 16);
    a.q_stride = round_up(cols, kActAlign);
    a.bsum_stride = round_up(cols / 16, 32);
    a.n_groups = token_lanes ? n_tokens / kTokenGroup : 0;
    const int64_t q_bytes = a.q_stride * n_tokens;
    const int64_t d_bytes = a.d_stride * n_tokens * static_cast<int64_t>(sizeof(float));
    const int64_t bsum_bytes = a.bsum_stride * n_tokens * static_cast<int64_t>(sizeof(int16_t));
    // Token-lane quads, scales and bsum pairs of the whole groups.
    const int64_t lane_tokens = a.n_groups * kTokenGroup;
    const int64_t lane_bytes = lane_tokens * (a.q_stride + a.d_stride * static_cast<int64_t>(sizeof(float)) +
                                              a.bsum_stride * static_cast<int64_t>(sizeof(int16_t)));
    auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kActivations,
                                                      static_cast<size_t>(q_bytes + d_bytes + bsum_bytes + lane_bytes)));
    st.q = reinterpret_cast<int8_t*>(base);
    st.d = reinterpret_cast<float*>(base + q_bytes);
    st.bsums = reinterpret_cast<int16_t*>(base + q_bytes + d_bytes);
    a.q = st.q;
    a.d = st.d;
    a.bsums = st.bsums;
    if (a.n_groups > 0) {
      uint8_t* lanes = base + q_bytes + d_bytes + bsum_bytes;
      st.xp = reinterpret_cast<int8_t*>(lanes);
      st.dt = reinterpret_cast<float*>(lanes + lane_tokens * a.q_stride);
      st.bst = reinterpret_cast<int32_t*>(st.dt + lane_tokens * a.d_stride);
      a.xp = st.xp;
      a.dt = st.dt;
      a.bst = st.bst;
    }
  } else {
    a.f_stride = round_up(cols, kFloatActCols);
    st.f = static_cast<float*>(
        thread_scratch(ScratchSlot::kActivations, static_cast<size_t>(a.f_stride * n_tokens) * sizeof(float)));
    a.f = st.f;
  }
  return st;
}

void pack_token_groups(const IsaKernels& k, int64_t g0, int64_t g1, const ActStorage& st, const Activations& a) {
  if (a.n_groups > 0) k.pack_token_groups(a, g0, g1, st.xp, st.dt, st.st, st.nxs, st.bst);
}

void prepare_activations(const IsaKernels& k, ActKind kind, const float* x, int64_t x_stride, int64_t t0, int64_t t1,
                         int64_t cols, const ActStorage& st, const Activations& a) {
  switch (kind) {
    case ActKind::kQ8_0:
    case ActKind::kQ8_1:
      k.quantize_q8(x, x_stride, t0, t1, cols, st.q, a.q_stride, st.d, st.s, a.d_stride);
      return;
    case ActKind::kQ8_K:
      k.quantize_q8k(x, x_stride, t0, t1, cols, st.q, a.q_stride, st.d, a.d_stride, st.bsums, a.bsum_stride);
      return;
    case ActKind::kF16Rounded:
      k.round_f16(x, x_stride, t0, t1, cols, st.f, a.f_stride);
      return;
    case ActKind::kBF16Rounded:
      k.round_bf16(x, x_stride, t0, t1, cols, st.f, a.f_stride);
      return;
    case ActKind::kF32:
    case ActKind::kDequantF32:
      return;
  }
}

// prepare_activations for the rows silu(gate) * up, made a few tokens at a time in this thread's scratch (so they
// stay in L1) by the backend's own silu_mul kernel: the same values a separate silu_mul pass would write.
void prepare_swiglu_activations(const IsaKernels& k, ActKind kind, const SwigluInput& in, int64_t t0, int64_t t1,
                                int64_t cols, const ActStorage& st, const Activations& a) {
  constexpr int64_t kTokens = 4;
  auto* rows = static_cast<float*>(thread_scratch(ScratchSlot::kSwiglu, kTokens * cols * sizeof(float)));
  for (int64_t c0 = t0; c0 < t1; c0 += kTokens) {
    const int64_t n = std::min(kTokens, t1 - c0);
    in.silu_mul(in.gate + c0 * in.in_stride, in.up + c0 * in.in_stride, in.in_stride, n, cols, rows);
    ActStorage at = st;  // outputs of tokens [c0, c0 + n), so the chunk's rows are tokens [0, n) of `rows`
    at.q = st.q != nullptr ? st.q + c0 * a.q_stride : nullptr;
    at.d = st.d != nullptr ? st.d + c0 * a.d_stride : nullptr;
    at.s = st.s != nullptr ? st.s + c0 * a.d_stride : nullptr;
    at.bsums = st.bsums != nullptr ? st.bsums + c0 * a.bsum_stride : nullptr;
    at.f = st.f != nullptr ? st.f + c0 * a.f_stride : nullptr;
    prepare_activations(k, kind, rows, cols, 0, n, cols, at, a);
  }
}

// Work split: a grid of row chunks (multiples of kRowChunk) × token chunks (multiples of kTokenGroup), about four
// chunks per thread so a thread slowed by a noisy neighbour does not hold the others up. Chunk edges on those
// multiples keep every output on the same kernel path and tile shape whatever the split, so results do not depend on
// the thread count.
struct Plan {
  int64_t row_chunk = 0;
  int64_t token_chunk = 0;
  int64_t row_chunks = 1;
  int64_t token_chunks = 1;
};

// Long prompts: a chunk covers at most kChunkActivationBytes of prepared activations, so they stay in L2 while the
// chunk's weight panels pass over them (a 2048-token chunk of 1536-wide activations is 3 MB, read again from L3 for
// every 16-row panel).
constexpr int64_t kChunkActivationBytes = 512 * 1024;

Plan make_plan(int64_t rows, int64_t n_tokens, int64_t row_bytes, int64_t act_bytes_per_token, int threads) {
  const int64_t row_tiles = (rows + kRowChunk - 1) / kRowChunk;
  const int64_t token_tiles = (n_tokens + kTokenGroup - 1) / kTokenGroup;
  const int64_t cached_tiles =
      std::max<int64_t>(1, kChunkActivationBytes / std::max<int64_t>(act_bytes_per_token, 1) / kTokenGroup);
  int64_t row_chunks = 1;
  int64_t token_chunks = (token_tiles + cached_tiles - 1) / cached_tiles;
  // Below ~16 KB of weights × tokens a second thread costs more than it saves.
  if (threads > 1 && rows * row_bytes * std::min<int64_t>(n_tokens, 16) >= 16 * 1024) {
    // Small matrices: one chunk per thread (no scheduling traffic); larger ones: four, handed out dynamically.
    const int64_t target = (rows * row_bytes < 256 * 1024 ? 1 : 4) * static_cast<int64_t>(threads);
    row_chunks = std::min(row_tiles, target);
    if (row_chunks < 2 * threads && token_tiles > 1) {
      token_chunks = std::max(token_chunks, std::min(token_tiles, (target + row_chunks - 1) / row_chunks));
    }
  }
  Plan p;
  p.row_chunk = (row_tiles + row_chunks - 1) / row_chunks * kRowChunk;
  p.row_chunks = (rows + p.row_chunk - 1) / p.row_chunk;
  p.token_chunk = (token_tiles + token_chunks - 1) / token_chunks * kTokenGroup;
  p.token_chunks = (n_tokens + p.token_chunk - 1) / p.token_chunk;
  return p;
}

// Bytes of prepared activations the kernels read per token (see Activations): token-lane quants and two scale rows
// (Q8_0: the blocks' negated sums instead of Q8_1's sums), Q8_K quants with their scales and sums, or f32 rows.
int64_t activation_bytes_per_token(ActKind kind, int64_t cols) {
  switch (kind) {
    case ActKind::kQ8_0:
    case ActKind::kQ8_1:
      return cols + cols / kQBlock * 8;
    case ActKind::kQ8_K:
      return cols + cols / kQK_K * 4 + cols / 16 * 2;
    default:
      return static_cast<int64_t>(sizeof(float)) * cols;
  }
}

// One weight matrix of a (possibly multi-matrix) matmul call, with its kernel, output and work split.
struct Job {
  Weights w;
  RangeKernel kernel;
  float* y;
  int64_t y_stride;
  Plan plan;
  int64_t first_chunk;
};

constexpr int kMaxJobs = 16;

// Runs targets that share cols, activation scheme and activations x in one parallel region. With `swiglu`, the
// activations are silu(gate) * up, made while they are prepared (x, x_stride: its gate rows); the scheme must
// prepare them (needs_prep).
void run_jobs(const IsaKernels& k, const MatmulTarget* targets, int n_targets, const float* x, int64_t n_tokens,
              int64_t x_stride, ThreadPool* pool, const SwigluInput* swiglu = nullptr,
              BackgroundPrefetch* background = nullptr) {
  const int threads = pool != nullptr ? pool->size() : 1;
  const int64_t cols = targets[0].w.cols;
  const ActKind kind = act_kind(targets[0].w.type);
  Job jobs[kMaxJobs];
  int n_jobs = 0;
  int64_t chunks = 0;
  for (int i = 0; i < n_targets; ++i) {
    const MatrixView& mv = targets[i].w;
    validate(mv, x, n_tokens, x_stride, targets[i].y, targets[i].y_stride);
    if (mv.cols != cols || act_kind(mv.type) != kind) {
      throw_usage("matmul_multi: all matrices must have the same cols and activation scheme");
    }
    if (n_tokens == 0 || mv.rows == 0) continue;
    Job& j = jobs[n_jobs++];
    j.w = {static_cast<const uint8_t*>(mv.data), mv.type, mv.rows, mv.cols, mv.row_bytes, mv.scales};
    j.kernel = kind == ActKind::kDequantF32 ? dequant_kernel : k.kernel_for(mv.type);
    if (j.kernel == nullptr) j.kernel = reference_kernels().kernel_for(mv.type);
    j.y = targets[i].y;
    j.y_stride = targets[i].y_stride;
    j.plan = make_plan(mv.rows, n_tokens, mv.row_bytes, activation_bytes_per_token(kind, cols), threads);
    j.first_chunk = chunks;
    chunks += j.plan.row_chunks * j.plan.token_chunks;
  }
  if (n_jobs == 0) return;

  const bool needs_prep = kind != ActKind::kF32 && kind != ActKind::kDequantF32;
  if (swiglu != nullptr && !needs_prep) throw Error(ErrorKind::kInternal, "matmul: SwiGLU input for f32 activations");
  const auto prepare = [&](int64_t t0, int64_t t1, const ActStorage& st, const Activations& a) {
    if (swiglu != nullptr) {
      prepare_swiglu_activations(k, kind, *swiglu, t0, t1, cols, st, a);
    } else {
      prepare_activations(k, kind, x, x_stride, t0, t1, cols, st, a);
    }
  };
  const bool parallel = chunks > 1 && threads > 1;
  // Few activations (decode, up to 256 KB of f32 input: a 32-sequence batch at 2048 columns): every thread prepares
  // its own copy inside the parallel region, which overlaps that work with the wake-up, needs no barrier and keeps
  // the tiles' reads in the thread's own caches. Preparation is deterministic, so all copies are identical. (A
  // shared copy's barrier costs a decode step more than the duplicated preparation.)
  // Not with SwiGLU once every thread gets a token group of its own: silu costs several times the quantization, so
  // splitting it over the threads pays for the barrier.
  const bool split_swiglu = swiglu != nullptr && n_tokens >= threads * kTokenGroup;
  const bool private_prep = needs_prep && parallel && n_tokens * cols <= 64 * 1024 && !split_swiglu;
  // More: one shared copy, its tokens split over the threads of the region, then a barrier before the chunks.
  const bool shared_prep_in_region = needs_prep && parallel && !private_prep;
  const bool token_lanes = k.pack_token_groups != nullptr && n_tokens >= kTokenGroup;
  Activations shared;
  ActStorage shared_st;
  if (!needs_prep) {
    shared.f = x;
    shared.f_stride = x_stride;
  } else if (!private_prep) {
    shared_st = allocate_activations(kind, n_tokens, cols, shared, token_lanes);
    if (!shared_prep_in_region) {
      if (threads > 1 && n_tokens * cols >= 32 * 1024) {
        pool->parallel_for(n_tokens, std::max<int64_t>(1, 8192 / cols), [&](int64_t t0, int64_t t1) {
          prepare(t0, t1, shared_st, shared);
        });
        pool->parallel_for(shared.n_groups, 1,
                           [&](int64_t g0, int64_t g1) { pack_token_groups(k, g0, g1, shared_st, shared); });
      } else {
        prepare(0, n_tokens, shared_st, shared);
        pack_token_groups(k, 0, shared.n_groups, shared_st, shared);
      }
    }
  }

  auto run_chunk = [&](const Activations& a, int64_t i) {
    int j = 0;
    while (j + 1 < n_jobs && jobs[j + 1].first_chunk <= i) ++j;
    const Job& job = jobs[j];
    const Plan& plan = job.plan;
    const int64_t c = i - job.first_chunk;
    const int64_t r0 = (c % plan.row_chunks) * plan.row_chunk;
    const int64_t t0 = (c / plan.row_chunks) * plan.token_chunk;
    job.kernel(job.w, a, r0, std::min(job.w.rows, r0 + plan.row_chunk), t0, std::min(n_tokens, t0 + plan.token_chunk),
               job.y, job.y_stride);
  };
  if (!parallel) {
    if (background != nullptr) shared.background = background->cursor(0);
    for (int64_t i = 0; i < chunks; ++i) run_chunk(shared, i);
    return;
  }
  std::atomic<int64_t> next{threads};
  PhaseBarrier prepared;
  pool->run([&](int index, int n) {
    if (shared_prep_in_region) {
      // Thread i prepares tokens [edge(i), edge(i + 1)), on group boundaries, and packs the whole groups among them.
      const int64_t unit = shared.n_groups > 0 ? kTokenGroup : 1;
      auto edge = [&](int i) { return i == n ? n_tokens : n_tokens * i / n / unit * unit; };
      const int64_t t0 = edge(index), t1 = edge(index + 1);
      try {
        prepare(t0, t1, shared_st, shared);
        pack_token_groups(k, t0 / kTokenGroup, std::min(t1 / kTokenGroup, shared.n_groups), shared_st, shared);
      } catch (...) {
        prepared.arrive_and_wait(n);  // never leave the others waiting; run() rethrows and the outputs are discarded
        throw;
      }
      prepared.arrive_and_wait(n);
    }
    if (index >= chunks) return;
    Activations local = shared;
    if (background != nullptr) local.background = background->cursor(index);
    if (private_prep) {
      const ActStorage st = allocate_activations(kind, n_tokens, cols, local, token_lanes);
      prepare(0, n_tokens, st, local);
      pack_token_groups(k, 0, local.n_groups, st, local);
    }
    if (n == 1) {  // a nested call, run inline on this thread alone
      for (int64_t i = 0; i < chunks; ++i) run_chunk(local, i);
      return;
    }
    for (int64_t i = index; i < chunks; i = next.fetch_add(1, std::memory_order_relaxed)) {
      run_chunk(local, i);
      if (chunks <= threads) break;
    }
  });
}

void run_matmul(const IsaKernels& k, const MatrixView& mv, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                int64_t y_stride, ThreadPool* pool, BackgroundPrefetch* background = nullptr) {
  const MatmulTarget target{mv, y, y_stride};
  run_jobs(k, &target, 1, x, n_tokens, x_stride, pool, nullptr, background);
}

}  // namespace

bool matmul_supports(DType weight_type) {
  return act_kind(weight_type) != ActKind::kDequantF32 || can_dequantize(weight_type);
}

void matmul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y, int64_t y_stride,
            ThreadPool& pool, BackgroundPrefetch* background) {
  run_matmul(kernels_for(cpu_selected_isa()), w, x, n_tokens, x_stride, y, y_stride, &pool, background);
}

void matmul_with_isa(CpuIsa isa, const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                     int64_t y_stride, ThreadPool& pool) {
  run_matmul(kernels_for(isa), w, x, n_tokens, x_stride, y, y_stride, &pool);
}

bool matmul_shares_activations(DType a, DType b) { return act_kind(a) == act_kind(b); }

void matmul_swiglu(const MatrixView& w, const SwigluInput& in, int64_t n_tokens, float* rows, float* y,
                   int64_t y_stride, ThreadPool& pool, BackgroundPrefetch* background) {
  const IsaKernels& k = kernels_for(cpu_selected_isa());
  const ActKind kind = act_kind(w.type);
  if (kind == ActKind::kF32 || kind == ActKind::kDequantF32) {  // the kernels read f32 rows: write them out
    pool.parallel_for(n_tokens, 1, [&](int64_t t0, int64_t t1) {
      in.silu_mul(in.gate + t0 * in.in_stride, in.up + t0 * in.in_stride, in.in_stride, t1 - t0, w.cols,
                  rows + t0 * w.cols);
    });
    run_matmul(k, w, rows, n_tokens, w.cols, y, y_stride, &pool, background);
    return;
  }
  const MatmulTarget target{w, y, y_stride};
  run_jobs(k, &target, 1, in.gate, n_tokens, in.in_stride, &pool, &in, background);
}

void matmul_multi(const MatmulTarget* targets, int n_targets, const float* x, int64_t n_tokens, int64_t x_stride,
                  ThreadPool& pool, BackgroundPrefetch* background) {
  const IsaKernels& k = kernels_for(cpu_selected_isa());
  for (int i = 0; i < n_targets; i += kMaxJobs) {
    run_jobs(k, targets + i, std::min(kMaxJobs, n_targets - i), x, n_tokens, x_stride, &pool, nullptr, background);
  }
}

void matmul_reference(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                      int64_t y_stride) {
  run_matmul(reference_kernels(), w, x, n_tokens, x_stride, y, y_stride, nullptr);
}

void quantize_activations(CpuIsa isa, const float* x, int64_t n, int8_t* q, float* d, float* s) {
  if (n % kQBlock != 0) throw_usage("quantize_activations: n must be a multiple of 32");
  // The quantizers write zero padding, so go through padded scratch and copy out.
  const int64_t nb = n / kQBlock;
  const int64_t q_stride = round_up(n, kActAlign);
  const int64_t d_stride = round_up(nb, 16);
  auto* base = static_cast<uint8_t*>(
      thread_scratch(ScratchSlot::kActivations, static_cast<size_t>(q_stride + 2 * d_stride * 4)));
  auto* qp = reinterpret_cast<int8_t*>(base);
  auto* dp = reinterpret_cast<float*>(base + q_stride);
  float* sp = s != nullptr ? dp + d_stride : nullptr;
  kernels_for(isa).quantize_q8(x, n, 0, 1, n, qp, q_stride, dp, sp, d_stride);
  std::copy(qp, qp + n, q);
  std::copy(dp, dp + nb, d);
  if (s != nullptr) std::copy(sp, sp + nb, s);
}

void quantize_activations_q8k(CpuIsa isa, const float* x, int64_t n, int8_t* q, float* d, int16_t* bsums) {
  if (n % kQK_K != 0) throw_usage("quantize_activations_q8k: n must be a multiple of 256");
  Activations a;
  const ActStorage st = allocate_activations(ActKind::kQ8_K, 1, n, a);
  kernels_for(isa).quantize_q8k(x, n, 0, 1, n, st.q, a.q_stride, st.d, a.d_stride, st.bsums, a.bsum_stride);
  std::copy(st.q, st.q + n, q);
  std::copy(st.d, st.d + n / kQK_K, d);
  std::copy(st.bsums, st.bsums + n / 16, bsums);
}

}  // namespace servetune::cpu

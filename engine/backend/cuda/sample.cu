// Sampling on the device, one block per logits row, with the host Sampler's semantics (runtime/sampler.cpp): greedy
// argmax (lowest id among ties); plain temperature walks the tokens in id order; top-k / top-p / min-p walk them sorted
// by logit (ties by id) without sorting: each cut and the draw is a weighted radix select over the logits' order keys
// (eight 4-bit digit passes), then the tied group of the chosen logit is resolved in id order. Probabilities are
// float exp like the plain host path (the host's filtered path uses double exp); every sum is in double and in a fixed
// order, so a row's draw is deterministic. A token differs from the host's only when uniform * mass falls within
// rounding of a cumulative boundary. A row holding a NaN or +inf logit gets token -1 (the backend raises it as an
// error): the model produced garbage, and an argmax over it would still hand back a plausible id.
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace servetune::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kBins = 16;  // one 4-bit digit of the order key per pass

// Larger key = larger float (for non-NaN values), so key order is logit order.
__device__ inline uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);  // -0 + 0 = +0: the signed zeros tie, as the host's ranking has them
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ inline float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7FFFFFFFu) : ~key);
}
__device__ inline bool reached(double sum, double target, bool inclusive) { return inclusive ? sum >= target : sum > target; }

// Sums kBins per-thread values over the block, the same way every time; every thread gets the totals.
__device__ void block_sum_bins(double (&v)[kBins], double (*shared)[kBins]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int b = 0; b < kBins; ++b) v[b] = warp_sum(v[b]);
  if (lane == 0) {
#pragma unroll
    for (int b = 0; b < kBins; ++b) shared[warp][b] = v[b];
  }
  __syncthreads();
#pragma unroll
  for (int b = 0; b < kBins; ++b) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += shared[w][b];
    v[b] = total;
  }
  __syncthreads();  // the shared partials may be overwritten by the next call
}

__device__ double block_sum(double v, double (*shared)[kBins]) {
  double bins[kBins] = {v};
  block_sum_bins(bins, shared);
  return bins[0];
}

struct Scratch {
  double bins[kWarps][kBins];
  double chunk[kThreads];
  long long claim[kThreads];
  float best_value[kWarps];
  long long best_index[kWarps];
};

// One row of logits and the draw's parameters.
struct Row {
  const float* logits;
  int64_t vocab;
  float best, inv_t, floor, min_p;
  bool filtered;
  // Kept elements sort at or before (cut_key, cut_id) (key descending, id ascending); cut_id < 0: no cut.
  uint32_t cut_key;
  long long cut_id;

  __device__ float prob(float l) const { return expf((l - best) * inv_t); }
  __device__ bool kept(float l, int64_t id) const {
    if (!filtered) return true;
    if (!(l >= floor)) return false;
    if (cut_id >= 0) {
      const uint32_t k = order_key(l);
      if (k < cut_key || (k == cut_key && id > cut_id)) return false;
    }
    return min_p <= 0.0f || prob(l) >= min_p;
  }
  __device__ double weight(float l, bool mass) const { return mass ? static_cast<double>(prob(l)) : 1.0; }
};

// The first id, in id order, at which the running sum of weight over members passes `target` (>= when inclusive);
// -1 when rounding leaves it short. Each thread owns one contiguous chunk, so the chunks' sums scan in id order.
template <typename Weight>
__device__ long long select_in_id_order(int64_t vocab, Weight weight, double target, bool inclusive, Scratch& s) {
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * chunk, hi = lo + chunk < vocab ? lo + chunk : vocab;
  double local = 0.0;
  for (int64_t i = lo; i < hi; ++i) local += weight(i);
  s.chunk[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      const double c = s.chunk[t];
      s.chunk[t] = run;
      run += c;
    }
  }
  __syncthreads();
  const double before = s.chunk[threadIdx.x];
  long long claim = -1;
  if (!reached(before, target, inclusive) && reached(before + local, target, inclusive)) {
    double run = before;
    for (int64_t i = lo; i < hi && claim < 0; ++i) {
      run += weight(i);
      if (reached(run, target, inclusive)) claim = i;
    }
    if (claim < 0) claim = hi - 1;  // the chunk's sum reached the target; summing from `before` rounded short
  }
  s.claim[threadIdx.x] = claim;
  __syncthreads();
  long long found = -1;
  for (int t = 0; t < kThreads && found < 0; ++t) found = s.claim[t];
  __syncthreads();
  return found;
}

// The last token, in id order, that `member` accepts (-1: none).
template <typename Member>
__device__ long long last_in_id_order(int64_t vocab, Member member, Scratch& s) {
  double count = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) count += member(i) ? 1.0 : 0.0;
  count = block_sum(count, s.bins);
  if (count < 1.0) return -1;
  return select_in_id_order(vocab, [&](int64_t i) { return member(i) ? 1.0 : 0.0; }, count - 1.0, false, s);
}

struct Pick {
  uint32_t key;
  long long id;  // -1: the kept weight never reached the target
};

// Among the kept tokens in sorted order (logit descending, id ascending), the first at which the running sum of weight
// (mass: probabilities; else 1 per token) passes `target` (>= when inclusive).
__device__ Pick select_sorted(const Row& row, bool mass, double target, bool inclusive, Scratch& s) {
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;  // weight of kept tokens whose key is above the current bucket
  for (int shift = 28; shift >= 0; shift -= 4) {
    double bins[kBins] = {};
    for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
      const float l = row.logits[i];
      const uint32_t k = order_key(l);
      if ((k & mask) == prefix && row.kept(l, i)) bins[(k >> shift) & (kBins - 1)] += row.weight(l, mass);
    }
    block_sum_bins(bins, s.bins);
    int chosen = -1;
    for (int b = kBins - 1; b >= 0; --b) {
      if (bins[b] > 0.0 && reached(above + bins[b], target, inclusive)) {
        chosen = b;
        break;
      }
      above += bins[b];
    }
    if (chosen < 0) return Pick{0, -1};
    prefix |= static_cast<uint32_t>(chosen) << shift;
    mask |= static_cast<uint32_t>(kBins - 1) << shift;
  }
  // Tokens tied at this logit all weigh w: the boundary is the j-th of them in id order.
  const float value = key_value(prefix);
  const double w = row.weight(value, mass);
  const double steps = (target - above) / w;
  double j = inclusive ? ceil(steps) - 1.0 : floor(steps);
  if (j < 0.0) j = 0.0;
  const auto tied = [&](int64_t i) { const float l = row.logits[i]; return order_key(l) == prefix && row.kept(l, i); };
  const long long tie = select_in_id_order(row.vocab, [&](int64_t i) { return tied(i) ? 1.0 : 0.0; }, j, false, s);
  return Pick{prefix, tie >= 0 ? tie : last_in_id_order(row.vocab, tied, s)};  // j past the last tie: rounding
}

// Largest logit and its lowest id; `nonfinite` (every thread) whether any logit is NaN or +inf.
__device__ void block_argmax(const float* l, int64_t vocab, Scratch& s, float& best, long long& arg, bool& nonfinite) {
  float v = -INFINITY;
  long long idx = -1;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = l[i];
    if (!(x < INFINITY)) bad = 1;  // NaN compares false, +inf is not below itself
    if (x > v || idx < 0) {
      v = x;
      idx = i;
    }
  }
  nonfinite = __syncthreads_or(bad) != 0;
  for (int mask = kWarpSize / 2; mask > 0; mask >>= 1) {
    const float ov = SERVETUNE_SHFL_XOR(v, mask);
    const long long oi = SERVETUNE_SHFL_XOR(idx, mask);
    if (oi >= 0 && (idx < 0 || ov > v || (ov == v && oi < idx))) {
      v = ov;
      idx = oi;
    }
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    s.best_value[warp] = v;
    s.best_index[warp] = idx;
  }
  __syncthreads();
  best = s.best_value[0];
  arg = s.best_index[0];
  for (int w = 1; w < kWarps; ++w) {
    const float ov = s.best_value[w];
    const long long oi = s.best_index[w];
    if (oi >= 0 && (arg < 0 || ov > best || (ov == best && oi < arg))) {
      best = ov;
      arg = oi;
    }
  }
  __syncthreads();
}

__global__ void sample_kernel(const float* logits, int64_t vocab, const SampleRow* rows, int32_t* out) {
  __shared__ Scratch s;
  const SampleRow p = rows[blockIdx.x];
  Row row{};
  row.logits = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  row.vocab = vocab;
  long long arg = 0;
  bool nonfinite = false;
  block_argmax(row.logits, vocab, s, row.best, arg, nonfinite);
  if (nonfinite) {  // uniform across the block
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }
  long long token = arg;
  if (p.temperature > 0.0f) {
    row.inv_t = 1.0f / p.temperature;
    row.filtered = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
    row.cut_id = -1;
    if (!row.filtered) {
      // Plain temperature: the host walks the probabilities in id order.
      const auto weight = [&](int64_t i) { return static_cast<double>(row.prob(row.logits[i])); };
      double total = 0.0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) total += weight(i);
      total = block_sum(total, s.bins);
      token = select_in_id_order(vocab, weight, p.uniform * total, false, s);
      if (token < 0) token = last_in_id_order(vocab, [&](int64_t i) { return weight(i) > 0.0; }, s);  // rounding, as the host
      if (token < 0) token = arg;
    } else {
      // Candidates within e^-40 of the best, then top-k, top-p and min-p as the host's filtered_candidates.
      row.floor = row.best - 40.0f * p.temperature;
      row.min_p = 0.0f;
      if (p.top_k > 0) {
        const Pick k = select_sorted(row, false, static_cast<double>(p.top_k), true, s);
        if (k.id >= 0) {  // fewer candidates than top_k keep them all
          row.cut_key = k.key;
          row.cut_id = k.id;
        }
      }
      if (p.top_p < 1.0f) {
        double total = 0.0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
          const float l = row.logits[i];
          if (row.kept(l, i)) total += row.weight(l, true);
        }
        total = block_sum(total, s.bins);
        const Pick c = select_sorted(row, true, static_cast<double>(p.top_p) * total, true, s);
        if (c.id >= 0) {
          row.cut_key = c.key;
          row.cut_id = c.id;
        }
      }
      row.min_p = p.min_p;  // the best token's probability is 1, so min-p keeps those at least min_p
      double total = 0.0, count = 0.0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float l = row.logits[i];
        if (row.kept(l, i)) {
          total += row.weight(l, true);
          count += 1.0;
        }
      }
      total = block_sum(total, s.bins);
      count = block_sum(count, s.bins);
      Pick d = select_sorted(row, true, p.uniform * total, false, s);
      if (d.id < 0) d = select_sorted(row, false, count - 1.0, false, s);  // rounding: the last kept token
      token = d.id >= 0 ? d.id : arg;
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(token);
}

}  // namespace

void launch_sample(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens,
                   cudaStream_t stream) {
  if (n == 0) return;
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, vocab, rows, tokens);
  check(cudaGetLastError(), "sample kernel");
}

}  // namespace servetune::gpu

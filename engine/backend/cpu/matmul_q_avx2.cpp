// AVX2 kernels for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights × Q8 activations, plus the activation quantizer (ggml's
// x86 scheme). Whole 16-token groups go to the token-lane GEMM (matmul_tl_avx2.cpp); the other tokens (decode of one
// to 15 sequences) use rows decoded once into a panel, then 2×4 (rows × tokens) tiles of vpmaddubsw + vpmaddwd dots
// (signed weights use the |w|, sign(x, w) trick, so 16-bit pair sums cannot saturate); the eight (row, token) block
// dots of a tile are reduced together into one vector of exact integer sums, and one fma per block follows the
// canonical arithmetic of matmul_reference.cpp.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx2;

constexpr int64_t kGroupRows = 16;
constexpr int kRows = 2;  // register tile: 2 rows × 4 tokens (16 ymm registers)
constexpr int kTokens = 4;

inline float f16_round_trip(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_q8(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q, int64_t q_stride,
                 float* d, float* s, int64_t d_stride) {
  const int64_t nb = cols / kQBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    float* dt = d + t * d_stride;
    float* st = s != nullptr ? s + t * d_stride : nullptr;
    for (int64_t b = 0; b < nb; ++b) {
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xt + b * kQBlock + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float max_abs = _mm_cvtss_f32(m4);
      const float dd = max_abs / 127.0f;
      const __m256 id = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
      __m256i iv[4];
      for (int i = 0; i < 4; ++i) {
        iv[i] =
            _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);
      const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
      const __m256i packed =
          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + b * kQBlock), packed);
      dt[b] = f16_round_trip(dd);
      if (st != nullptr) {
        const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3])));
        st[b] = f16_round_trip(dd * static_cast<float>(sum));
      }
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) {
      dt[b] = 0.0f;
      if (st != nullptr) st[b] = 0.0f;
    }
  }
}

// Decoded rows: per row and block 32 bytes of quants (Q4_1: u8 nibbles; Q4_0, Q8_0: signed values) followed, for
// signed types, by 32 bytes of their absolute values; f32 scales d and (Q4_1) mins m per block.
struct Panel {
  uint8_t* q;
  float* d;
  float* m;
  int64_t q_stride;
  int64_t d_stride;
};

template <DType kType>
constexpr bool has_min() {
  return kType == DType::kQ4_1 || kType == DType::kQ5_1;
}

template <DType kType>
constexpr int64_t panel_block_bytes() {
  return has_min<kType>() ? 32 : 64;
}

template <DType kType>
void decode_row(const uint8_t* row, int64_t b0, int64_t nbc, const Panel& p, int64_t r) {
  uint8_t* out = p.q + r * p.q_stride;
  float* dout = p.d + r * p.d_stride;
  float* mout = p.m + r * p.d_stride;
  for (int64_t b = 0; b < nbc; ++b) {
    // Software prefetch ~6 KB ahead: short weight streams do not give the hardware prefetchers time to ramp up.
    _mm_prefetch(reinterpret_cast<const char*>(row) + (b0 + b) * sizeof(BlockOf<kType>) + 6144, _MM_HINT_T0);
    const auto* blk = reinterpret_cast<const BlockOf<kType>*>(row) + b0 + b;
    __m256i qv = block_codes<kType>(blk);
    if constexpr (kType == DType::kQ4_0) qv = _mm256_sub_epi8(qv, _mm256_set1_epi8(8));
    if constexpr (kType == DType::kQ5_0) qv = _mm256_sub_epi8(qv, _mm256_set1_epi8(16));
    uint16_t dh = 0, mh = 0;
    std::memcpy(&dh, &blk->d, 2);
    if constexpr (has_min<kType>()) std::memcpy(&mh, &blk->m, 2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + b * panel_block_bytes<kType>()), qv);
    if constexpr (!has_min<kType>()) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + b * 64 + 32), _mm256_sign_epi8(qv, qv));
    }
    dout[b] = _cvtsh_ss(dh);
    if constexpr (has_min<kType>()) mout[b] = _cvtsh_ss(mh);
  }
  for (int64_t b = nbc; b < (nbc + 7) / 8 * 8; ++b) {
    dout[b] = 0.0f;
    mout[b] = 0.0f;
  }
}

struct TileArgs {
  const uint8_t* pq;
  const float* pd;
  const float* pm;
  int64_t pq_stride, pd_stride;
  const int8_t* xq;
  const float* xd;
  const float* xs;
  int64_t xq_stride, xd_stride;
  int64_t blocks;
  float* y;
  int64_t y_stride;
};

// Lane j of the result: the sum of v[j]'s eight lanes (exact integer adds).
inline __m256i reduce8(const __m256i* v) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20), _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

template <DType kType, int R, int T>
void compute_tile(const TileArgs& g) {
  static_assert(R <= 2 && T <= 4, "lane r * 4 + t holds row r, token t");
  constexpr bool kSigned = !has_min<kType>();
  constexpr int64_t kStep = panel_block_bytes<kType>();
  __m256 acc = _mm256_setzero_ps();
  float mins[R][T] = {};
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < g.blocks; ++b) {
    if constexpr (has_min<kType>()) {
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < T; ++t) {
          mins[r][t] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(g.pm[r * g.pd_stride + b]),
                                                  _mm_set_ss(g.xs[t * g.xd_stride + b]), _mm_set_ss(mins[r][t])));
        }
      }
    }
    __m256i dots[8];
    for (auto& v : dots) v = _mm256_setzero_si256();
    alignas(32) float dw[8] = {}, dx[8] = {};
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.xq + t * g.xq_stride + b * 32));
      for (int r = 0; r < R; ++r) {
        const uint8_t* wp = g.pq + r * g.pq_stride + b * kStep;
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
        __m256i pairs;
        if constexpr (kSigned) {
          const __m256i aw = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32));
          pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv));
        } else {
          pairs = _mm256_maddubs_epi16(wv, xv);
        }
        dots[r * 4 + t] = _mm256_madd_epi16(pairs, ones);
        dw[r * 4 + t] = g.pd[r * g.pd_stride + b];
        dx[r * 4 + t] = g.xd[t * g.xd_stride + b];
      }
    }
    const __m256 scale = _mm256_mul_ps(_mm256_load_ps(dw), _mm256_load_ps(dx));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(reduce8(dots)), acc);
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, acc);
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) g.y[t * g.y_stride + r] = has_min<kType>() ? out[r * 4 + t] + mins[r][t] : out[r * 4 + t];
  }
}

using TileFn = void (*)(const TileArgs&);

template <DType kType, int R>
TileFn tile_for_tokens(int T) {
  return T == 1   ? compute_tile<kType, R, 1>
         : T == 2 ? compute_tile<kType, R, 2>
         : T == 3 ? compute_tile<kType, R, 3>
                  : compute_tile<kType, R, 4>;
}

// Rows in groups of kGroupRows decoded once (whole rows: the canonical lane sums run over all blocks), then every
// 2-row × 4-token tile of the token range.
template <DType kType>
void quant_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  // Whole token groups go to the token-lane GEMM (t0 is a multiple of kTokenGroup); the rest to 2 × 4 tiles.
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx2_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  const int64_t nb = a.nb;
  Panel panel;
  panel.q_stride = nb * panel_block_bytes<kType>();
  panel.d_stride = (nb + 15) / 16 * 16;
  const size_t panel_bytes = static_cast<size_t>(kGroupRows * (panel.q_stride + 2 * panel.d_stride * 4));
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kPanel, panel_bytes));
  panel.q = base;
  panel.d = reinterpret_cast<float*>(base + kGroupRows * panel.q_stride);
  panel.m = panel.d + kGroupRows * panel.d_stride;
  for (int64_t g0 = r0; g0 < r1; g0 += kGroupRows) {
    const int64_t rows = imin(kGroupRows, r1 - g0);
    for (int64_t r = 0; r < rows; ++r) decode_row<kType>(w.data + (g0 + r) * w.row_bytes, 0, nb, panel, r);
    TileArgs args;
    args.pq_stride = panel.q_stride;
    args.pd_stride = panel.d_stride;
    args.xq_stride = a.q_stride;
    args.xd_stride = a.d_stride;
    args.blocks = nb;
    args.y_stride = y_stride;
    for (int64_t t = t0; t < t1; t += kTokens) {
      const int nt = static_cast<int>(imin(kTokens, t1 - t));
      args.xq = a.q + t * a.q_stride;
      args.xd = a.d + t * a.d_stride;
      args.xs = a.s != nullptr ? a.s + t * a.d_stride : nullptr;
      for (int64_t r = 0; r < rows; r += kRows) {
        const int nr = static_cast<int>(imin(kRows, rows - r));
        args.pq = panel.q + r * panel.q_stride;
        args.pd = panel.d + r * panel.d_stride;
        args.pm = panel.m + r * panel.d_stride;
        args.y = y + t * y_stride + g0 + r;
        (nr == 1 ? tile_for_tokens<kType, 1>(nt) : tile_for_tokens<kType, 2>(nt))(args);
      }
    }
  }
}

RangeKernel kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return quant_range<DType::kQ4_0>;
    case DType::kQ4_1:
      return quant_range<DType::kQ4_1>;
    case DType::kQ5_0:
      return quant_range<DType::kQ5_0>;
    case DType::kQ5_1:
      return quant_range<DType::kQ5_1>;
    case DType::kQ8_0:
      return quant_range<DType::kQ8_0>;
    default:
      return avx2_float_kernel_for(type);
  }
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels kernels{quantize_q8, quantize_q8k_reference, avx2_round_f16, avx2_round_bf16,
                                  kernel_for,  avx2_pack_token_groups};
  return kernels;
}

}  // namespace servetune::cpu::detail

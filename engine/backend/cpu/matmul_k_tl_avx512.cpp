// Token-lane AVX-512 VNNI GEMM for k-quant weights (Q4_K, Q5_K, Q6_K; prefill and batched decode, groups of 16
// tokens): as matmul_tl_avx512.cpp, each zmm lane is a token and one vpdpbusd multiplies a broadcast weight quad by 16
// tokens' activation quads. A sub-block's quads chain into exact integer sums, one vpmulld applies its scale, and
// the super-block's sums take one fma per row and token (and one for the mins): the canonical arithmetic of
// matmul_k_reference.cpp.
#include <cstring>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/matmul_k_simd.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;
using kquant::Traits;

constexpr int64_t kRowsPerPanel = 16;
constexpr int64_t kPrefetchPanels = 2;  // weights are prefetched this many panels ahead of their decode
constexpr int kRows = 4;                // register tile: 4 rows × 16 tokens of one or kGroupsPerTile groups
constexpr int kGroupsPerTile = 2;

// Up to 16 rows decoded, per row and super-block: 256 codes (kquant::Decoded's form), the scale of each 16-element
// sub-block as an int32, the bsum coefficients in pairs (two int16 per dword), d and dmin.
struct KPanel {
  uint8_t* q;
  int32_t* scales;  // 16 per super-block
  int32_t* coefs;   // 8 per super-block
  float* d;
  float* dmin;
  int64_t nb;
};

template <DType kType>
void decode_row(const uint8_t* row, const KPanel& p, int64_t r) {
  const auto* blocks = reinterpret_cast<const typename Traits<kType>::Block*>(row);
  for (int64_t b = 0; b < p.nb; ++b) {
    kquant::Decoded dec;
    kquant::decode<kType>(blocks[b], dec);
    const int64_t at = r * p.nb + b;
    for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(p.q + at * 256 + 32 * k), dec.codes[k]);
    _mm512_store_si512(p.scales + at * 16, _mm512_cvtepi16_epi32(dec.scales));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.coefs + at * 8), dec.coefs);
    p.d[at] = dec.d;
    p.dmin[at] = dec.dmin;
  }
}

// Σ_p coef pair p · bsum pair p of the 16 tokens at `bst` (pair-major), exact.
inline __m512i bsum_term(const int32_t* coefs, const int32_t* bst) {
  __m512i sum = _mm512_setzero_si512();
  for (int p = 0; p < 8; ++p) sum = _mm512_dpwssd_epi32(sum, _mm512_load_si512(bst + p * 16), _mm512_set1_epi32(coefs[p]));
  return sum;
}

// Rows [r, r + R) of the panel × the 16 tokens of each of the G groups from `group`: out[(g * 16 + row) * 16 + token].
template <DType kType, int R, int G>
void k_tl_tile(const KPanel& p, int64_t r, const Activations& a, int64_t group, float* out) {
  using Tr = Traits<kType>;
  constexpr int kSubQuads = Tr::kSubBlock / 4;
  const int64_t nb = p.nb;
  const int8_t* xp[G];
  const float* dt[G];
  const int32_t* bst[G];
  for (int g = 0; g < G; ++g) {
    xp[g] = a.xp + (group + g) * a.q_stride * 16;
    dt[g] = a.dt + (group + g) * a.d_stride * 16;
    bst[g] = a.bst + (group + g) * (a.bsum_stride / 2) * 16;
  }
  __m512 acc[R][G];
  for (int i = 0; i < R; ++i) {
    for (int g = 0; g < G; ++g) acc[i][g] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    background_prefetch_step(a.background);
    __m512i isum[R][G];
    for (int i = 0; i < R; ++i) {
      for (int g = 0; g < G; ++g) {
        isum[i][g] = _mm512_setzero_si512();
        if constexpr (!Tr::kHasMin) {  // Q6_K: codes − 32, the correction as the sums' start
          const __m512i bterm = bsum_term(p.coefs + ((r + i) * nb + b) * 8, bst[g] + b * 8 * 16);
          isum[i][g] = _mm512_sub_epi32(isum[i][g], _mm512_slli_epi32(bterm, 5));
        }
      }
    }
    for (int s = 0; s < kQK_K / Tr::kSubBlock; ++s) {
      __m512i sub[R][G];
      for (int i = 0; i < R; ++i) {
        for (int g = 0; g < G; ++g) sub[i][g] = _mm512_setzero_si512();
      }
      for (int k = s * kSubQuads; k < (s + 1) * kSubQuads; ++k) {
        __m512i xv[G];
        for (int g = 0; g < G; ++g) xv[g] = _mm512_load_si512(xp[g] + (b * 64 + k) * 64);
        for (int i = 0; i < R; ++i) {
          int32_t quad;
          std::memcpy(&quad, p.q + ((r + i) * nb + b) * 256 + 4 * k, 4);
          const __m512i wq = _mm512_set1_epi32(quad);
          for (int g = 0; g < G; ++g) sub[i][g] = _mm512_dpbusd_epi32(sub[i][g], wq, xv[g]);
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m512i scale = _mm512_set1_epi32(p.scales[((r + i) * nb + b) * 16 + s * (Tr::kSubBlock / 16)]);
        for (int g = 0; g < G; ++g) isum[i][g] = _mm512_add_epi32(isum[i][g], _mm512_mullo_epi32(sub[i][g], scale));
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 dx = _mm512_load_ps(dt[g] + b * 16);
      for (int i = 0; i < R; ++i) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(p.d[(r + i) * nb + b]), dx);
        acc[i][g] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum[i][g]), acc[i][g]);
      }
    }
  }
  if constexpr (Tr::kHasMin) {
    // Σ min·bsum, its own chain as in the reference, subtracted at the end.
    __m512 mins[R][G];
    for (int i = 0; i < R; ++i) {
      for (int g = 0; g < G; ++g) mins[i][g] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
      for (int g = 0; g < G; ++g) {
        const __m512 dx = _mm512_load_ps(dt[g] + b * 16);
        for (int i = 0; i < R; ++i) {
          const __m512i msum = bsum_term(p.coefs + ((r + i) * nb + b) * 8, bst[g] + b * 8 * 16);
          const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(p.dmin[(r + i) * nb + b]), dx);
          mins[i][g] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(msum), mins[i][g]);
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int g = 0; g < G; ++g) acc[i][g] = _mm512_sub_ps(acc[i][g], mins[i][g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < R; ++i) _mm512_store_ps(out + (g * 16 + r + i) * 16, acc[i][g]);
  }
}

// Rows [0, rows) of the panel × G groups from `group` into out (as k_tl_tile's), in the widest tiles that fit.
template <DType kType, int G>
void k_tl_panel_groups(const KPanel& p, int64_t rows, const Activations& a, int64_t group, float* out) {
  for (int g = 0; g < G; ++g) {
    for (int64_t k = rows; k < 16; ++k) _mm512_store_ps(out + (g * 16 + k) * 16, _mm512_setzero_ps());
  }
  int64_t i = 0;
  for (; i + kRows <= rows; i += kRows) k_tl_tile<kType, kRows, G>(p, i, a, group, out);
  for (; i + 2 <= rows; i += 2) k_tl_tile<kType, 2, G>(p, i, a, group, out);
  for (; i < rows; ++i) k_tl_tile<kType, 1, G>(p, i, a, group, out);
}

template <DType kType>
void k_tl_range_impl(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride) {
  const int64_t nb = w.cols / kQK_K;
  const int64_t per_row = nb * (256 + 16 * 4 + 8 * 4 + 2 * 4);
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kTokenLanePanel, static_cast<size_t>(kRowsPerPanel * per_row)));
  KPanel p;
  p.nb = nb;
  p.q = base;
  p.scales = reinterpret_cast<int32_t*>(base + kRowsPerPanel * nb * 256);
  p.coefs = p.scales + kRowsPerPanel * nb * 16;
  p.d = reinterpret_cast<float*>(p.coefs + kRowsPerPanel * nb * 8);
  p.dmin = p.d + kRowsPerPanel * nb;
  for (int64_t rp = r0; rp < r1; rp += kRowsPerPanel) {
    const int64_t rows = imin(kRowsPerPanel, r1 - rp);
    for (int64_t i = 0; i < rows; ++i) decode_row<kType>(w.data + (rp + i) * w.row_bytes, p, i);
    // The tiles below are compute-bound; the rows kPrefetchPanels ahead are fetched into L2 meanwhile so the next
    // decode does not wait on DRAM.
    const int64_t ahead = kPrefetchPanels * kRowsPerPanel;
    if (rp + ahead < r1) {
      const char* next = reinterpret_cast<const char*>(w.data + (rp + ahead) * w.row_bytes);
      const int64_t bytes = imin(kRowsPerPanel, r1 - rp - ahead) * w.row_bytes;
      for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t g = g0; g < g1;) {
      alignas(64) float out[kGroupsPerTile * 16 * 16];  // [group][panel row][token]; rows past `rows` are zeroed
      const int groups = g1 - g >= kGroupsPerTile ? kGroupsPerTile : 1;
      if (groups == kGroupsPerTile) {
        k_tl_panel_groups<kType, kGroupsPerTile>(p, rows, a, g, out);
      } else {
        k_tl_panel_groups<kType, 1>(p, rows, a, g, out);
      }
      for (int gi = 0; gi < groups; ++gi) {
        __m512i v[16];
        for (int k = 0; k < 16; ++k) v[k] = _mm512_load_si512(out + (gi * 16 + k) * 16);
        transpose16(v);  // v[t]: token t's 16 rows
        for (int t = 0; t < 16; ++t) {
          _mm512_mask_storeu_ps(y + ((g + gi) * 16 + t) * y_stride + rp, keep, _mm512_castsi512_ps(v[t]));
        }
      }
      g += groups;
    }
  }
}

}  // namespace

void avx512_k_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                       int64_t y_stride) {
  switch (w.type) {
    case DType::kQ4_K:
      return k_tl_range_impl<DType::kQ4_K>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_K:
      return k_tl_range_impl<DType::kQ5_K>(w, a, r0, r1, g0, g1, y, y_stride);
    default:
      return k_tl_range_impl<DType::kQ6_K>(w, a, r0, r1, g0, g1, y, y_stride);
  }
}

}  // namespace servetune::cpu::detail

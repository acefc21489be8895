// Token-lane AVX-512 VNNI GEMM for prefill and batched decode (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights, groups of
// 16 tokens): each zmm lane is a token, and one vpdpbusd multiplies one broadcast weight quad (u8, offset form) by 16
// tokens' activation quads (s8). A block's eight quads chain into exact integer sums, then one fma per block and
// row follows the canonical arithmetic of matmul_reference.cpp, like every other quantized path.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

constexpr int64_t kRowsPerPanel = 16;
constexpr int64_t kPrefetchPanels = 2;  // weights are prefetched this many panels ahead of their decode
constexpr int64_t kStreamAhead = 8192;  // and, while a row is decoded, this many bytes ahead in the weight stream
constexpr int kRows = 4;  // register tile: 4 rows × 16 tokens of one or kGroupsPerTile groups
constexpr int kGroupsPerTile = 2;

// log2 of the u8 offset of signed weight codes (Q4_0: 8, Q5_0: 16, Q8_0: 128); -1: unsigned codes, no offset.
template <DType kType>
constexpr int kOffsetShift = kType == DType::kQ4_0   ? 3
                             : kType == DType::kQ5_0 ? 4
                             : kType == DType::kQ8_0 ? 7
                                                     : -1;

// The weight rows of later panels, fetched a few lines per block step of this panel's tiles so the fetches overlap
// the arithmetic instead of queueing up on the core's miss buffers in one burst: `l2` (into L2) and `l1` (into L1)
// from `offset` on, `lines` lines per step.
struct PanelStream {
  const char* l2 = nullptr;
  int64_t l2_bytes = 0;
  const char* l1 = nullptr;
  int64_t l1_bytes = 0;
  int64_t offset = 0;
  int64_t lines = 0;
};

inline void panel_stream_step(PanelStream& s) {
  for (int64_t i = 0; i < s.lines; ++i) {
    if (s.offset < s.l2_bytes) _mm_prefetch(s.l2 + s.offset, _MM_HINT_T1);
    if (s.offset < s.l1_bytes) _mm_prefetch(s.l1 + s.offset, _MM_HINT_T0);
    s.offset += 64;
  }
}

// Up to 16 rows decoded: u8 quants in offset form (32 per block, element order) and f32 d and (Q4_1, Q5_1) m per
// block.
// With `rows` set (Q8_0, Q4_1), the tiles read the weight rows in place instead: each quad of quants broadcast from
// the block (Q8_0 flipped to offset form, Q4_1 nibbles masked out, the high ones shifted down first), its f16 d (and
// m) widened as they are used.
struct TlPanel {
  uint8_t* q;
  float* d;
  float* m;
  int64_t nb;
  const uint8_t* rows = nullptr;
  int64_t row_bytes = 0;
  PanelStream* stream = nullptr;  // tiles reading in place step it
};

// Q4_0 / Q4_1 / Q8_0 rows are decoded a run of blocks (64 bytes of packed quants) per vector step.
template <DType kType>
constexpr bool kDecodesRuns = kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ8_0;
template <DType kType>
constexpr int kRun = kType == DType::kQ8_0 ? 2 : 4;
template <DType kType>
constexpr int kBlockWords = static_cast<int>(sizeof(BlockOf<kType>)) / 2;

// Word indices into a run's first 128 bytes: the packed quants of its blocks, in block order.
template <DType kType>
__m512i run_quant_words() {
  constexpr int kQuantWords = 32 / kRun<kType>;
  alignas(64) int16_t idx[32];
  for (int w = 0; w < 32; ++w) {
    idx[w] = static_cast<int16_t>(kBlockWords<kType> * (w / kQuantWords) + kBlockWords<kType> - kQuantWords +
                                  w % kQuantWords);
  }
  return _mm512_load_si512(idx);
}

// Word indices into a run's first 64 bytes: its blocks' f16 d in words 0-3 and (Q4_1) f16 m in words 4-7.
template <DType kType>
__m512i run_scale_words() {
  alignas(64) int16_t idx[32] = {};
  for (int j = 0; j < kRun<kType>; ++j) {
    idx[j] = static_cast<int16_t>(kBlockWords<kType> * j);
    idx[4 + j] = static_cast<int16_t>(kBlockWords<kType> * j + 1);
  }
  return _mm512_load_si512(idx);
}

// A run of blocks starting at src, decoded as decode_tl_row's per-block loop decodes each block, from one 64-byte
// load and one masked load of the run's rest (nothing past the run is read).
template <DType kType>
void decode_tl_run(const uint8_t* src, uint8_t* q, float* d, float* m, __m512i quant_words, __m512i scale_words) {
  constexpr int kBytes = kRun<kType> * static_cast<int>(sizeof(BlockOf<kType>));
  const __m512i head = _mm512_loadu_si512(src);
  const __m512i rest = _mm512_maskz_loadu_epi8((1ull << (kBytes - 64)) - 1, src + 64);
  const __m512i packed = _mm512_permutex2var_epi16(head, quant_words, rest);
  if constexpr (kType == DType::kQ8_0) {
    _mm512_storeu_si512(q, _mm512_xor_si512(packed, _mm512_set1_epi8(-128)));
  } else {
    // Each 16-byte lane holds one block: elements 0-15 in the low nibbles, 16-31 in the high ones.
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i first = _mm512_and_si512(packed, low4);
    const __m512i second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
    // Each block's 32 elements: its 16 low nibbles, then its 16 high ones.
    const __m512i lower_pairs = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    _mm512_storeu_si512(q, _mm512_permutex2var_epi64(first, lower_pairs, second));
    const __m512i upper_pairs = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    _mm512_storeu_si512(q + 64, _mm512_permutex2var_epi64(first, upper_pairs, second));
  }
  const __m256 scales = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(scale_words, head)));
  _mm256_mask_storeu_ps(d, (1u << kRun<kType>) - 1, scales);
  if constexpr (kType == DType::kQ4_1) _mm_storeu_ps(m, _mm256_extractf128_ps(scales, 1));
}

template <DType kType>
void decode_tl_row(const uint8_t* row, int64_t nb, const TlPanel& p, int64_t r) {
  uint8_t* q = p.q + r * nb * 32;
  float* d = p.d + r * nb;
  float* m = p.m + r * nb;
  int64_t b = 0;
  if constexpr (kDecodesRuns<kType>) {
    constexpr int64_t kRunBytes = kRun<kType> * static_cast<int64_t>(sizeof(BlockOf<kType>));
    const __m512i quant_words = run_quant_words<kType>();
    const __m512i scale_words = run_scale_words<kType>();
    for (; b + kRun<kType> <= nb; b += kRun<kType>) {
      const uint8_t* src = row + b * static_cast<int64_t>(sizeof(BlockOf<kType>));
      // Rows are contiguous: this stream continues into the next panels, kStreamAhead bytes ahead.
      _mm_prefetch(reinterpret_cast<const char*>(src) + kStreamAhead, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(src) + kStreamAhead + kRunBytes - 1, _MM_HINT_T0);
      decode_tl_run<kType>(src, q + b * 32, d + b, m + b, quant_words, scale_words);
    }
  }
  auto* heads = reinterpret_cast<uint32_t*>(d);  // Q5_0 / Q5_1: each block's leading dword, converted below
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (; b < nb; ++b) {
    const auto* blk = reinterpret_cast<const BlockOf<kType>*>(row) + b;
    if (sizeof(BlockOf<kType>) > 32 || b % 2 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(blk) + kStreamAhead, _MM_HINT_T0);
    }
    __m256i v;
    if constexpr (kType == DType::kQ8_0) {
      v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs)), _mm256_set1_epi8(-128));
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), low4);
      if constexpr (kType == DType::kQ5_0 || kType == DType::kQ5_1) {
        uint32_t qh;
        std::memcpy(&qh, blk->qh, 4);
        v = _mm256_or_si256(v, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)));
      }
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(q + b * 32), v);
    if constexpr (kDecodesRuns<kType>) {
      d[b] = _cvtsh_ss(blk->d);
      if constexpr (kType == DType::kQ4_1) m[b] = _cvtsh_ss(blk->m);
    } else {
      std::memcpy(heads + b, blk, 4);
    }
  }
  if constexpr (!kDecodesRuns<kType>) {
    // Scales, 16 blocks at a time, from the blocks' leading dwords (d, and m for Q5_1) that the loop above copied
    // (a gather of them was slower).
    for (b = 0; b < nb; b += 16) {
      const __mmask16 valid =
          nb - b >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (nb - b)) - 1);
      const __m512i dm = _mm512_maskz_loadu_epi32(valid, heads + b);
      _mm512_mask_storeu_ps(d + b, valid, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
      if constexpr (kType == DType::kQ5_1) {
        _mm512_mask_storeu_ps(m + b, valid, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
      }
    }
  }
}

// Block b of panel row `row` as stored in the weight matrix (panels read in place).
template <DType kType>
const uint8_t* tl_block(const TlPanel& p, int64_t row, int64_t b) {
  return p.rows + row * p.row_bytes + b * static_cast<int64_t>(sizeof(BlockOf<kType>));
}

// Rows [r, r + R) of the panel × the 16 tokens of each of the G groups from `group`: out[(g * 16 + row) * 16 + token].
// With two groups every broadcast weight quad feeds two vpdpbusd, and the (row, group) chains are enough independent
// sums to hide vpdpbusd's latency with one chain each.
template <DType kType, int R, int G, bool kInPlace = false>
void tl_tile(const TlPanel& p, int64_t r, const Activations& a, int64_t group, float* out) {
  static_assert(!kInPlace || kType == DType::kQ8_0 || kType == DType::kQ4_1);
  constexpr bool kHasMin = kType == DType::kQ4_1 || kType == DType::kQ5_1;
  constexpr int kShift = kOffsetShift<kType>;
  constexpr int kChains = G == 1 ? 2 : 1;
  const int64_t nb = p.nb;
  const int8_t* xp[G];
  const int32_t* nxs[G];
  const float* dt[G];
  const float* st[G];
  for (int g = 0; g < G; ++g) {
    xp[g] = a.xp + (group + g) * a.q_stride * 16;
    nxs[g] = a.nxs != nullptr ? a.nxs + (group + g) * a.d_stride * 16 : nullptr;
    dt[g] = a.dt + (group + g) * a.d_stride * 16;
    st[g] = a.st != nullptr ? a.st + (group + g) * a.d_stride * 16 : nullptr;
  }
  __m512 acc[R][G];
  for (int i = 0; i < R; ++i) {
    for (int g = 0; g < G; ++g) acc[i][g] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    background_prefetch_step(a.background);
    if constexpr (kInPlace) panel_stream_step(*p.stream);
    // Signed weight codes: Σ (w + offset)·x − offset·Σx, the correction entering the first chain.
    __m512i init[G];
    for (int g = 0; g < G; ++g) {
      init[g] = _mm512_setzero_si512();
      if constexpr (kShift >= 0) init[g] = _mm512_slli_epi32(_mm512_load_si512(nxs[g] + b * 16), kShift);
    }
    __m512i chain[R][G][kChains];
    for (int i = 0; i < R; ++i) {
      for (int g = 0; g < G; ++g) {
        chain[i][g][0] = init[g];
        if constexpr (kChains == 2) chain[i][g][1] = _mm512_setzero_si512();
      }
    }
    for (int k = 0; k < 8; ++k) {
      __m512i xv[G];
      for (int g = 0; g < G; ++g) xv[g] = _mm512_load_si512(xp[g] + (b * 8 + k) * 64);
      for (int i = 0; i < R; ++i) {
        int32_t quad;
        __m512i wq;
        if constexpr (kInPlace && kType == DType::kQ4_1) {
          std::memcpy(&quad, tl_block<kType>(p, r + i, b) + offsetof(BlockQ4_1, qs) + 4 * (k & 3), 4);
          wq = _mm512_set1_epi32(quad);
          if (k >= 4) wq = _mm512_srli_epi32(wq, 4);
          wq = _mm512_and_si512(wq, _mm512_set1_epi8(0x0F));
        } else if constexpr (kInPlace) {
          std::memcpy(&quad, tl_block<kType>(p, r + i, b) + offsetof(BlockQ8_0, qs) + 4 * k, 4);
          wq = _mm512_xor_si512(_mm512_set1_epi32(quad), _mm512_set1_epi8(-128));
        } else {
          std::memcpy(&quad, p.q + (r + i) * nb * 32 + b * 32 + 4 * k, 4);
          wq = _mm512_set1_epi32(quad);
        }
        for (int g = 0; g < G; ++g) {
          __m512i& c = chain[i][g][k * kChains / 8];
          c = _mm512_dpbusd_epi32(c, wq, xv[g]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 dx = _mm512_load_ps(dt[g] + b * 16);
      for (int i = 0; i < R; ++i) {
        float dw;
        if constexpr (kInPlace) {
          uint16_t h;
          std::memcpy(&h, tl_block<kType>(p, r + i, b) + offsetof(BlockOf<kType>, d), 2);
          dw = _cvtsh_ss(h);
        } else {
          dw = p.d[(r + i) * nb + b];
        }
        const __m512 scale = _mm512_mul_ps(dx, _mm512_set1_ps(dw));
        __m512i sum = chain[i][g][0];
        if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, chain[i][g][1]);
        acc[i][g] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc[i][g]);
      }
    }
  }
  // The Q4_1 / Q5_1 term Σ m·s, in its own pass so the integer pass above keeps all its sums in registers.
  __m512 mins[R][G];
  for (int i = 0; i < R; ++i) {
    for (int g = 0; g < G; ++g) mins[i][g] = _mm512_setzero_ps();
  }
  if constexpr (kHasMin) {
    for (int64_t b = 0; b < nb; ++b) {
      for (int g = 0; g < G; ++g) {
        const __m512 sx = _mm512_load_ps(st[g] + b * 16);
        for (int i = 0; i < R; ++i) {
          float mw;
          if constexpr (kInPlace) {
            uint16_t h;
            std::memcpy(&h, tl_block<kType>(p, r + i, b) + offsetof(BlockQ4_1, m), 2);
            mw = _cvtsh_ss(h);
          } else {
            mw = p.m[(r + i) * nb + b];
          }
          mins[i][g] = _mm512_fmadd_ps(_mm512_set1_ps(mw), sx, mins[i][g]);
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < R; ++i) {
      _mm512_store_ps(out + (g * 16 + r + i) * 16, kHasMin ? _mm512_add_ps(acc[i][g], mins[i][g]) : acc[i][g]);
    }
  }
}

// Rows [0, rows) of the panel × G groups from `group` into out (as tl_tile's), in the widest tiles that fit.
template <DType kType, int G, bool kInPlace = false>
void tl_panel_groups(const TlPanel& p, int64_t rows, const Activations& a, int64_t group, float* out) {
  for (int g = 0; g < G; ++g) {
    for (int64_t k = rows; k < 16; ++k) _mm512_store_ps(out + (g * 16 + k) * 16, _mm512_setzero_ps());
  }
  int64_t i = 0;
  for (; i + kRows <= rows; i += kRows) tl_tile<kType, kRows, G, kInPlace>(p, i, a, group, out);
  for (; i + 2 <= rows; i += 2) tl_tile<kType, 2, G, kInPlace>(p, i, a, group, out);
  for (; i < rows; ++i) tl_tile<kType, 1, G, kInPlace>(p, i, a, group, out);
}

template <DType kType>
void tl_range_impl(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                   int64_t y_stride) {
  const int64_t nb = a.nb;
  TlPanel p;
  p.nb = nb;
  const size_t bytes = static_cast<size_t>(kRowsPerPanel * nb * (32 + 2 * 4));
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kTokenLanePanel, bytes));
  p.q = base;
  p.d = reinterpret_cast<float*>(base + kRowsPerPanel * nb * 32);
  p.m = p.d + kRowsPerPanel * nb;
  // A Q8_0 or Q4_1 panel that meets one tile's worth of token groups (a decode batch) is read in place: its decode
  // would be used once.
  constexpr bool kCanReadInPlace = kType == DType::kQ8_0 || kType == DType::kQ4_1;
  const bool in_place = kCanReadInPlace && g1 - g0 <= kGroupsPerTile;
  p.row_bytes = w.row_bytes;
  for (int64_t rp = r0; rp < r1; rp += kRowsPerPanel) {
    const int64_t rows = imin(kRowsPerPanel, r1 - rp);
    if (in_place) {
      p.rows = w.data + rp * w.row_bytes;
    } else {
      for (int64_t i = 0; i < rows; ++i) decode_tl_row<kType>(w.data + (rp + i) * w.row_bytes, nb, p, i);
    }
    // The tiles below are compute-bound; later panels' rows are fetched meanwhile so the next decode does not wait on
    // DRAM: kPrefetchPanels ahead into L2 and, for tiles reading in place, the next panel into L1. Tiles reading in
    // place (one group pass per panel) fetch them a few lines per block step; a burst would queue on the miss buffers
    // in front of their arithmetic.
    PanelStream stream;
    const int64_t ahead = kPrefetchPanels * kRowsPerPanel;
    if (rp + ahead < r1) {
      stream.l2 = reinterpret_cast<const char*>(w.data + (rp + ahead) * w.row_bytes);
      stream.l2_bytes = imin(kRowsPerPanel, r1 - rp - ahead) * w.row_bytes;
    }
    if (in_place) {
      if (rp + kRowsPerPanel < r1) {
        stream.l1 = reinterpret_cast<const char*>(w.data + (rp + kRowsPerPanel) * w.row_bytes);
        stream.l1_bytes = imin(kRowsPerPanel, r1 - rp - kRowsPerPanel) * w.row_bytes;
      }
      const int64_t tiles = rows / kRows + rows % kRows / 2 + rows % 2;  // tl_panel_groups' tiles per group pass
      const int64_t lines = (std::max(stream.l1_bytes, stream.l2_bytes) + 63) / 64;
      stream.lines = (lines + tiles * nb - 1) / (tiles * nb);
      p.stream = &stream;
    } else {
      for (int64_t off = 0; off < stream.l2_bytes; off += 64) _mm_prefetch(stream.l2 + off, _MM_HINT_T1);
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t g = g0; g < g1;) {
      alignas(64) float out[kGroupsPerTile * 16 * 16];  // [group][panel row][token]; rows past `rows` are zeroed
      const int groups = g1 - g >= kGroupsPerTile ? kGroupsPerTile : 1;
      const auto run_tiles = [&]<bool kInPlace>() {
        if (groups == kGroupsPerTile) {
          tl_panel_groups<kType, kGroupsPerTile, kInPlace>(p, rows, a, g, out);
        } else {
          tl_panel_groups<kType, 1, kInPlace>(p, rows, a, g, out);
        }
      };
      if constexpr (kCanReadInPlace) {
        if (in_place) run_tiles.template operator()<true>();
      }
      if (!in_place) run_tiles.template operator()<false>();
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

void avx512_pack_token_groups(const Activations& a, int64_t g0, int64_t g1, int8_t* xp, float* dt, float* st,
                              int32_t* nxs, int32_t* bst) {
  const int64_t xp_stride = a.q_stride * 16;
  const int64_t dt_stride = a.d_stride * 16;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i v[16];
  for (int64_t g = g0; g < g1; ++g) {
    // Activation quads: 16 tokens × 16 quads (64 bytes, two blocks) per step → 16 quads × 16 tokens; with each
    // block's negated sums when signed weight codes need the offset correction.
    for (int64_t c = 0; c < a.q_stride; c += 64) {
      for (int t = 0; t < 16; ++t) v[t] = _mm512_load_si512(a.q + (g * 16 + t) * a.q_stride + c);
      transpose16(v);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(xp + g * xp_stride + (c / 4 + i) * 64, v[i]);
      if (nxs == nullptr) continue;
      for (int half = 0; half < 2; ++half) {
        __m512i sum = _mm512_setzero_si512();
        for (int i = 0; i < 8; ++i) sum = _mm512_dpbusd_epi32(sum, ones, v[half * 8 + i]);
        _mm512_store_si512(nxs + g * dt_stride + (c / 32 + half) * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
      }
    }
    // Scales (and Q8_1 sums): 16 tokens × 16 blocks → 16 blocks × 16 tokens.
    for (int pass = 0; pass < (a.s != nullptr ? 2 : 1); ++pass) {
      const float* src = pass == 0 ? a.d : a.s;
      float* dst = pass == 0 ? dt : st;
      for (int64_t c = 0; c < a.d_stride; c += 16) {
        for (int t = 0; t < 16; ++t) v[t] = _mm512_castps_si512(_mm512_load_ps(src + (g * 16 + t) * a.d_stride + c));
        transpose16(v);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(dst + g * dt_stride + (c + i) * 16, v[i]);
      }
    }
    // Q8_K bsums, a pair per dword: 16 tokens × 16 pairs → 16 pairs × 16 tokens.
    if (bst == nullptr) continue;
    const int64_t pairs = a.bsum_stride / 2;
    const auto* src = reinterpret_cast<const int32_t*>(a.bsums);
    for (int64_t c = 0; c < pairs; c += 16) {
      for (int t = 0; t < 16; ++t) v[t] = _mm512_load_si512(src + (g * 16 + t) * pairs + c);
      transpose16(v);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(bst + g * pairs * 16 + (c + i) * 16, v[i]);
    }
  }
}

void avx512_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride) {
  switch (w.type) {
    case DType::kQ4_0:
      return tl_range_impl<DType::kQ4_0>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ4_1:
      return tl_range_impl<DType::kQ4_1>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_0:
      return tl_range_impl<DType::kQ5_0>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_1:
      return tl_range_impl<DType::kQ5_1>(w, a, r0, r1, g0, g1, y, y_stride);
    default:
      return tl_range_impl<DType::kQ8_0>(w, a, r0, r1, g0, g1, y, y_stride);
  }
}

}  // namespace servetune::cpu::detail

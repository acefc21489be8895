// Distributions for Rng and CPython's MT19937 seeding / sampling for PyRandom (see rng.h).
#include "datasets/rng.h"

#include <cmath>

namespace servetune::datasets {

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift with rejection of the biased low range.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const unsigned __int128 m = static_cast<unsigned __int128>(engine_()) * n;
    if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
  }
}

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  if (span == UINT64_MAX) return static_cast<int64_t>(engine_());
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + below(span + 1));
}

double Rng::uniform01() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double Rng::exponential(double rate) { return -std::log1p(-uniform01()) / rate; }

double Rng::normal() {
  for (;;) {
    const double u = 2.0 * uniform01() - 1.0;
    const double v = 2.0 * uniform01() - 1.0;
    const double s = u * u + v * v;
    if (s > 0.0 && s < 1.0) return u * std::sqrt(-2.0 * std::log(s) / s);
  }
}

double Rng::gamma(double shape, double scale) {
  if (shape < 1.0) {
    const double u = uniform01();
    return gamma(shape + 1.0, scale) * std::pow(1.0 - u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0, v = 0.0;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - uniform01();  // (0, 1]
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v * scale;
  }
}

PyRandom::PyRandom(uint64_t seed) {
  uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const int key_length = key[1] != 0 ? 2 : 1;
  init_genrand(19650218u);
  int i = 1, j = 0;
  for (int k = kN > key_length ? kN : key_length; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= key_length) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
}

void PyRandom::init_genrand(uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  mti_ = kN;
}

void PyRandom::reload() {
  constexpr int kM = 397;
  constexpr uint32_t kMatrixA = 0x9908b0dfu, kUpper = 0x80000000u, kLower = 0x7fffffffu;
  for (int k = 0; k < kN; ++k) {
    const uint32_t y = (mt_[k] & kUpper) | (mt_[(k + 1) % kN] & kLower);
    mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  mti_ = 0;
}

uint32_t PyRandom::next_u32() {
  if (mti_ >= kN) reload();
  uint32_t y = mt_[mti_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t PyRandom::getrandbits(int k) {
  if (k <= 32) return next_u32() >> (32 - k);
  const uint64_t low = next_u32();
  const uint64_t high = next_u32() >> (64 - k);
  return low | (high << 32);
}

uint64_t PyRandom::randbelow(uint64_t n) {
  if (n == 0) return 0;
  const int k = 64 - __builtin_clzll(n);
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

double PyRandom::random() {
  const uint32_t a = next_u32() >> 5, b = next_u32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

}  // namespace servetune::datasets

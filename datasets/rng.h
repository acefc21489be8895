// Seeded randomness that gives the same numbers with every compiler and standard library: Rng wraps
// std::mt19937_64 (fully specified) with distributions implemented here; PyRandom reproduces CPython's `random`.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace servetune::datasets {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, n) without modulo bias; n must be > 0.
  uint64_t below(uint64_t n);
  // Uniform in [lo, hi], both inclusive; lo <= hi.
  int64_t uniform_int(int64_t lo, int64_t hi);
  // Uniform in [0, 1) with 53 random bits.
  double uniform01();
  double exponential(double rate);
  double normal();
  // Gamma(shape k, scale theta) by Marsaglia & Tsang; shape < 1 uses the k+1 boost.
  double gamma(double shape, double scale);

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

// CPython's random.Random for integer seeds: MT19937 seeded by init_by_array, getrandbits, _randbelow, shuffle,
// choice and random() as Python 3.2+ defines them, so a seed picks the same ShareGPT rows as vLLM's benchmark.
class PyRandom {
 public:
  explicit PyRandom(uint64_t seed);

  uint32_t next_u32();
  uint64_t getrandbits(int k);  // 1 <= k <= 64
  uint64_t randbelow(uint64_t n);
  double random();

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[randbelow(i)]);
  }
  size_t choice_index(size_t size) { return randbelow(size); }

 private:
  static constexpr int kN = 624;
  void init_genrand(uint32_t s);
  void reload();
  std::array<uint32_t, kN> mt_{};
  int mti_ = kN + 1;
};

}  // namespace servetune::datasets

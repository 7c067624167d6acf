// Counter-based random streams for the CPU sampling kernels.
//
// Each seed of a sampling call gets its own stream, derived from
// (rng_seed, seed index) alone, so a result never depends on how the thread pool
// splits the seeds over threads. The generator is splitmix64: a Weyl
// sequence passed through a 64-bit finaliser; streams start at scrambled
// points of the 2^64 cycle, so short streams do not overlap in practice.
#pragma once

#include <cstdint>

namespace distgnn {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SeedStream {
 public:
  SeedStream(uint64_t rng_seed, uint64_t stream)
      : state_(mix64(rng_seed ^ mix64(stream + kGolden))) {}

  uint64_t next() {
    state_ += kGolden;
    return mix64(state_);
  }

  // Uniform integer in [0, n), n > 0, without modulo bias (Lemire 2019).
  uint64_t below(uint64_t n) {
    __uint128_t m = static_cast<__uint128_t>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<__uint128_t>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Uniform double in (0, 1], safe to take the logarithm of.
  double uniform_open_zero() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  uint64_t state_;
};

}  // namespace distgnn

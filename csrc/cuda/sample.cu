// Uniform neighbour sampling of a CSC graph on the GPU, in two passes: count, then fill.
//
// Assumptions (the binding, sample_binding.cpp, checks or establishes them):
// - indptr is int64 with num_nodes + 1 entries, indices int32 or int64, seeds int64; indptr and indices
//   are device-readable at the pointers given: device memory, or pinned host memory mapped into the
//   device's address space (UVA zero-copy, every read crosses PCIe); seeds, counts, ends and the outputs
//   are device memory.
// - Counts follow the CPU kernel (csrc/cpu/sample.cpp): min(fanout, deg) without replacement, fanout with
//   replacement when deg > 0 (else 0), deg when fanout == -1.
// - The binding computes ends = inclusive prefix sum of counts between the passes; seed i's group is
//   positions[ends[i] - counts[i], ends[i]), so groups come in seed order, as on the CPU.
// - Within a group: ascending positions when every edge is taken (fanout == -1 or deg <= fanout without
//   replacement); otherwise draw order, which differs from the CPU kernel's order and random stream.
// - Random numbers come from a counter-based splitmix64 keyed by (rng_seed, seed index, draw number), so a
//   result depends on rng_seed and the seed list alone, never on the launch shape or timing.
// - Without replacement and deg > fanout: Floyd's algorithm, fanout draws per seed; a draw is checked
//   against the picks so far by the whole warp (ballot), O(fanout^2 / 32) per seed; the picks so far live in
//   the output group itself, made visible to the warp by __syncwarp.
// - One thread per seed in the count pass, one warp per seed in the fill pass.

#include <cstdint>

#include <cuda_runtime.h>

#include "sample.h"

namespace distgnn_sample {
namespace {

constexpr int kCountThreads = 256;
constexpr int kFillThreads = 256;  // 8 warps = 8 seeds per block
constexpr int kWarp = 32;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The splitmix64 stream of seed `i`: state starts at stream_key(rng_seed, i), draw k is its (k+1)-th output.
__device__ __forceinline__ uint64_t stream_key(uint64_t rng_seed, int64_t i) {
  return mix64(rng_seed ^ mix64(static_cast<uint64_t>(i) * kGolden + kGolden));
}

__device__ __forceinline__ uint64_t draw(uint64_t key, int64_t k) {
  return mix64(key + (static_cast<uint64_t>(k) + 1) * kGolden);
}

// Uniform in [0, n) from 64 random bits (multiply-high; bias below n / 2^64).
__device__ __forceinline__ int64_t below(uint64_t bits, int64_t n) {
  return static_cast<int64_t>(__umul64hi(bits, static_cast<uint64_t>(n)));
}

__global__ void count_kernel(const CountParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0 && p.indptr[p.num_nodes] != p.num_edges) atomicOr(p.flags, kIndptrEnd);
  if (i >= p.num_seeds) return;
  const int64_t s = p.seeds[i];
  int64_t count = 0;
  if (s < 0 || s >= p.num_nodes) {
    atomicOr(p.flags, kSeedOutOfRange);
  } else {
    const int64_t start = p.indptr[s];
    const int64_t end = p.indptr[s + 1];
    if (start < 0 || end < start || end > p.num_edges) {
      atomicOr(p.flags, kCorruptIndptr);
    } else {
      const int64_t deg = end - start;
      if (p.fanout < 0) {
        count = deg;
      } else if (p.replace) {
        count = deg > 0 ? p.fanout : 0;
      } else {
        count = deg < p.fanout ? deg : p.fanout;
      }
    }
  }
  p.counts[i] = count;
}

template <typename Index>
__global__ void fill_kernel(const FillParams p) {
  // Every lane of a warp has the same seed index, so whole warps return together.
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= p.num_seeds) return;
  const int64_t count = p.counts[i];
  if (count == 0) return;
  const int64_t out = p.ends[i] - count;
  const int64_t s = p.seeds[i];
  const int64_t start = p.indptr[s];
  const int64_t deg = p.indptr[s + 1] - start;
  int64_t* pos = p.positions + out;

  if (count == deg && (!p.replace || p.fanout < 0)) {
    for (int64_t j = lane; j < count; j += kWarp) pos[j] = start + j;
  } else if (p.replace) {
    const uint64_t key = stream_key(p.rng_seed, i);
    for (int64_t j = lane; j < count; j += kWarp) pos[j] = start + below(draw(key, j), deg);
  } else {
    // Floyd: for j = deg - count .. deg - 1 draw t in [0, j]; take t unless already taken, else take j.
    const uint64_t key = stream_key(p.rng_seed, i);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t j = deg - count + k;
      const int64_t t = start + below(draw(key, k), j + 1);
      bool seen = false;
      for (int64_t m = lane; m < k; m += kWarp) seen |= pos[m] == t;
      seen = __any_sync(0xffffffffu, seen);
      if (lane == 0) pos[k] = seen ? start + j : t;
      __syncwarp();
    }
  }
  if (p.neighbors != nullptr) {
    __syncwarp();
    const Index* indices = static_cast<const Index*>(p.indices);
    for (int64_t j = lane; j < count; j += kWarp) p.neighbors[out + j] = static_cast<int64_t>(indices[pos[j]]);
  }
}

}  // namespace

// ---- launch logic ----

void launch_count(const CountParams& p, cudaStream_t stream) {
  // At least one block, so the indptr[num_nodes] check runs for an empty seed list too.
  const int64_t blocks = p.num_seeds > 0 ? (p.num_seeds + kCountThreads - 1) / kCountThreads : 1;
  count_kernel<<<static_cast<unsigned>(blocks), kCountThreads, 0, stream>>>(p);
}

void launch_fill(const FillParams& p, cudaStream_t stream) {
  if (p.num_seeds == 0) return;
  constexpr int64_t seeds_per_block = kFillThreads / kWarp;
  const int64_t blocks = (p.num_seeds + seeds_per_block - 1) / seeds_per_block;
  if (p.indices_int64) {
    fill_kernel<int64_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  } else {
    fill_kernel<int32_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  }
}

}  // namespace distgnn_sample

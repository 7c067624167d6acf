// Uniform neighbour sampling of a CSC graph on the GPU, in two passes: count + scan, then fill.
//
// Assumptions (the binding, sample_binding.cpp, checks or establishes them):
// - indptr is int64 with num_nodes + 1 entries, indices int32 or int64, seeds int64; indptr and indices
//   are device-readable at the pointers given: device memory, or pinned host memory mapped into the
//   device's address space (UVA zero-copy, every read crosses PCIe); seeds, offsets, counts and the outputs
//   are device memory.
// - Counts follow the CPU kernel (csrc/cpu/sample.cpp): min(fanout, deg) without replacement, fanout with
//   replacement when deg > 0 (else 0), deg when fanout == -1. A seed the scan flags (out of range, corrupt
//   range) counts 0, so the fill never reads outside indices even before the binding has seen the flags.
// - Scan pass: one cub::DeviceScan::ExclusiveSum over num_seeds + 1 items whose input computes each seed's
//   count on the fly (no count kernel, no counts array in between); item num_seeds checks indptr's end and
//   counts 0, so offsets[num_seeds] is the total. Seed i's group is positions[offsets[i], offsets[i + 1]),
//   so groups come in seed order, as on the CPU.
// - Within a group: ascending positions when every edge is taken (fanout == -1 or deg <= fanout without
//   replacement); otherwise draw order, which differs from the CPU kernel's order and random stream.
// - Random numbers come from a counter-based splitmix64 keyed by (rng_seed, seed index, draw number), so a
//   result depends on rng_seed and the seed list alone, never on the launch shape or timing.
// - Without replacement and deg > fanout: Floyd's algorithm, fanout draws per seed (draw k picks t in
//   [0, deg - fanout + k]; t unless already picked, else deg - fanout + k).
// - Fill, 0 <= fanout <= 32 (kMaxSmallFanout): G lanes per seed, G = fanout rounded up to a power of two, so
//   a warp serves 32 / G seeds. Lane k draws Floyd's k-th number and holds pick k in a register; step k
//   broadcasts draw k (shuffle) and checks it against picks 0..k-1 with one ballot, so no pick goes through
//   memory before its single coalesced store.
// - Fill, fanout > 32 or -1: one warp per seed; Floyd's picks so far live in the output group itself, made
//   visible to the warp by __syncwarp, O(fanout^2 / 32) compares per seed.

#include <cstdint>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "sample.h"

namespace distgnn_sample {
namespace {

constexpr int kFillThreads = 256;
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

__device__ __forceinline__ void raise_flag(int64_t* flags, int64_t bit) {
  atomicOr(reinterpret_cast<unsigned long long*>(flags), static_cast<unsigned long long>(bit));
}

// The scan's input: item i < num_seeds is seed i's pick count; item num_seeds checks indptr's end. Raising a
// flag twice (should cub read an item twice) does no harm.
struct PickCount {
  ScanParams p;

  __device__ int64_t operator()(int64_t i) const {
    if (i >= p.num_seeds) {
      if (p.indptr[p.num_nodes] != p.num_edges) raise_flag(p.flags, kIndptrEnd);
      return 0;
    }
    const int64_t s = p.seeds[i];
    if (s < 0 || s >= p.num_nodes) {
      raise_flag(p.flags, kSeedOutOfRange);
      return 0;
    }
    const int64_t start = p.indptr[s];
    const int64_t end = p.indptr[s + 1];
    if (start < 0 || end < start || end > p.num_edges) {
      raise_flag(p.flags, kCorruptIndptr);
      return 0;
    }
    const int64_t deg = end - start;
    if (p.fanout < 0) return deg;
    if (p.replace) return deg > 0 ? p.fanout : 0;
    return deg < p.fanout ? deg : p.fanout;
  }
};

template <typename Index>
__device__ __forceinline__ int64_t neighbour(const FillParams& p, int64_t position) {
  return static_cast<int64_t>(static_cast<const Index*>(p.indices)[position]);
}

// G lanes per seed, fanout <= G: lane k computes and stores pick k.
template <int G, typename Index>
__global__ void fill_small_kernel(const FillParams p) {
  // Every lane of a group has the same seed index, so whole groups return together and the group's mask
  // names exactly the lanes that reach each shuffle and ballot.
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int lane = static_cast<int>(threadIdx.x % G);
  if (i >= p.num_seeds) return;
  const unsigned mask = G == kWarp ? 0xffffffffu : ((1u << (G % kWarp)) - 1u) << (threadIdx.x % kWarp / G * G);
  const int64_t begin = p.offsets[i];
  const int64_t count = p.offsets[i + 1] - begin;
  if (lane == 0) p.counts[i] = count;
  if (count == 0) return;
  const int64_t s = p.seeds[i];
  const int64_t start = p.indptr[s];
  const int64_t deg = p.indptr[s + 1] - start;

  int64_t pick = lane;  // relative to start; meaningful for lane < count
  if (p.replace) {
    pick = below(draw(stream_key(p.rng_seed, i), lane), deg);
  } else if (count < deg) {
    const int64_t base = deg - count;
    const int64_t mine = below(draw(stream_key(p.rng_seed, i), lane), base + lane + 1);
    for (int k = 0; k < count; ++k) {
      const int64_t t = __shfl_sync(mask, mine, k, G);
      const bool seen = __ballot_sync(mask, lane < k && pick == t) != 0u;
      if (lane == k) pick = seen ? base + k : t;
    }
  }
  if (lane < count) {
    p.positions[begin + lane] = start + pick;
    if (p.neighbors != nullptr) p.neighbors[begin + lane] = neighbour<Index>(p, start + pick);
  }
}

// One warp per seed, any count (fanout > 32 or -1).
template <typename Index>
__global__ void fill_warp_kernel(const FillParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= p.num_seeds) return;
  const int64_t begin = p.offsets[i];
  const int64_t count = p.offsets[i + 1] - begin;
  if (lane == 0) p.counts[i] = count;
  if (count == 0) return;
  const int64_t s = p.seeds[i];
  const int64_t start = p.indptr[s];
  const int64_t deg = p.indptr[s + 1] - start;
  int64_t* pos = p.positions + begin;

  if (count == deg && (!p.replace || p.fanout < 0)) {
    for (int64_t j = lane; j < count; j += kWarp) pos[j] = start + j;
  } else if (p.replace) {
    const uint64_t key = stream_key(p.rng_seed, i);
    for (int64_t j = lane; j < count; j += kWarp) pos[j] = start + below(draw(key, j), deg);
  } else {
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
    for (int64_t j = lane; j < count; j += kWarp) p.neighbors[begin + j] = neighbour<Index>(p, pos[j]);
  }
}

template <int G>
cudaError_t launch_small(const FillParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.num_seeds * G + kFillThreads - 1) / kFillThreads;
  if (p.indices_int64) {
    fill_small_kernel<G, int64_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  } else {
    fill_small_kernel<G, int32_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

// ---- launch logic ----

cudaError_t launch_scan(const ScanParams& p, void* temp, size_t* temp_bytes, cudaStream_t stream) {
  const auto counts = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), PickCount{p});
  return cub::DeviceScan::ExclusiveSum(temp, *temp_bytes, counts, p.offsets, p.num_seeds + 1, stream);
}

cudaError_t launch_fill(const FillParams& p, cudaStream_t stream) {
  if (p.num_seeds == 0) return cudaSuccess;
  if (p.fanout >= 0 && p.fanout <= kMaxSmallFanout) {
    if (p.fanout <= 1) return launch_small<1>(p, stream);
    if (p.fanout <= 2) return launch_small<2>(p, stream);
    if (p.fanout <= 4) return launch_small<4>(p, stream);
    if (p.fanout <= 8) return launch_small<8>(p, stream);
    if (p.fanout <= 16) return launch_small<16>(p, stream);
    return launch_small<32>(p, stream);
  }
  constexpr int64_t seeds_per_block = kFillThreads / kWarp;
  const int64_t blocks = (p.num_seeds + seeds_per_block - 1) / seeds_per_block;
  if (p.indices_int64) {
    fill_warp_kernel<int64_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  } else {
    fill_warp_kernel<int32_t><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace distgnn_sample

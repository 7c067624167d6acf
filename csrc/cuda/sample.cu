// Uniform neighbour sampling of a CSC graph on the GPU: count + scan + fill, fused for fanouts up to 32.
//
// Assumptions (the binding, sample_binding.cpp, checks or establishes them):
// - indptr is int64 with num_nodes + 1 entries, indices int32 or int64, seeds int64; indptr and indices
//   are device-readable at the pointers given: device memory, or pinned host memory mapped into the
//   device's address space (UVA zero-copy, every read crosses PCIe); seeds, offsets, counts and the outputs
//   are device memory.
// - Counts follow the CPU kernel (csrc/cpu/sample.cpp): min(fanout, deg) without replacement, fanout with
//   replacement when deg > 0 (else 0), deg when fanout == -1. A seed the scan flags (out of range, corrupt
//   range) counts 0, so the fill never reads outside indices even before the binding has seen the flags.
// - Scan pass: one kernel, a tile of seeds per block: each thread counts one seed, cub::BlockScan sums the
//   tile, warp 0 finds the tile's offset by decoupled look-back (Merrill & Garland 2016: tiles publish their
//   aggregate, then their inclusive prefix, as one 64-bit word each; tile ids come from an atomic counter,
//   so every predecessor of a tile is running or done and the look-back cannot deadlock). The last tile
//   writes the total. Seed i's group is positions[offset_i, offset_i + count_i), so groups come in seed
//   order, as on the CPU.
// - Fused (0 <= fanout <= 32 and outputs sized before the sync): the tile then fills its own seeds from
//   shared memory, so a call is one memset, one kernel and one 16-byte copy; it also writes offsets[] (the
//   block's indptr) when given. Otherwise the scan writes offsets[] and a fill kernel reads them.
// - With seeds_used (a device count, for a layer whose seeds a previous layer made on the device) the launch
//   covers the bound num_seeds and the seeds past the count count 0, unread: their offsets equal the total.
// - Stored positions carry position_offset (an edge id base); neighbours are read at the CSC position.
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

#include <cub/block/block_scan.cuh>
#include <cuda/atomic>
#include <cuda_runtime.h>

#include "sample.h"

namespace distgnn_sample {
namespace {

constexpr int kFillThreads = 256;
constexpr int kTileThreads = 256;
constexpr int kWarp = 32;
// Look-back status word: 0 = not yet published, else one flag bit and the value below bit 62.
constexpr uint64_t kAggregateFlag = 1ull << 62;
constexpr uint64_t kInclusiveFlag = 1ull << 63;
constexpr uint64_t kValueMask = kAggregateFlag - 1;

// Lanes per seed for a fanout of at most 32: the fanout rounded up to a power of two.
__host__ __device__ constexpr int lanes_for(int64_t fanout) {
  int lanes = 1;
  while (lanes < fanout) lanes *= 2;
  return lanes;
}

// Seeds per tile: a fused tile serves kTileThreads / G seeds at a time, twice; a scan-only tile one per thread.
__host__ __device__ constexpr int seeds_per_tile(int lanes) {
  return 2 * kTileThreads / lanes < kTileThreads ? 2 * kTileThreads / lanes : kTileThreads;
}
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

// Seed i's pick count, with its CSC range; flags a bad seed or range and counts it 0.
__device__ __forceinline__ int64_t pick_count(const ScanParams& p, int64_t i, int64_t& start, int64_t& deg) {
  const int64_t s = p.seeds[i];
  if (s < 0 || s >= p.num_nodes) {
    raise_flag(p.summary + 1, kSeedOutOfRange);
    return 0;
  }
  start = p.indptr[s];
  const int64_t end = p.indptr[s + 1];
  if (start < 0 || end < start || end > p.num_edges) {
    raise_flag(p.summary + 1, kCorruptIndptr);
    return 0;
  }
  deg = end - start;
  if (p.fanout < 0) return deg;
  if (p.replace) return deg > 0 ? p.fanout : 0;
  return deg < p.fanout ? deg : p.fanout;
}

// Decoupled look-back by warp 0: publishes this tile's aggregate, sums predecessors 32 at a time back to the
// nearest inclusive prefix, publishes its own inclusive prefix; returns the tile's exclusive prefix.
__device__ int64_t tile_prefix(int64_t* status_words, int64_t tile, int64_t aggregate) {
  using Word = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;
  unsigned long long* words = reinterpret_cast<unsigned long long*>(status_words);
  const int lane = static_cast<int>(threadIdx.x);
  if (tile == 0) {
    if (lane == 0) Word(words[0]).store(kInclusiveFlag | aggregate, cuda::std::memory_order_relaxed);
    return 0;
  }
  if (lane == 0) Word(words[tile]).store(kAggregateFlag | aggregate, cuda::std::memory_order_relaxed);
  int64_t prefix = 0;
  for (int64_t pred = tile - 1 - lane;; pred -= kWarp) {
    unsigned long long word = kInclusiveFlag;  // before tile 0: an inclusive 0
    if (pred >= 0) {
      const Word status(words[pred]);
      do {
        word = status.load(cuda::std::memory_order_relaxed);
      } while (word == 0);
    }
    const unsigned inclusive = __ballot_sync(0xffffffffu, (word & kInclusiveFlag) != 0);
    const int nearest = inclusive != 0 ? __ffs(inclusive) - 1 : kWarp;
    int64_t value = lane <= nearest ? static_cast<int64_t>(word & kValueMask) : 0;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
    prefix += __shfl_sync(0xffffffffu, value, 0);
    if (inclusive != 0) break;
  }
  if (lane == 0) Word(words[tile]).store(kInclusiveFlag | (prefix + aggregate), cuda::std::memory_order_relaxed);
  return prefix;
}

template <typename Index>
__device__ __forceinline__ int64_t neighbour(const FillParams& p, int64_t position) {
  return static_cast<int64_t>(static_cast<const Index*>(p.indices)[position]);
}

// The group of G lanes of seed i (fanout <= G): lane k computes and stores pick k.
template <int G, typename Index>
__device__ __forceinline__ void fill_group(const FillParams& p, int64_t i, int64_t begin, int64_t count,
                                           int64_t start, int64_t deg) {
  const int lane = static_cast<int>(threadIdx.x % G);
  const unsigned mask = G == kWarp ? 0xffffffffu : ((1u << (G % kWarp)) - 1u) << (threadIdx.x % kWarp / G * G);
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
    p.positions[begin + lane] = start + pick + p.position_offset;
    if (p.neighbors != nullptr) p.neighbors[begin + lane] = neighbour<Index>(p, start + pick);
  }
}

// Scan pass (see the top of the file); with Fill, also the fill of the tile's seeds by groups of G lanes.
// Every lane of a group has the same seed, so whole groups leave loops together and each group's mask names
// exactly the lanes that reach its shuffles and ballots.
template <int G, typename Index, bool Fill>
__global__ void __launch_bounds__(kTileThreads) scan_kernel(const ScanParams p, const FillParams f) {
  constexpr int S = seeds_per_tile(G);
  using BlockScan = cub::BlockScan<int64_t, kTileThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int64_t tile_id, tile_offset;
  __shared__ int64_t seed_begin[Fill ? S : 1], seed_count[Fill ? S : 1], seed_start[Fill ? S : 1],
      seed_deg[Fill ? S : 1];

  if (threadIdx.x == 0) {
    tile_id = static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(p.state), 1ull));
  }
  __syncthreads();
  const int64_t tile = tile_id;
  const bool last = tile == static_cast<int64_t>(gridDim.x) - 1;
  const int64_t first = tile * S;
  const int64_t i = first + threadIdx.x;
  int64_t used = p.num_seeds;
  if (p.seeds_used != nullptr && *p.seeds_used < used) used = *p.seeds_used;
  int64_t count = 0, start = 0, deg = 0;
  if (threadIdx.x < S && i < used) count = pick_count(p, i, start, deg);
  if (tile == 0 && threadIdx.x == 0 && p.indptr[p.num_nodes] != p.num_edges) raise_flag(p.summary + 1, kIndptrEnd);
  int64_t local = 0, aggregate = 0;
  BlockScan(scan_storage).ExclusiveSum(count, local, aggregate);
  if (threadIdx.x < kWarp) {
    const int64_t prefix = tile_prefix(p.state + 1, tile, aggregate);
    if (threadIdx.x == 0) {
      tile_offset = prefix;
      if (last) p.summary[0] = prefix + aggregate;
    }
  }
  __syncthreads();
  const int64_t begin = tile_offset + local;
  if (p.offsets != nullptr) {
    if (threadIdx.x < S && i < p.num_seeds) p.offsets[i] = begin;
    if (last && threadIdx.x == 0) p.offsets[p.num_seeds] = tile_offset + aggregate;
  }
  if constexpr (Fill) {
    if (threadIdx.x < S) {
      seed_begin[threadIdx.x] = begin;
      seed_count[threadIdx.x] = count;
      seed_start[threadIdx.x] = start;
      seed_deg[threadIdx.x] = deg;
    }
    __syncthreads();
    for (int k = static_cast<int>(threadIdx.x) / G; k < S; k += kTileThreads / G) {
      const int64_t seed = first + k;
      if (seed >= p.num_seeds) break;
      if (f.counts != nullptr && threadIdx.x % G == 0) f.counts[seed] = seed_count[k];
      if (seed_count[k] == 0) continue;
      fill_group<G, Index>(f, seed, seed_begin[k], seed_count[k], seed_start[k], seed_deg[k]);
    }
  }
}

// Fill from offsets[], G lanes per seed, fanout <= G.
template <int G, typename Index>
__global__ void fill_small_kernel(const FillParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  if (i >= p.num_seeds) return;
  const int64_t begin = p.offsets[i];
  const int64_t count = p.offsets[i + 1] - begin;
  if (p.counts != nullptr && threadIdx.x % G == 0) p.counts[i] = count;
  if (count == 0) return;
  const int64_t s = p.seeds[i];
  const int64_t start = p.indptr[s];
  fill_group<G, Index>(p, i, begin, count, start, p.indptr[s + 1] - start);
}

// One warp per seed, any count (fanout > 32 or -1).
template <typename Index>
__global__ void fill_warp_kernel(const FillParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= p.num_seeds) return;
  const int64_t begin = p.offsets[i];
  const int64_t count = p.offsets[i + 1] - begin;
  if (p.counts != nullptr && lane == 0) p.counts[i] = count;
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
  if (p.position_offset != 0) {
    __syncwarp();
    for (int64_t j = lane; j < count; j += kWarp) pos[j] += p.position_offset;  // each lane its own entries
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

template <int G>
cudaError_t launch_fused(const ScanParams& p, const FillParams& f, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>(scan_tiles(p.num_seeds, p.fanout, true));
  if (f.indices_int64) {
    scan_kernel<G, int64_t, true><<<tiles, kTileThreads, 0, stream>>>(p, f);
  } else {
    scan_kernel<G, int32_t, true><<<tiles, kTileThreads, 0, stream>>>(p, f);
  }
  return cudaGetLastError();
}

}  // namespace

// ---- launch logic ----

int64_t scan_tiles(int64_t num_seeds, int64_t fanout, bool fused) {
  const int64_t per_tile = fused ? seeds_per_tile(lanes_for(fanout)) : seeds_per_tile(1);
  return num_seeds > 0 ? (num_seeds + per_tile - 1) / per_tile : 1;
}

cudaError_t launch_scan(const ScanParams& p, const FillParams* fill, cudaStream_t stream) {
  if (fill == nullptr) {
    const auto tiles = static_cast<unsigned>(scan_tiles(p.num_seeds, p.fanout, false));
    scan_kernel<1, int32_t, false><<<tiles, kTileThreads, 0, stream>>>(p, FillParams{});
    return cudaGetLastError();
  }
  switch (lanes_for(p.fanout)) {
    case 1: return launch_fused<1>(p, *fill, stream);
    case 2: return launch_fused<2>(p, *fill, stream);
    case 4: return launch_fused<4>(p, *fill, stream);
    case 8: return launch_fused<8>(p, *fill, stream);
    case 16: return launch_fused<16>(p, *fill, stream);
    default: return launch_fused<32>(p, *fill, stream);
  }
}

cudaError_t launch_fill(const FillParams& p, cudaStream_t stream) {
  if (p.num_seeds == 0) return cudaSuccess;
  if (fusable(p.fanout)) {
    switch (lanes_for(p.fanout)) {
      case 1: return launch_small<1>(p, stream);
      case 2: return launch_small<2>(p, stream);
      case 4: return launch_small<4>(p, stream);
      case 8: return launch_small<8>(p, stream);
      case 16: return launch_small<16>(p, stream);
      default: return launch_small<32>(p, stream);
    }
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

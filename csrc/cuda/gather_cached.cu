// The all-hit gather: out[i] = row of ids[i] in a cache that holds every node of its slot table.
//
// Assumptions (distgnn/cache/gather.py takes this path only when they hold; binding.cpp checks shapes):
// * Every entry of the slot table is a logical slot below the cache's capacity (FeatureCache.covers_all), so the
//   only ids that can fail are those outside [0, table_size): no plan, no sort, no miss list, no host sync.
// * Slot s is row s / num_shards of shard s % num_shards; shard addresses are readable from this device.
// * Rows are raw bytes of equal width `row_bytes`; loads and stores are `Vec` wide, the widest of 16/8/4/2/1 bytes
//   that divides the row width and every base address.
// * Each output row has exactly one writer (its team), so blocks need no ordering.
// * An id that fails zero-fills its output row and stores [1, id] into `errors` (host memory the device can write);
//   the caller raises on its next look. Concurrent failing teams race on the example id: any one is kept.

#include "gather.h"

namespace distgnn {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kBlocksPerSm = 4;  // register cap 64: room for kRows rows' pointers and loads
constexpr int kRows = 4;         // rows each team loads before it stores any: more bytes in flight per thread

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

template <typename Vec, typename Slot>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) gather_cached_kernel(const CachedParams p, int team_shift) {
  const int team = 1 << team_shift;
  const int lane = threadIdx.x & (team - 1);
  const int64_t num_teams = (int64_t(gridDim.x) * blockDim.x) >> team_shift;
  const int64_t vecs = p.row_bytes / int64_t(sizeof(Vec));
  const Slot* table = static_cast<const Slot*>(p.table);
  Vec* out = reinterpret_cast<Vec*>(p.out);
  unsigned long long local = 0, peer = 0;

  for (int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> team_shift; first < p.batch;
       first += num_teams * kRows) {
    const Vec* src[kRows];
    Vec* dst[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t i = first + k * num_teams;
      src[k] = nullptr;
      dst[k] = nullptr;
      if (i >= p.batch) continue;
      dst[k] = out + i * vecs;
      const int64_t id = p.ids[i];
      const int64_t slot = id >= 0 && id < p.table_size ? int64_t(table[id]) : -1;
      if (slot < 0) {
        if (lane == 0) {
          p.errors[1] = id;
          p.errors[0] = 1;
        }
        continue;
      }
      const int shard = int(slot % p.num_shards);
      src[k] = reinterpret_cast<const Vec*>(p.shards[shard]) + (slot / p.num_shards) * vecs;
      if (lane == 0) {
        if (shard == p.local_rank) {
          ++local;
        } else {
          ++peer;
        }
      }
    }
    for (int64_t v = lane; v < vecs; v += team) {
      Vec buf[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (src[k] != nullptr) {
          buf[k] = __ldg(src[k] + v);
        } else {
          buf[k] = Vec{};
        }
      }
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (dst[k] != nullptr) dst[k][v] = buf[k];
      }
    }
  }
  local = warp_sum(local);
  peer = warp_sum(peer);
  if ((threadIdx.x & 31) == 0) {
    if (local) atomicAdd(p.hits, local);
    if (peer) atomicAdd(p.hits + 1, peer);
  }
}

int vector_bytes(const CachedParams& p) {
  uintptr_t bits = uintptr_t(p.row_bytes) | reinterpret_cast<uintptr_t>(p.out);
  for (int s = 0; s < p.num_shards; ++s) bits |= reinterpret_cast<uintptr_t>(p.shards[s]);
  for (int width = 16; width > 1; width /= 2) {
    if (bits % width == 0) return width;
  }
  return 1;
}

template <typename Vec>
cudaError_t launch_typed(const CachedParams& p, int num_sms, cudaStream_t stream) {
  const int64_t vecs = p.row_bytes / int64_t(sizeof(Vec));
  int team_shift = 0;  // threads per row: the power of two covering a row, at most one warp
  while ((int64_t(1) << team_shift) < vecs && team_shift < 5) ++team_shift;
  const int64_t teams_per_block = kBlockThreads >> team_shift;
  int64_t blocks = (p.batch + teams_per_block - 1) / teams_per_block;
  if (blocks > int64_t(num_sms) * kBlocksPerSm) blocks = int64_t(num_sms) * kBlocksPerSm;
  if (p.table_is_int64) {
    gather_cached_kernel<Vec, int64_t><<<unsigned(blocks), kBlockThreads, 0, stream>>>(p, team_shift);
  } else {
    gather_cached_kernel<Vec, int32_t><<<unsigned(blocks), kBlockThreads, 0, stream>>>(p, team_shift);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gather_cached(const CachedParams& params, int num_sms, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  switch (params.row_bytes == 0 ? 1 : vector_bytes(params)) {
    case 16:
      return launch_typed<uint4>(params, num_sms, stream);
    case 8:
      return launch_typed<uint2>(params, num_sms, stream);
    case 4:
      return launch_typed<uint32_t>(params, num_sms, stream);
    case 2:
      return launch_typed<uint16_t>(params, num_sms, stream);
    default:
      return launch_typed<uint8_t>(params, num_sms, stream);
  }
}

}  // namespace distgnn

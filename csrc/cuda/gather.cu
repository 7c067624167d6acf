// Tiered feature gather: one launch copies every row of a batch from the tier that holds it.
//
// Assumptions (the planner in distgnn/cache/gather.py establishes them; binding.cpp checks shapes):
// * Rows are raw bytes: every tier and the output have the same row width `row_bytes` and contiguous rows.
//   The kernel never looks at the dtype, so float32, float16 and bfloat16 take the same path.
// * Loads and stores are `Vec` wide, the widest of 16/8/4/2/1 bytes that divides `row_bytes` and every base
//   address (output, host, staging, each shard); 16-byte loads need 16-byte aligned bases and row widths.
// * The plan lists items sorted by key when `deduplicate` is set: misses (key = global id) ascending, then cache
//   hits (key = hit_base + logical slot) ascending. The first item of each run of equal keys reads the row once,
//   in address order (zero-copy PCIe reads of sorted rows run almost twice as fast as random ones), and stores
//   it to the output rows of the whole run from registers. A hit's key is its slot, so the kernel's dependent
//   loads are key/order, then the row.
// * Host and staging addresses are device-readable (pinned or cudaHostRegister'ed memory, mapped address);
//   peer shard addresses are readable from this device (peer access enabled, or CUDA IPC mappings).
// * Items [skip[0], skip[1]) are left to the caller (the CPU share of the host rows: gathered by CPU threads
//   into pinned memory and copied in by DMA while this kernel reads the rest zero-copy). The range is read from
//   device memory and only filters items, so any values are memory-safe.
// * Each output row has exactly one source, so items never write the same row: no ordering between blocks.
// * A miss found in neither the host range nor the staging ids is counted in `unplaced` and its rows are left
//   unwritten (ids the planner could not key are counted there already); the caller raises.

#include "gather.h"

namespace distgnn {
namespace {

constexpr int kBlockThreads = 256;
// Resident blocks per SM; also the register cap (40, no spills) that keeps 48 warps, and rows, in flight per SM.
constexpr int kBlocksPerSm = 6;
constexpr int kUnroll = 2;  // independent loads in flight per thread before the first store (rows > 512 bytes)

// Copies one source row to the output rows order[first .. first + count); the team's threads split the row.
template <typename Vec>
__device__ __forceinline__ void copy_row(const Vec* __restrict__ src, Vec* __restrict__ out,
                                         const int64_t* __restrict__ order, int64_t first, int64_t count,
                                         int64_t vecs, int lane, int team) {
  for (int64_t base = lane; base < vecs; base += int64_t(team) * kUnroll) {
    Vec buf[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t v = base + int64_t(k) * team;
      if (v < vecs) buf[k] = __ldg(src + v);
    }
    for (int64_t d = first; d < first + count; ++d) {
      Vec* row = out + order[d] * vecs;
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t v = base + int64_t(k) * team;
        if (v < vecs) row[v] = buf[k];
      }
    }
  }
}

// Row of `id` among the sorted staging ids, or -1.
__device__ __forceinline__ int64_t staging_row(const int64_t* __restrict__ ids, int64_t n, int64_t id) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ids[mid] < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && ids[lo] == id ? lo : -1;
}

template <typename Vec>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) gather_rows_kernel(const GatherParams p, int team_shift) {
  const int team = 1 << team_shift;
  const int lane = threadIdx.x & (team - 1);
  const int64_t num_teams = (int64_t(gridDim.x) * blockDim.x) >> team_shift;
  const int64_t vecs = p.row_bytes / int64_t(sizeof(Vec));
  Vec* out = reinterpret_cast<Vec*>(p.out);
  const int64_t skip_begin = p.skip != nullptr ? p.skip[0] : 0;
  const int64_t skip_end = p.skip != nullptr ? p.skip[1] : 0;

  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> team_shift; i < p.batch; i += num_teams) {
    if (i >= skip_begin && i < skip_end) continue;  // another engine fills these
    const int64_t key = p.keys[i];
    if (key == p.bad_key) continue;                                    // counted by the planner
    if (p.deduplicate && i > 0 && p.keys[i - 1] == key) continue;  // the run's first item copies it
    int64_t run = 1;
    if (p.deduplicate) {
      while (i + run < p.batch && p.keys[i + run] == key) ++run;
    }
    const char* src;
    if (key >= p.hit_base) {
      const int64_t slot = key - p.hit_base;
      src = p.shards[slot % p.num_shards] + (slot / p.num_shards) * p.row_bytes;
    } else if (key >= p.host_start && key - p.host_start < p.host_rows) {
      src = p.host + (key - p.host_start) * p.row_bytes;
    } else {
      const int64_t r = staging_row(p.staging_ids, p.staging_rows, key);
      if (r < 0) {
        if (lane == 0) {
          atomicAdd(p.unplaced, static_cast<unsigned long long>(run));
          p.unplaced[1] = static_cast<unsigned long long>(key);
        }
        continue;
      }
      src = p.staging + r * p.row_bytes;
    }
    copy_row(reinterpret_cast<const Vec*>(src), out, p.order, i, run, vecs, lane, team);
  }
}

int vector_bytes(const GatherParams& p) {
  uintptr_t bits = uintptr_t(p.row_bytes) | reinterpret_cast<uintptr_t>(p.out);
  bits |= reinterpret_cast<uintptr_t>(p.host) | reinterpret_cast<uintptr_t>(p.staging);
  for (int s = 0; s < p.num_shards; ++s) bits |= reinterpret_cast<uintptr_t>(p.shards[s]);
  for (int width = 16; width > 1; width /= 2) {
    if (bits % width == 0) return width;
  }
  return 1;
}

template <typename Vec>
cudaError_t launch_typed(const GatherParams& p, int num_sms, cudaStream_t stream) {
  const int64_t vecs = p.row_bytes / int64_t(sizeof(Vec));
  int team_shift = 0;  // threads per row: the power of two covering a row, at most one warp
  while ((int64_t(1) << team_shift) < vecs && team_shift < 5) ++team_shift;
  const int64_t teams_per_block = kBlockThreads >> team_shift;
  int64_t blocks = (p.batch + teams_per_block - 1) / teams_per_block;
  if (blocks > int64_t(num_sms) * kBlocksPerSm) blocks = int64_t(num_sms) * kBlocksPerSm;
  gather_rows_kernel<Vec><<<unsigned(blocks), kBlockThreads, 0, stream>>>(p, team_shift);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gather(const GatherParams& params, int num_sms, cudaStream_t stream) {
  if (params.batch == 0 || params.row_bytes == 0) return cudaSuccess;
  switch (vector_bytes(params)) {
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

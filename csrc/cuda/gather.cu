// Tiered feature gather: one launch copies every row of a batch from the tier that holds it.
//
// Assumptions (the Python planner in distgnn/cache/gather.py establishes them; binding.cpp checks shapes):
// * Rows are raw bytes: every tier and the output have the same row width `row_bytes` and contiguous rows.
//   The kernel never looks at the dtype, so float32, float16 and bfloat16 take the same path.
// * Loads and stores are `Vec` wide, the widest of 16/8/4/2/1 bytes that divides `row_bytes` and every base
//   address (output, host, staging, each shard); 16-byte loads need 16-byte aligned bases and row widths.
// * Misses come deduplicated and sorted by source row, so host rows are read once, in address order (zero-copy
//   PCIe reads of sorted rows run about three times faster than random ones); each miss fans out to its output
//   rows from registers. Hits are not deduplicated: HBM and NVLink reads of a repeated row are cheap.
// * Host and staging addresses are device-readable (pinned or cudaHostRegister'ed memory, mapped address);
//   peer shard addresses are readable from this device (peer access enabled, or CUDA IPC mappings).
// * Output rows written by different items never overlap (each output row has exactly one source), so there is
//   no ordering between blocks.
// * Misses are items [0, num_misses) and hits follow, so the long-latency host reads start first.

#include "gather.h"

namespace distgnn {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kUnroll = 4;  // independent loads in flight per thread before the first store

// Copies one source row to `num_dst` output rows; the `team` threads of the item split the row's vectors.
template <typename Vec>
__device__ __forceinline__ void copy_row(const Vec* __restrict__ src, Vec* __restrict__ out,
                                         const int64_t* __restrict__ dst_rows, int64_t num_dst, int64_t vecs,
                                         int lane, int team) {
  for (int64_t base = lane; base < vecs; base += int64_t(team) * kUnroll) {
    Vec buf[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t v = base + int64_t(k) * team;
      if (v < vecs) buf[k] = __ldg(src + v);
    }
    for (int64_t d = 0; d < num_dst; ++d) {
      Vec* row = out + dst_rows[d] * vecs;
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t v = base + int64_t(k) * team;
        if (v < vecs) row[v] = buf[k];
      }
    }
  }
}

template <typename Vec>
__global__ void __launch_bounds__(kBlockThreads) gather_rows_kernel(const GatherParams p, int team_shift) {
  const int team = 1 << team_shift;
  const int lane = threadIdx.x & (team - 1);
  const int64_t num_teams = (int64_t(gridDim.x) * blockDim.x) >> team_shift;
  const int64_t vecs = p.row_bytes / int64_t(sizeof(Vec));
  const int64_t num_items = p.num_misses + p.num_hits;
  Vec* out = reinterpret_cast<Vec*>(p.out);

  for (int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> team_shift; item < num_items;
       item += num_teams) {
    if (item < p.num_misses) {
      const int64_t r = p.miss_rows[item];
      const char* src = r < p.host_rows ? p.host + r * p.row_bytes : p.staging + (r - p.host_rows) * p.row_bytes;
      const int64_t first = p.miss_offsets[item];
      copy_row(reinterpret_cast<const Vec*>(src), out, p.miss_dst + first, p.miss_offsets[item + 1] - first, vecs,
               lane, team);
    } else {
      const int64_t h = item - p.num_misses;
      const int64_t slot = p.hit_slots[h];
      const char* src = p.shards[slot % p.num_shards] + (slot / p.num_shards) * p.row_bytes;
      copy_row(reinterpret_cast<const Vec*>(src), out, p.hit_dst + h, 1, vecs, lane, team);
    }
  }
}

int vector_bytes(const GatherParams& p) {
  uintptr_t bits = uintptr_t(p.row_bytes) | reinterpret_cast<uintptr_t>(p.out);
  if (p.num_misses > 0) bits |= reinterpret_cast<uintptr_t>(p.host) | reinterpret_cast<uintptr_t>(p.staging);
  if (p.num_hits > 0) {
    for (int s = 0; s < p.num_shards; ++s) bits |= reinterpret_cast<uintptr_t>(p.shards[s]);
  }
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
  const int64_t items = p.num_misses + p.num_hits;
  int64_t blocks = (items + teams_per_block - 1) / teams_per_block;
  if (blocks > int64_t(num_sms) * kBlocksPerSm) blocks = int64_t(num_sms) * kBlocksPerSm;
  gather_rows_kernel<Vec><<<unsigned(blocks), kBlockThreads, 0, stream>>>(p, team_shift);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gather(const GatherParams& params, int num_sms, cudaStream_t stream) {
  if (params.num_misses + params.num_hits == 0 || params.row_bytes == 0) return cudaSuccess;
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

// Planning for the tiered gather (gather.cu): cache lookup, hit counting and the key sort, with no host sync.
//
// Assumptions: ids are int64; the slot table holds -1 or a logical slot below the cache's capacity per global
// id; hit_base lies above every id a tier can hold and bad_key = 2^k - 1 above hit_base + capacity, so keys need
// only the low k bits and the radix sort runs k/8 passes, not 8. Hits are keyed hit_base + slot (the gather then
// needs no second lookup); ids outside [0, hit_base) can be in no tier: they are counted as unplaced here.

#include <cub/device/device_radix_sort.cuh>

#include "gather.h"

namespace distgnn {
namespace {

constexpr int kPlanThreads = 256;

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

template <typename Slot>
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const PlanParams p) {
  const Slot* table = static_cast<const Slot*>(p.table);
  int64_t local = 0, peer = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.batch; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = p.ids[i];
    int64_t slot = -1;
    if (table != nullptr && id >= 0 && id < p.table_size) slot = int64_t(table[id]);
    int64_t key = id;
    if (slot >= 0) {
      key = p.hit_base + slot;
      if (slot % p.num_shards == p.local_rank) {
        ++local;
      } else {
        ++peer;
      }
    } else if (id < 0 || id >= p.hit_base) {
      key = p.bad_key;
      atomicAdd(p.unplaced, 1ull);
      p.unplaced[1] = static_cast<unsigned long long>(id);
    }
    p.keys[i] = key;
    p.order[i] = i;
  }
  local = warp_sum(local);
  peer = warp_sum(peer);
  if ((threadIdx.x & 31) == 0) {
    if (local) atomicAdd(p.hits, static_cast<unsigned long long>(local));
    if (peer) atomicAdd(p.hits + 1, static_cast<unsigned long long>(peer));
  }
}

// First position in keys[0, n) whose key is >= value (or > value with `after`).
__device__ int64_t bound(const int64_t* keys, int64_t n, int64_t value, bool after) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < value || (after && keys[mid] == value)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One thread: the CPU share's items (see launch_share_range).
__global__ void share_range_kernel(const int64_t* keys, int64_t n, int64_t host_start, int64_t host_end,
                                   double share, int64_t* range) {
  const int64_t begin = bound(keys, n, host_start, false);
  const int64_t stop = bound(keys, n, host_end, false);
  int64_t end = begin + int64_t(rint(double(stop - begin) * share));  // rint: half to even, as torch.round
  if (end > begin) end = bound(keys, n, keys[end - 1], true);
  range[0] = begin;
  range[1] = end;
}

}  // namespace

cudaError_t launch_share_range(const int64_t* keys, int64_t n, int64_t host_start, int64_t host_end, double share,
                               int64_t* range, cudaStream_t stream) {
  share_range_kernel<<<1, 1, 0, stream>>>(keys, n, host_start, host_end, share, range);
  return cudaGetLastError();
}

cudaError_t launch_plan(const PlanParams& p, int num_sms, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  int64_t blocks = (p.batch + kPlanThreads - 1) / kPlanThreads;
  if (blocks > int64_t(num_sms) * 8) blocks = int64_t(num_sms) * 8;
  if (p.table_is_int64) {
    plan_kernel<int64_t><<<unsigned(blocks), kPlanThreads, 0, stream>>>(p);
  } else {
    plan_kernel<int32_t><<<unsigned(blocks), kPlanThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t sort_plan(void* temp, size_t* temp_bytes, const int64_t* keys_in, int64_t* keys_out,
                      const int64_t* order_in, int64_t* order_out, int64_t n, int end_bit, cudaStream_t stream) {
  // Keys are non-negative, so their unsigned order is their order.
  return cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, reinterpret_cast<const uint64_t*>(keys_in),
                                         reinterpret_cast<uint64_t*>(keys_out), order_in, order_out, n, 0, end_bit,
                                         stream);
}

}  // namespace distgnn

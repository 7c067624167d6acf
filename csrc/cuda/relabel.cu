// Relabel of one sampled layer on the GPU, with a hash table instead of sorting (relabel.h).
//
// Positions: destination i is position i, edge k is position num_dst + k. Every position inserts its id into an
// open-addressing table (linear probing, atomicCAS on the key) and lowers the slot's `first` to its position
// (atomicMin), so each id's slot ends holding its first position. An edge whose id's first position is its own
// (and not a destination's) is a new source; an inclusive scan over those flags numbers the new sources in
// order of first appearance: local id num_dst + rank - 1. Destinations keep local id i. A last pass reads each
// edge's local id from its slot. Kernels: insert, flag, scan (cub), assign, relabel; the caller's memsets clear
// the table. Ids must be >= 0 (-1 marks an empty slot); the reference is distgnn.sampling.kernels.to_block.
// With `edges_used` (a device count) the launches cover the bound `num_edges` and every kernel stops at the
// count: edges past it insert nothing and are never new, so the scan's last rank is still the new sources' total.
// With `dst_used` (a device count) the destinations past it insert nothing and the new sources are numbered from
// the count; positions keep the bound's layout (edge k is num_dst + k), so every edge still follows every
// destination.

#include <cub/device/device_scan.cuh>

#include "relabel.h"

namespace distgnn_sample {
namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kEmpty = ~0ull;

__device__ __forceinline__ int64_t hash_slot(unsigned long long key, int64_t mask) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return static_cast<int64_t>(key) & mask;
}

__device__ __forceinline__ int64_t edges_in_use(const RelabelParams& p) {
  if (p.edges_used == nullptr) return p.num_edges;
  const int64_t used = *p.edges_used;
  return used < p.num_edges ? used : p.num_edges;
}

__device__ __forceinline__ int64_t dsts_in_use(const RelabelParams& p) {
  if (p.dst_used == nullptr) return p.num_dst;
  const int64_t used = *p.dst_used;
  return used < p.num_dst ? used : p.num_dst;
}

__device__ __forceinline__ int64_t edge_id(const RelabelParams& p, int64_t k) {
  return p.map == nullptr ? p.src[k] : p.map[p.src[k]];
}

__device__ __forceinline__ int64_t position_id(const RelabelParams& p, int64_t pos) {
  return pos < p.num_dst ? p.dst[pos] : edge_id(p, pos - p.num_dst);
}

__global__ void insert_kernel(const RelabelParams p) {
  const int64_t n = p.num_dst + edges_in_use(p), dsts = dsts_in_use(p);
  const int64_t mask = p.capacity - 1;
  for (int64_t pos = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; pos < n; pos += int64_t(gridDim.x) * blockDim.x) {
    if (pos >= dsts && pos < p.num_dst) continue;  // a destination past the count
    const auto key = static_cast<unsigned long long>(position_id(p, pos));
    int64_t slot = hash_slot(key, mask);
    while (true) {
      const unsigned long long seen = atomicCAS(p.keys + slot, kEmpty, key);
      if (seen == kEmpty || seen == key) break;
      slot = (slot + 1) & mask;
    }
    atomicMin(p.first + slot, static_cast<unsigned int>(pos));
    p.slot_of[pos] = static_cast<int32_t>(slot);
  }
}

__global__ void flag_kernel(const RelabelParams p) {
  const int64_t n = p.num_dst + p.num_edges, used = p.num_dst + edges_in_use(p), dsts = dsts_in_use(p);
  for (int64_t pos = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; pos < n; pos += int64_t(gridDim.x) * blockDim.x) {
    if (pos == 0 && p.num_edges == 0 && p.sources != nullptr) *p.sources = dsts;  // no edges: assign never runs
    if (pos >= dsts && pos < p.num_dst) continue;
    if (pos >= used) {
      p.is_new[pos - p.num_dst] = 0;  // past the edges in use: never new, so the scan ends at the total
      continue;
    }
    const int32_t slot = p.slot_of[pos];
    if (pos < p.num_dst) {
      p.local[slot] = static_cast<int32_t>(pos);  // destinations are unique: their own first appearance
      p.src_nids[pos] = p.dst[pos];
    } else {
      p.is_new[pos - p.num_dst] = p.first[slot] == static_cast<unsigned int>(pos) ? 1 : 0;
    }
  }
}

__global__ void assign_kernel(const RelabelParams p) {
  const int64_t dsts = dsts_in_use(p);
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < p.num_edges;
       k += int64_t(gridDim.x) * blockDim.x) {
    if (k == p.num_edges - 1) {
      *p.total = p.rank[k];
      if (p.sources != nullptr) *p.sources = dsts + p.rank[k];
    }
    if (!p.is_new[k]) continue;
    const int64_t id = dsts + p.rank[k] - 1;
    p.local[p.slot_of[p.num_dst + k]] = static_cast<int32_t>(id);
    p.src_nids[id] = edge_id(p, k);
  }
}

__global__ void relabel_kernel(const RelabelParams p) {
  const int64_t used = edges_in_use(p);
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < used;
       k += int64_t(gridDim.x) * blockDim.x) {
    p.indices[k] = p.local[p.slot_of[p.num_dst + k]];
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 4 ? 65535 * 4 : blocks));
}

}  // namespace

size_t relabel_scan_bytes(int64_t num_edges) {
  size_t bytes = 0;
  cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                static_cast<int>(num_edges));
  return bytes;
}

cudaError_t launch_relabel(const RelabelParams& p, void* scan_temp, size_t scan_bytes, cudaStream_t stream) {
  const int64_t n = p.num_dst + p.num_edges;
  if (n == 0) return cudaSuccess;
  insert_kernel<<<grid_for(n), kThreads, 0, stream>>>(p);
  flag_kernel<<<grid_for(n), kThreads, 0, stream>>>(p);
  if (p.num_edges == 0) return cudaGetLastError();
  cudaError_t err = cub::DeviceScan::InclusiveSum(scan_temp, scan_bytes, p.is_new, p.rank,
                                                  static_cast<int>(p.num_edges), stream);
  if (err != cudaSuccess) return err;
  assign_kernel<<<grid_for(p.num_edges), kThreads, 0, stream>>>(p);
  relabel_kernel<<<grid_for(p.num_edges), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace distgnn_sample

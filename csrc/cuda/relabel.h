// Relabel of one sampled layer on the GPU (relabel.cu): destination nodes first, then the other sources in
// order of first appearance, the semantics of distgnn.sampling.kernels.to_block.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn_sample {

struct RelabelParams {
  const int64_t* dst;  // (num_dst,) unique node ids >= 0, device memory
  int64_t num_dst;
  // Optional: how many destinations are in use (<= num_dst) in device memory (a previous layer's sources);
  // destinations past it take no part and the new sources are numbered from it. nullptr: all num_dst.
  const int64_t* dst_used;
  const int64_t* src;  // (num_edges,) node ids >= 0 (or rows of `map`), device memory
  int64_t num_edges;   // entries of src; with edges_used, a bound on the edges
  // Optional: the number of edges in use (<= num_edges) in device memory, read by the kernels (the sampler's
  // total, not known on the host); positions past it take no part. nullptr: all num_edges.
  const int64_t* edges_used;
  // Optional: ids of src through this table (id = map[src[k]], e.g. a partition's local-to-global ids).
  const int64_t* map;
  // Hash table of `capacity` (relabel_capacity(num_dst + num_edges)) slots: keys (-1 = empty) and the first
  // position (dst i = i, edge k = num_dst + k; positions < 2^30) of each key, both all-ones before the launch;
  // local ids.
  unsigned long long* keys;
  unsigned int* first;
  int32_t* local;
  int64_t capacity;
  int32_t* slot_of;  // (num_dst + num_edges,) the slot of each position
  int32_t* is_new;   // (num_edges,) 1 where edge k is the first appearance of a non-destination source
  int32_t* rank;     // (num_edges,) inclusive prefix sum of is_new (0 past edges_used)
  int64_t* src_nids;  // (num_dst + num_edges,) out: dst, then the new sources; the first num_dst + total used
  int64_t* indices;   // (num_edges,) out: local id of each edge's source (the first edges_used written)
  int64_t* total;     // device scalar out: number of new sources
  int64_t* sources;   // optional device scalar out: destinations in use + new sources (the next layer's seeds)
};

// Slots of the table for n positions: the smallest power of two >= 1.5 n (at least 1024), so that the table is at
// most two thirds full even when every position holds a different id.
inline int64_t relabel_capacity(int64_t n) {
  int64_t capacity = 1024;
  while (capacity < n + n / 2 + 1) capacity <<= 1;
  return capacity;
}

// Bytes of cub scan scratch for num_edges items.
size_t relabel_scan_bytes(int64_t num_edges);

// Inserts, flags, scans (into `scan_temp` of relabel_scan_bytes bytes), assigns and relabels on `stream`;
// no host sync. The caller reads *total afterwards.
cudaError_t launch_relabel(const RelabelParams& p, void* scan_temp, size_t scan_bytes, cudaStream_t stream);

}  // namespace distgnn_sample

// One launch that fills a batch's feature rows from every tier (see gather.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn {

// Cache shards a clique may spread over: logical slot s lives in shard s % num_shards at row s / num_shards.
constexpr int kMaxShards = 16;

struct GatherParams {
  char* out;          // (batch, row_bytes) output rows, device memory
  int64_t row_bytes;  // bytes of one row, equal in every tier

  // Misses: unique source rows (host rows first, then staging rows), each copied to one or more output rows.
  int64_t num_misses;
  const int64_t* miss_rows;     // (num_misses,) r < host_rows: host row r; else staging row r - host_rows
  const int64_t* miss_offsets;  // (num_misses + 1,) miss u writes out rows miss_dst[miss_offsets[u] .. [u + 1])
  const int64_t* miss_dst;      // output row of each miss occurrence
  const char* host;             // device-readable address of the pinned/registered local partition rows
  int64_t host_rows;
  const char* staging;  // device-readable address of the pinned staging rows (remote fetches)

  // Hits: one output row each, read from the local cache shard or a peer's.
  int64_t num_hits;
  const int64_t* hit_dst;    // (num_hits,) output row
  const int64_t* hit_slots;  // (num_hits,) logical cache slot
  const char* shards[kMaxShards];
  int num_shards;
};

// Chooses the load width and the threads per row, then launches on `stream`. Returns the launch error.
cudaError_t launch_gather(const GatherParams& params, int num_sms, cudaStream_t stream);

}  // namespace distgnn

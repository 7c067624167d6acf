// One launch that fills a batch's feature rows from every tier (see gather.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn {

// Cache shards a clique may spread over: logical slot s lives in shard s % num_shards at row s / num_shards.
constexpr int kMaxShards = 16;

// Key of a cache hit in the planned order; every miss's key is its global id, which is smaller.
constexpr int64_t kHitKey = INT64_MAX;

struct GatherParams {
  char* out;          // (batch, row_bytes) output rows, device memory
  int64_t row_bytes;  // bytes of one row, equal in every tier
  int64_t batch;      // output rows = planned items

  // The plan: item i is output row order[i]; keys[i] is kHitKey for a cache hit, else the global id to read.
  const int64_t* keys;
  const int64_t* order;
  const int64_t* slots;  // (batch,) logical cache slot of each output row, -1 for misses
  bool deduplicate;      // keys are sorted: the first item of a run of equal keys reads the row for the run

  const char* host;  // device-readable address of the local partition's rows (global ids host_start + r)
  int64_t host_start;
  int64_t host_rows;
  const char* staging;         // device-readable address of the staging rows
  const int64_t* staging_ids;  // (staging_rows,) strictly increasing global ids of the staging rows, device memory
  int64_t staging_rows;

  const char* shards[kMaxShards];
  int num_shards;

  unsigned long long* unplaced;  // [count, an example id] of miss ids found in no tier, device memory
};

// Chooses the load width and the threads per row, then launches on `stream`. Returns the launch error.
cudaError_t launch_gather(const GatherParams& params, int num_sms, cudaStream_t stream);

}  // namespace distgnn

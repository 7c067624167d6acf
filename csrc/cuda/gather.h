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
  int64_t batch;      // output rows = planned items

  // The plan: item i fills output row order[i]. keys[i] < hit_base: the global id to read from the host range or
  // the staging rows; hit_base <= keys[i] < bad_key: cache hit of logical slot keys[i] - hit_base; bad_key: an
  // id the planner already counted as unplaced.
  const int64_t* keys;
  const int64_t* order;
  int64_t hit_base;
  int64_t bad_key;
  bool deduplicate;  // keys are sorted: the first item of a run of equal keys reads the row for the run
  // Items [skip[0], skip[1]) are filled by someone else (host rows gathered by CPU threads and copied in by
  // DMA); the range never splits a run of equal keys. Device memory (the planner computes it on the GPU, so the
  // launch need not wait for the host), or null: no items skipped.
  const int64_t* skip;

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

struct PlanParams {
  const int64_t* ids;  // (batch,) global ids
  int64_t batch;
  const void* table;  // (table_size,) int32 or int64 slot table on this device, or null (no cache)
  bool table_is_int64;
  int64_t table_size;
  int num_shards;
  int local_rank;
  int64_t hit_base;  // above every id any tier holds
  int64_t bad_key;   // 2^k - 1 above hit_base + every slot
  int64_t* keys;     // (batch,) out: the id for misses, hit_base + slot for hits, bad_key for ids no tier holds
  int64_t* order;    // (batch,) out: 0 .. batch-1
  unsigned long long* hits;      // [local, peer] hit counters, accumulated
  unsigned long long* unplaced;  // [count, an example id], accumulated
};

// Looks every id up in the slot table and writes the unsorted plan.
cudaError_t launch_plan(const PlanParams& params, int num_sms, cudaStream_t stream);

// Stable radix sort of (key, order) pairs on the low `end_bit` bits of the (non-negative) keys; with
// temp == nullptr only sets *temp_bytes.
cudaError_t sort_plan(void* temp, size_t* temp_bytes, const int64_t* keys_in, int64_t* keys_out,
                      const int64_t* order_in, int64_t* order_out, int64_t n, int end_bit, cudaStream_t stream);

// range = [begin, end): the items of the sorted `keys` that CPU threads gather instead of the kernel, the first
// `share` (0..1, rounded half to even) of the keys in [host_start, host_end), extended to the end of a run of
// equal keys. One thread, no host sync; the reference is cpu_share_range in distgnn/cache/gather.py.
cudaError_t launch_share_range(const int64_t* keys, int64_t n, int64_t host_start, int64_t host_end, double share,
                               int64_t* range, cudaStream_t stream);

// The all-hit fast path (gather_cached.cu): every id is looked up in a slot table that caches every node, so no
// plan, sort or host sync is needed; one launch copies every row.
struct CachedParams {
  char* out;          // (batch, row_bytes) output rows, device memory
  int64_t row_bytes;  // bytes of one row, equal in the output and every shard
  int64_t batch;
  const int64_t* ids;  // (batch,) global ids, device memory
  const void* table;   // (table_size,) int32 or int64 slot table, device memory
  bool table_is_int64;
  int64_t table_size;
  const char* shards[kMaxShards];
  int num_shards;
  int local_rank;
  unsigned long long* hits;  // [local, peer] hit counters, device memory, accumulated
  // [flag, an example id], device-readable host memory: an id outside the table or without a slot sets the flag
  // (plain stores, no atomics: host memory need not support them) and its output row is zero-filled.
  long long* errors;
};

cudaError_t launch_gather_cached(const CachedParams& params, int num_sms, cudaStream_t stream);

}  // namespace distgnn

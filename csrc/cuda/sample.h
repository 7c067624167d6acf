// Uniform neighbour sampling of a CSC graph on the GPU: parameter blocks and launchers (sample.cu).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn_sample {

// Bits of the error word the count pass sets (the binding turns them into ValueErrors).
enum SampleFlag : int32_t {
  kSeedOutOfRange = 1,  // a seed is < 0 or >= num_nodes
  kCorruptIndptr = 2,   // indptr[s] > indptr[s + 1], or a seed's range leaves [0, num_edges]
  kIndptrEnd = 4,       // indptr[num_nodes] != num_edges
};

struct CountParams {
  const int64_t* indptr;  // (num_nodes + 1,), device-readable
  int64_t num_nodes;
  int64_t num_edges;
  const int64_t* seeds;  // (num_seeds,), device memory
  int64_t num_seeds;
  int64_t fanout;  // -1 = all
  bool replace;
  int64_t* counts;  // out: (num_seeds,)
  int32_t* flags;   // out: one word of SampleFlag bits, zeroed by the caller
};

struct FillParams {
  const int64_t* indptr;  // device-readable
  const void* indices;    // device-readable int32 or int64; read only when neighbors != nullptr
  bool indices_int64;
  const int64_t* seeds;
  int64_t num_seeds;
  const int64_t* counts;  // from the count pass
  const int64_t* ends;    // inclusive prefix sum of counts
  int64_t fanout;
  bool replace;
  uint64_t rng_seed;
  int64_t* positions;  // out: (ends[-1],)
  int64_t* neighbors;  // out: (ends[-1],) indices[positions] as int64, or nullptr
};

void launch_count(const CountParams& p, cudaStream_t stream);
void launch_fill(const FillParams& p, cudaStream_t stream);

}  // namespace distgnn_sample

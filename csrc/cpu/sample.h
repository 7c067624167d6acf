// Neighbour sampling on a CSC graph (in-edges of each node), multi-threaded CPU.
//
// Assumptions: indptr has num_nodes + 1 entries; the kernel checks, per seed,
// that the seed is a valid node and that its indptr range lies inside
// [0, num_edges], so a corrupt indptr can make a call fail but never read out
// of bounds. The kernel returns edge positions, from which the caller gathers
// edge ids; it can also gather the neighbour ids from `indices` (cheap here,
// since each seed's picks lie in one short stretch of indices).
#pragma once

#include <cstdint>
#include <vector>

#include "buffer.h"

namespace distgnn {

struct CscView {
  const int64_t* indptr;
  int64_t num_nodes;
  int64_t num_edges;
  const int32_t* indices32;  // exactly one of indices32 / indices64 is set
  const int64_t* indices64;

};

struct SampleOutput {
  OutputVector<int64_t> positions;  // picked edge positions, grouped by seed in seed order
  OutputVector<int64_t> neighbors;  // indices[positions] when asked for, else empty
};

// Fills counts[num_seeds] and returns the picks. fanout == -1 picks every
// (non-zero-weight) neighbour; fanouts, when not null, gives seed i its own
// fanout fanouts[i] instead (typed sampling: one row per (node, edge type)). prob may be null (uniform) or point at
// num_edges non-negative weights. Throws std::invalid_argument on a bad seed,
// indptr range or weight.
SampleOutput sample_neighbors(const CscView& graph, const int64_t* seeds, int64_t num_seeds, int64_t fanout,
                              const int64_t* fanouts, bool replace, const float* prob, uint64_t rng_seed,
                              int num_threads, bool gather_neighbors, int64_t* counts);

// out[k] = values[positions[k]] for k < n, in parallel. Throws
// std::invalid_argument if a position is outside [0, num_values).
template <typename T>
void take(const T* values, int64_t num_values, const int64_t* positions, int64_t n, int num_threads, int64_t* out);

}  // namespace distgnn

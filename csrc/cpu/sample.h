// Neighbour sampling on a CSC graph (in-edges of each node), CPU/OpenMP.
//
// Assumptions: indptr has num_nodes + 1 entries; the kernel checks, per seed,
// that the seed is a valid node and that its indptr range lies inside
// [0, num_edges], so a corrupt indptr can make a call fail but never read out
// of bounds. The kernel never reads `indices`: it returns edge positions,
// from which the caller gathers neighbour ids and edge ids.
#pragma once

#include <cstdint>
#include <vector>

namespace distgnn {

struct CscView {
  const int64_t* indptr;
  int64_t num_nodes;
  int64_t num_edges;
};

// Fills counts[num_seeds] and returns the picked edge positions grouped by
// seed in seed order. fanout == -1 picks every (non-zero-weight) neighbour.
// prob may be null (uniform) or point at num_edges non-negative weights.
// Throws std::invalid_argument on a bad seed, indptr range or weight.
std::vector<int64_t> sample_neighbors(const CscView& graph, const int64_t* seeds, int64_t num_seeds, int64_t fanout,
                                      bool replace, const float* prob, uint64_t rng_seed, int num_threads,
                                      int64_t* counts);

}  // namespace distgnn

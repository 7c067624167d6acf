// Temporal neighbour sampling on a time-sorted CSR (per node: its events' neighbours, times, event ids).
//
// Assumptions: indptr has num_nodes + 1 entries, times[indptr[v]:indptr[v+1]]
// is ascending for every node v (the CSR is built from a time-sorted stream
// with a stable sort by node). The kernel checks each root id and that its
// indptr range lies inside [0, num_entries], so a corrupt CSR makes a call
// fail, never read out of bounds. A root only ever sees entries strictly
// before its time (binary search for the first entry at or after it).
#pragma once

#include <cstdint>

namespace distgnn {

struct TemporalCsrView {
  const int64_t* indptr;
  int64_t num_nodes;
  int64_t num_entries;
  const int64_t* neighbors;
  const double* times;
  const int64_t* eids;
};

// For root i (node roots[i] at time root_times[i]) writes up to k entries into
// row i of the [num_roots, k] outputs: the k most recent entries before the
// root time (uniform == false; oldest first) or k distinct entries drawn
// uniformly among them (uniform == true; in CSR order, stream keyed by
// (rng_seed, i)). Unused slots get neighbor -1, eid -1, time 0. counts[i] is
// the number of valid slots. Throws std::invalid_argument on a bad root.
void temporal_sample(const TemporalCsrView& csr, const int64_t* roots, const double* root_times, int64_t num_roots,
                     int64_t k, bool uniform, uint64_t rng_seed, int num_threads, int64_t* out_neighbors,
                     double* out_times, int64_t* out_eids, int64_t* counts);

}  // namespace distgnn

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

namespace distgnn {

// Temporal attention over k neighbour slots, fused with the gather of the neighbours' key/value rows
// (distgnn.nn.temporal.TemporalAttention on the CPU). Shapes (row-major, float32 unless said):
//   query [R, H*D]; kv [U, 2*H*D] (per row: H*D key, then H*D value); nbr [R, k] int64 rows of kv;
//   event [F, H*D] with event_index [R, k] int64 its row per slot (added to both key and value; each filled
//   slot its own row); mask [R, k] uint8 (0: empty slot, whose nbr and event_index are not read).
// Forward: score[r,j,h] = <query[r,h], key[nbr[r,j],h] + event[r,j,h]> * scale over filled slots, softmax
// over j (a root without a filled slot gets weight 0 everywhere and out 0), out[r,h] = sum_j weight[r,j,h] *
// (value[nbr[r,j],h] + event[r,j,h]); weight [R, k, H] is written for the backward.
// Where the mask is set, rows of nbr are checked against U and those of event_index against F and for
// repeats (std::invalid_argument on a bad one).
void temporal_attention(const float* query, const float* kv, int64_t num_kv, const int64_t* nbr, const float* event,
                        const int64_t* event_index, int64_t num_event_rows, const uint8_t* mask, int64_t num_roots, int64_t k, int64_t heads, int64_t head_dim,
                        float scale, float* out, float* weight, int num_threads);

// Backward of temporal_attention for grad_out [R, H*D]: writes grad_query [R, H*D], grad_event [F, H*D]
// (per filled slot's row, the key's and the value's gradient summed; other rows 0) and grad_kv [U, 2*H*D] (zeroed first, the slots'
// gradients added at their rows by one thread, so repeated rows never race). Empty slots get zero gradients.
void temporal_attention_backward(const float* query, const float* kv, int64_t num_kv, const int64_t* nbr,
                                 const float* event, const int64_t* event_index, int64_t num_event_rows,
                                 const uint8_t* mask, const float* weight, const float* grad_out,
                                 int64_t num_roots, int64_t k, int64_t heads, int64_t head_dim, float scale,
                                 float* grad_query, float* grad_kv, float* grad_event, int num_threads);

}  // namespace distgnn

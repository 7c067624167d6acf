// CPU kernels of the GNN layers (float32, row-major): mean aggregation over a
// Block's CSC and a fused ReLU + dropout. distgnn/nn/aggregate.py and
// distgnn/nn/kernels.py hold the plain torch / numpy versions they are
// tested against.
#pragma once

#include <cstdint>

namespace distgnn {

// Mean aggregation: for each destination d < num_dst,
//   out[d, mean_col : mean_col + f] = mean of x[indices[e], :] over e in [indptr[d], indptr[d + 1])
// (zeros where d has no in-edges), and where self_col >= 0 also
//   out[d, self_col : self_col + f] = x[d, :]
// (destinations are the first rows of x). out rows are out_stride floats
// apart, so the two halves of a [self | mean] matrix are filled in one pass.
// Throws std::out_of_range naming the first bad destination or edge when
// indptr is not monotone within [0, num_edges] or an index is outside [0, num_src).
// With average = false the neighbours' rows are summed, not averaged (the partial sums a feature owner
// computes over the neighbours it holds: distgnn.client.tensor.DistTensor.self_and_mean).
void mean_aggregate(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                    const float* x, int64_t num_src, int64_t f, float* out, int64_t out_stride, int64_t mean_col,
                    int64_t self_col, int num_threads, bool average = true);

// mean_aggregate over a source matrix that is not in one piece: row s is the f floats at rows[s] (num_src
// pointers, valid for the call; distgnn.client.tensor.DistTensor.read_self_and_mean points them into shared
// memory and pulled replies, so no (num_src, f) copy of the rows is made). The same adds in the same order as
// mean_aggregate over the stacked rows, so the results are bitwise equal.
void mean_aggregate_rows(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                         const float* const* rows, int64_t num_src, int64_t f, float* out, int64_t out_stride,
                         int64_t mean_col, int64_t self_col, int num_threads);

// Gradient of mean_aggregate with respect to x (the same indptr/indices, already
// validated by the forward): grad_x (num_src, f) is overwritten with
//   grad_x[s] = sum over edges e=(s, d) of grad[d, mean_col:] / deg(d)  (+ grad[s, self_col:] for s < num_dst).
// Threads split the columns, so the scatter needs no atomics.
void mean_aggregate_backward(const int64_t* indptr, const int64_t* indices, int64_t num_dst, const float* grad,
                             int64_t grad_stride, int64_t mean_col, int64_t self_col, float* grad_x, int64_t num_src,
                             int64_t f, int num_threads);

// The gradient with respect to h of mean_aggregate(with self_col = 0, mean_col = f) of out = relu_dropout(h):
// grad (num_dst, 2f), out (num_src, f) the saved relu_dropout output; grad_h (num_src, f) is overwritten with
//   grad_h[s] = (out[s] > 0 ? scale : 0) * (grad[s, :f] (s < num_dst) + sum over edges (s, d) of grad[d, f:] / deg(d)),
// each row gathered and written once (a transposed CSR by counting sort). Throws std::out_of_range on a source
// index outside [0, num_src).
void relu_dropout_mean_backward(const int64_t* indptr, const int64_t* indices, int64_t num_dst, const float* grad,
                                const float* out, int64_t num_src, int64_t f, float scale, float* grad_h,
                                int num_threads);

// Fused ReLU and inverted dropout over n floats:
//   out[i] = x[i] * scale if x[i] > 0 and element i is kept, else 0,   scale = 1 / (1 - p).
// Element i is kept when its 16-bit draw u (bits 16*(i%4) .. of mix64 of
// (rng_seed, i / 4)) is >= drop_threshold (= round(p * 65536)), so the mask depends
// on (rng_seed, i) only, never on the thread count. out may alias x.
void relu_dropout(const float* x, float* out, int64_t n, uint32_t drop_threshold, float scale, uint64_t rng_seed,
                  int num_threads);

// Gradient of relu_dropout from its output: grad_in[i] = grad[i] * scale where out[i] > 0, else 0.
void relu_dropout_backward(const float* out, const float* grad, float* grad_in, int64_t n, float scale,
                           int num_threads);

}  // namespace distgnn

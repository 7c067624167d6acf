// GNN layer kernels: mean aggregation (forward and its scatter backward) and
// fused ReLU + dropout. See nn_ops.h for the exact semantics.
//
// Why not torch: on the CPU, torch's CSR x dense product, the slice-backward of
// "the destinations are the first rows of x" and Bernoulli dropout took about
// half of a GraphSAGE training step (dropout alone a quarter: bernoulli_ draws
// one mt19937 double per element). Here the mean is one pass over the edges,
// the [self | mean] input of the layer's single GEMM is written in that pass,
// and dropout draws 16 bits per element from a counter-based hash.
#include "nn_ops.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "parallel.h"
#include "rng.h"
#include "simd.h"

namespace distgnn {
namespace {

constexpr int64_t kRowGrain = 64;        // destinations per claimed chunk
constexpr int64_t kColumnBlock = 16;     // columns per backward work item (one cache line of floats)
constexpr int64_t kElementGrain = 1 << 15;
constexpr int64_t kNoFault = std::numeric_limits<int64_t>::max();

void min_into(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (value < seen && !target.compare_exchange_weak(seen, value)) {
  }
}

uint64_t dropout_word(uint64_t key, int64_t group) {
  return mix64(key + static_cast<uint64_t>(group) * 0x9e3779b97f4a7c15ULL);
}

// acc[0:f) += x[indices[e]] over edges [first, last), the rows of later edges (up to prefetch_end) prefetched.
// Returns the first edge whose source is outside [0, num_src), or -1 (that edge is skipped).
DISTGNN_CPU_CLONES
int64_t sum_rows(const float* x, int64_t num_src, int64_t f, const int64_t* indices, int64_t first, int64_t last,
                 int64_t prefetch_end, float* acc) {
  int64_t bad = -1;
  for (int64_t e = first; e < last; ++e) {
    const int64_t ahead = e + kPrefetchAhead;
    if (ahead < prefetch_end) {
      const int64_t s = indices[ahead];
      if (s >= 0 && s < num_src) prefetch_row(x + s * f, 4 * f);
    }
    const int64_t s = indices[e];
    if (s < 0 || s >= num_src) {
      if (bad < 0) bad = e;
      continue;
    }
    const float* row = x + s * f;
    for (int64_t c = 0; c < f; ++c) acc[c] += row[c];
  }
  return bad;
}

// sum_rows with row s at rows[s] (rows held in several tables).
DISTGNN_CPU_CLONES
int64_t sum_row_pointers(const float* const* rows, int64_t num_src, int64_t f, const int64_t* indices, int64_t first,
                         int64_t last, int64_t prefetch_end, float* acc) {
  int64_t bad = -1;
  for (int64_t e = first; e < last; ++e) {
    const int64_t ahead = e + kPrefetchAhead;
    if (ahead < prefetch_end) {
      const int64_t s = indices[ahead];
      if (s >= 0 && s < num_src) prefetch_row(rows[s], 4 * f);
    }
    const int64_t s = indices[e];
    if (s < 0 || s >= num_src) {
      if (bad < 0) bad = e;
      continue;
    }
    const float* row = rows[s];
    for (int64_t c = 0; c < f; ++c) acc[c] += row[c];
  }
  return bad;
}

DISTGNN_CPU_CLONES
void scale_row(float* row, int64_t f, float factor) {
  for (int64_t c = 0; c < f; ++c) row[c] *= factor;
}

// grad_x[indices[e]][c0:c0+width) += source[0:width) * inv over edges [first, last), rows prefetched ahead.
DISTGNN_CPU_CLONES
void scatter_rows(float* grad_x, int64_t f, int64_t c0, int64_t width, const int64_t* indices, int64_t first,
                  int64_t last, int64_t prefetch_end, const float* source, float inv) {
  for (int64_t e = first; e < last; ++e) {
    if (e + kPrefetchAhead < prefetch_end) prefetch_row(grad_x + indices[e + kPrefetchAhead] * f + c0, 4 * width, true);
    float* target = grad_x + indices[e] * f + c0;
    for (int64_t c = 0; c < width; ++c) target[c] += source[c] * inv;
  }
}

DISTGNN_CPU_CLONES
void add_row(float* target, const float* source, int64_t width) {
  for (int64_t c = 0; c < width; ++c) target[c] += source[c];
}

// out[i] = relu(x[i]) * (draw(i) >= threshold ? scale : 0) for i in [begin, end) (begin a multiple of 4).
DISTGNN_CPU_CLONES
void relu_dropout_range(const float* x, float* out, int64_t begin, int64_t end, uint32_t drop_threshold, float scale,
                        uint64_t key) {
  // Draws for a tile first, then a branch-free loop the compiler vectorises (a branch on
  // random keep/drop bits mispredicts half the time).
  constexpr int64_t kTile = 256;
  uint32_t draws[kTile];
  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int64_t count = std::min(kTile, end - tile);
    for (int64_t k = 0; k < count; k += 4) {
      const uint64_t word = dropout_word(key, (tile + k) / 4);
      draws[k] = static_cast<uint32_t>(word & 0xffffu);
      draws[k + 1] = static_cast<uint32_t>((word >> 16) & 0xffffu);
      draws[k + 2] = static_cast<uint32_t>((word >> 32) & 0xffffu);
      draws[k + 3] = static_cast<uint32_t>(word >> 48);
    }
    const float* in = x + tile;
    float* result = out + tile;
    for (int64_t k = 0; k < count; ++k) {
      const float relu = in[k] > 0.0f ? in[k] : 0.0f;
      result[k] = relu * (draws[k] >= drop_threshold ? scale : 0.0f);
    }
  }
}

DISTGNN_CPU_CLONES
void add_scaled(float* target, const float* source, int64_t f, float factor) {
  for (int64_t c = 0; c < f; ++c) target[c] += source[c] * factor;
}

// target[c] *= (out[c] > 0 ? scale : 0): the ReLU + dropout gradient from the layer's output.
DISTGNN_CPU_CLONES
void mask_positive(float* target, const float* out, int64_t f, float scale) {
  for (int64_t c = 0; c < f; ++c) target[c] *= out[c] > 0.0f ? scale : 0.0f;
}

DISTGNN_CPU_CLONES
void relu_dropout_backward_range(const float* out, const float* grad, float* grad_in, int64_t begin, int64_t end,
                                 float scale) {
  for (int64_t i = begin; i < end; ++i) grad_in[i] = grad[i] * (out[i] > 0.0f ? scale : 0.0f);
}

}  // namespace

namespace {

// The loop of mean_aggregate and mean_aggregate_tables: Rows gives row s of the source matrix (row(s)) and sums
// a destination's neighbours' rows (sum(indices, first, last, prefetch_end, acc)).
template <typename Rows>
void aggregate_means(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                     const Rows& rows, int64_t f, float* out, int64_t out_stride, int64_t mean_col, int64_t self_col,
                     int num_threads, bool average, int64_t num_src) {
  std::atomic<int64_t> bad_row{kNoFault}, bad_edge{kNoFault};
  parallel_for(num_dst, num_threads, kRowGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t d = begin; d < end; ++d) {
        float* mean = out + d * out_stride + mean_col;
        std::fill(mean, mean + f, 0.0f);
        if (self_col >= 0) std::memcpy(out + d * out_stride + self_col, rows.row(d), sizeof(float) * f);
        const int64_t first = indptr[d], last = indptr[d + 1];
        if (first < 0 || last < first || last > num_edges) {
          min_into(bad_row, d);
          continue;
        }
        if (first == last) continue;
        const int64_t bad = rows.sum(indices, first, last, num_edges, mean);
        if (bad >= 0) min_into(bad_edge, bad);
        if (average) scale_row(mean, f, 1.0f / static_cast<float>(last - first));
      }
    };
  });
  if (bad_row.load() != kNoFault) {
    const int64_t d = bad_row.load();
    throw std::out_of_range("indptr is not monotone within [0, " + std::to_string(num_edges) + "] at destination " +
                            std::to_string(d) + " (indptr[d]=" + std::to_string(indptr[d]) +
                            ", indptr[d+1]=" + std::to_string(indptr[d + 1]) + ")");
  }
  if (bad_edge.load() != kNoFault) {
    const int64_t e = bad_edge.load();
    throw std::out_of_range("source index " + std::to_string(indices[e]) + " of edge " + std::to_string(e) +
                            " is outside [0, " + std::to_string(num_src) + ")");
  }
}

struct DenseRows {
  const float* x;
  int64_t num_src, f;
  const float* row(int64_t s) const { return x + s * f; }
  int64_t sum(const int64_t* indices, int64_t first, int64_t last, int64_t prefetch_end, float* acc) const {
    return sum_rows(x, num_src, f, indices, first, last, prefetch_end, acc);
  }
};

struct PointedRows {
  const float* const* rows;
  int64_t num_src, f;
  const float* row(int64_t s) const { return rows[s]; }
  int64_t sum(const int64_t* indices, int64_t first, int64_t last, int64_t prefetch_end, float* acc) const {
    return sum_row_pointers(rows, num_src, f, indices, first, last, prefetch_end, acc);
  }
};

}  // namespace

void mean_aggregate(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                    const float* x, int64_t num_src, int64_t f, float* out, int64_t out_stride, int64_t mean_col,
                    int64_t self_col, int num_threads, bool average) {
  aggregate_means(indptr, indices, num_dst, num_edges, DenseRows{x, num_src, f}, f, out, out_stride, mean_col,
                  self_col, num_threads, average, num_src);
}

void mean_aggregate_rows(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                         const float* const* rows, int64_t num_src, int64_t f, float* out, int64_t out_stride,
                         int64_t mean_col, int64_t self_col, int num_threads) {
  aggregate_means(indptr, indices, num_dst, num_edges, PointedRows{rows, num_src, f}, f, out, out_stride, mean_col,
                  self_col, num_threads, true, num_src);
}

void mean_aggregate_backward(const int64_t* indptr, const int64_t* indices, int64_t num_dst, const float* grad,
                             int64_t grad_stride, int64_t mean_col, int64_t self_col, float* grad_x, int64_t num_src,
                             int64_t f, int num_threads) {
  const int64_t blocks = (f + kColumnBlock - 1) / kColumnBlock;
  const int64_t num_edges = indptr[num_dst];  // checked by the forward pass
  // One thread per column block when several threads run; a single thread takes
  // all columns at once (each source row is then touched once per edge, not once per block).
  const int64_t grain = num_threads <= 1 ? blocks : 1;
  parallel_for(blocks, num_threads, grain, [&] {
    return [&](int64_t block_begin, int64_t block_end) {
      const int64_t c0 = block_begin * kColumnBlock, c1 = std::min(f, block_end * kColumnBlock);
      const int64_t width = c1 - c0;
      for (int64_t s = 0; s < num_src; ++s) std::fill(grad_x + s * f + c0, grad_x + s * f + c1, 0.0f);
      for (int64_t d = 0; d < num_dst; ++d) {
        const int64_t first = indptr[d], last = indptr[d + 1];
        const float* g = grad + d * grad_stride;
        if (self_col >= 0) add_row(grad_x + d * f + c0, g + self_col + c0, width);
        if (first == last) continue;
        scatter_rows(grad_x, f, c0, width, indices, first, last, num_edges, g + mean_col + c0,
                     1.0f / static_cast<float>(last - first));
      }
    };
  });
}

void relu_dropout_mean_backward(const int64_t* indptr, const int64_t* indices, int64_t num_dst, const float* grad,
                                const float* out, int64_t num_src, int64_t f, float scale, float* grad_h,
                                int num_threads) {
  // The transposed CSR (each source's in-edge destinations) by a counting sort, so each source's gradient is
  // gathered and written once: no zero fill, no scatter, no second pass for the mask.
  const int64_t num_edges = indptr[num_dst];
  std::vector<int64_t> starts(static_cast<size_t>(num_src) + 1, 0);
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = indices[e];
    if (s < 0 || s >= num_src)
      throw std::out_of_range("source index " + std::to_string(s) + " of edge " + std::to_string(e) +
                              " is outside [0, " + std::to_string(num_src) + ")");
    ++starts[s + 1];
  }
  for (int64_t s = 0; s < num_src; ++s) starts[s + 1] += starts[s];
  std::vector<int64_t> next(starts.begin(), starts.end() - 1);
  std::vector<int32_t> dst_of(static_cast<size_t>(num_edges));
  for (int64_t d = 0; d < num_dst; ++d)
    for (int64_t e = indptr[d]; e < indptr[d + 1]; ++e) dst_of[next[indices[e]]++] = static_cast<int32_t>(d);
  parallel_for(num_src, num_threads, kRowGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        float* target = grad_h + s * f;
        if (s < num_dst) {
          std::memcpy(target, grad + s * 2 * f, sizeof(float) * f);
        } else {
          std::fill(target, target + f, 0.0f);
        }
        for (int64_t k = starts[s]; k < starts[s + 1]; ++k) {
          const int64_t d = dst_of[k];
          add_scaled(target, grad + d * 2 * f + f, f, 1.0f / static_cast<float>(indptr[d + 1] - indptr[d]));
        }
        mask_positive(target, out + s * f, f, scale);
      }
    };
  });
}

void relu_dropout(const float* x, float* out, int64_t n, uint32_t drop_threshold, float scale, uint64_t rng_seed,
                  int num_threads) {
  const uint64_t key = mix64(rng_seed);
  parallel_for(n, num_threads, kElementGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      // Chunks start at multiples of kElementGrain, so groups of 4 never straddle two chunks.
      relu_dropout_range(x, out, begin, end, drop_threshold, scale, key);
    };
  });
}

void relu_dropout_backward(const float* out, const float* grad, float* grad_in, int64_t n, float scale,
                           int num_threads) {
  parallel_for(n, num_threads, kElementGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      relu_dropout_backward_range(out, grad, grad_in, begin, end, scale);
    };
  });
}

}  // namespace distgnn

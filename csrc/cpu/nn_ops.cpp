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

}  // namespace

void mean_aggregate(const int64_t* indptr, const int64_t* indices, int64_t num_dst, int64_t num_edges,
                    const float* x, int64_t num_src, int64_t f, float* out, int64_t out_stride, int64_t mean_col,
                    int64_t self_col, int num_threads, bool average) {
  std::atomic<int64_t> bad_row{kNoFault}, bad_edge{kNoFault};
  parallel_for(num_dst, num_threads, kRowGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t d = begin; d < end; ++d) {
        float* mean = out + d * out_stride + mean_col;
        std::fill(mean, mean + f, 0.0f);
        if (self_col >= 0) std::memcpy(out + d * out_stride + self_col, x + d * f, sizeof(float) * f);
        const int64_t first = indptr[d], last = indptr[d + 1];
        if (first < 0 || last < first || last > num_edges) {
          min_into(bad_row, d);
          continue;
        }
        if (first == last) continue;
        for (int64_t e = first; e < last; ++e) {
          const int64_t s = indices[e];
          if (s < 0 || s >= num_src) {
            min_into(bad_edge, e);
            continue;
          }
          const float* row = x + s * f;
          for (int64_t c = 0; c < f; ++c) mean[c] += row[c];
        }
        if (!average) continue;
        const float inv = 1.0f / static_cast<float>(last - first);
        for (int64_t c = 0; c < f; ++c) mean[c] *= inv;
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

void mean_aggregate_backward(const int64_t* indptr, const int64_t* indices, int64_t num_dst, const float* grad,
                             int64_t grad_stride, int64_t mean_col, int64_t self_col, float* grad_x, int64_t num_src,
                             int64_t f, int num_threads) {
  const int64_t blocks = (f + kColumnBlock - 1) / kColumnBlock;
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
        if (self_col >= 0) {
          float* target = grad_x + d * f + c0;
          const float* source = g + self_col + c0;
          for (int64_t c = 0; c < width; ++c) target[c] += source[c];
        }
        if (first == last) continue;
        const float inv = 1.0f / static_cast<float>(last - first);
        const float* source = g + mean_col + c0;
        for (int64_t e = first; e < last; ++e) {
          float* target = grad_x + indices[e] * f + c0;
          for (int64_t c = 0; c < width; ++c) target[c] += source[c] * inv;
        }
      }
    };
  });
}

void relu_dropout(const float* x, float* out, int64_t n, uint32_t drop_threshold, float scale, uint64_t rng_seed,
                  int num_threads) {
  const uint64_t key = mix64(rng_seed);
  parallel_for(n, num_threads, kElementGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      // Draws for a tile first, then a branch-free loop the compiler vectorises (a branch on
      // random keep/drop bits mispredicts half the time). Chunks start at multiples of
      // kElementGrain, so tiles and groups of 4 never straddle two chunks.
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
    };
  });
}

void relu_dropout_backward(const float* out, const float* grad, float* grad_in, int64_t n, float scale,
                           int num_threads) {
  parallel_for(n, num_threads, kElementGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) grad_in[i] = grad[i] * (out[i] > 0.0f ? scale : 0.0f);
    };
  });
}

}  // namespace distgnn

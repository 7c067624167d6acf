// Mean aggregation over a Block's CSC on the GPU (aggregate.cu): parameter blocks and launchers.
//
// The CUDA twins of mean_aggregate / mean_aggregate_backward in csrc/cpu/nn_ops.cpp: destination d's
// neighbour mean goes to columns [mean_col, mean_col + width) of its output row and, when self_col >= 0, its
// own row x[d] to [self_col, self_col + width) (the [x_dst | mean] input of a SAGE layer's one GEMM).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn_aggregate {

enum class Dtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct MeanParams {
  const int64_t* indptr;  // (num_dst + 1,) device memory
  const void* indices;    // (num_edges,) int32 or int64 source row per edge, device memory
  bool indices_int64;
  int64_t num_dst;
  int64_t num_src;
  int64_t num_edges;
  int64_t width;  // F
  Dtype dtype;    // of x and out
  const void* x;  // (num_src, width) contiguous rows
  void* out;      // (num_dst, out_stride) contiguous rows
  int64_t out_stride;
  int64_t mean_col;
  int64_t self_col;  // -1: no self columns (then num_src may be < num_dst)
};

struct MeanBackwardParams {
  const int64_t* indptr;
  const void* indices;
  bool indices_int64;
  int64_t num_dst;
  int64_t num_src;
  int64_t num_edges;
  int64_t width;
  Dtype dtype;           // of grad_out
  const void* grad_out;  // (num_dst, grad_stride) contiguous rows
  int64_t grad_stride;
  int64_t mean_col;
  int64_t self_col;
  float* grad_x;  // (num_src, width) float32, zero-filled by the caller; accumulated with atomics
};

// Both launch on `stream` and never synchronise. An index outside [0, num_src), or an indptr range that is
// decreasing or leaves [0, num_edges], trips a device-side assert (after printing the offending values); the
// bad edge or destination is skipped, never read or written out of bounds.
cudaError_t launch_mean_forward(const MeanParams& p, cudaStream_t stream);
cudaError_t launch_mean_backward(const MeanBackwardParams& p, cudaStream_t stream);

}  // namespace distgnn_aggregate

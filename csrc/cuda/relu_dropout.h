// ReLU followed by inverted dropout, fused (relu_dropout.cu): the CUDA twin of relu_dropout in csrc/cpu/nn_ops.cpp.
#pragma once

#include <cstdint>

#include <ATen/cuda/PhiloxCudaState.h>
#include <cuda_runtime.h>

namespace distgnn_relu_dropout {

// out[i] = x[i] * scale where x[i] > 0 and draw(i) >= threshold, else 0. draw(i) is 16 bits of a counter-based
// hash of (seed, offset + i), the same hash as the CPU kernel's; seed and offset come from `philox` (torch's CUDA
// generator, read on the device when a CUDA graph is being captured, so each replay draws new masks).
cudaError_t launch_forward(const float* x, float* out, int64_t n, uint32_t threshold, float scale,
                           at::PhiloxCudaState philox, cudaStream_t stream);

// grad_in[i] = grad_out[i] * scale where out[i] > 0, else 0 (out > 0 exactly where x > 0 and the draw kept it).
cudaError_t launch_backward(const float* out, const float* grad_out, float* grad_in, int64_t n, float scale,
                            cudaStream_t stream);

}  // namespace distgnn_relu_dropout

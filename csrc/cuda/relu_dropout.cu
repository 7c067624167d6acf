// ReLU followed by inverted dropout in one pass, and its backward in one pass (the CUDA twin of relu_dropout in
// csrc/cpu/nn_ops.cpp; distgnn/nn/fused.py). torch's composition F.dropout(F.relu(x)) reads and writes the
// activation four times forward and backward and keeps a mask; here the forward reads x once and writes out once,
// and the backward needs only out (out > 0 exactly where the unit was positive and kept).
//
// The keep/drop draw of element i is 16 bits of a counter-based hash of (seed, c), c = offset + i: 64-bit word
// c / 4 of the seed's stream, 16-bit lane c % 4, the hash of the CPU kernel (splitmix64's finaliser). seed and
// offset come from torch's CUDA generator (at::PhiloxCudaState): unpacked on the device, so a CUDA graph replays
// with a fresh offset each time, as torch's own dropout does. distgnn.nn.fused.relu_dropout_reference is the
// same function in numpy. Each thread handles 4 consecutive elements (one hash) per step of a grid-stride loop,
// with 16-byte loads and stores where the tensors are 16-byte aligned.

#include <cstdint>
#include <tuple>

#include <ATen/cuda/PhiloxUtils.cuh>

#include "relu_dropout.h"

namespace distgnn_relu_dropout {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint32_t draw(uint64_t key, uint64_t counter) {
  const uint64_t word = mix64(key + (counter >> 2) * 0x9E3779B97F4A7C15ull);
  return uint32_t(word >> (16 * (counter & 3))) & 0xFFFFu;
}

__global__ void forward_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n, uint32_t threshold,
                               float scale, at::PhiloxCudaState philox, bool vector) {
  const auto seeds = at::cuda::philox::unpack(philox);
  const uint64_t key = mix64(std::get<0>(seeds));
  const uint64_t offset = std::get<1>(seeds);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
    if (vector && i + 4 <= n) {
      float4 v = *reinterpret_cast<const float4*>(x + i);
      float* e = reinterpret_cast<float*>(&v);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        e[k] = (e[k] > 0.f && draw(key, offset + uint64_t(i + k)) >= threshold) ? e[k] * scale : 0.f;
      }
      *reinterpret_cast<float4*>(out + i) = v;
    } else {
      for (int64_t j = i; j < i + 4 && j < n; ++j) {
        const float v = x[j];
        out[j] = (v > 0.f && draw(key, offset + uint64_t(j)) >= threshold) ? v * scale : 0.f;
      }
    }
  }
}

__global__ void backward_kernel(const float* __restrict__ out, const float* __restrict__ grad_out,
                                float* __restrict__ grad_in, int64_t n, float scale, bool vector) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
    if (vector && i + 4 <= n) {
      const float4 o = *reinterpret_cast<const float4*>(out + i);
      float4 g = *reinterpret_cast<const float4*>(grad_out + i);
      g.x = o.x > 0.f ? g.x * scale : 0.f;
      g.y = o.y > 0.f ? g.y * scale : 0.f;
      g.z = o.z > 0.f ? g.z * scale : 0.f;
      g.w = o.w > 0.f ? g.w * scale : 0.f;
      *reinterpret_cast<float4*>(grad_in + i) = g;
    } else {
      for (int64_t j = i; j < i + 4 && j < n; ++j) grad_in[j] = out[j] > 0.f ? grad_out[j] * scale : 0.f;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int blocks_for(int64_t n) {
  const int64_t quads = (n + 3) / 4;
  const int64_t blocks = (quads + kThreads - 1) / kThreads;
  return int(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

}  // namespace

cudaError_t launch_forward(const float* x, float* out, int64_t n, uint32_t threshold, float scale,
                           at::PhiloxCudaState philox, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, out, n, threshold, scale, philox,
                                                         aligned16(x) && aligned16(out));
  return cudaGetLastError();
}

cudaError_t launch_backward(const float* out, const float* grad_out, float* grad_in, int64_t n, float scale,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, grad_out, grad_in, n, scale,
                                                          aligned16(out) && aligned16(grad_out) && aligned16(grad_in));
  return cudaGetLastError();
}

}  // namespace distgnn_relu_dropout

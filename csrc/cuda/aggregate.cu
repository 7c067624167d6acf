// Mean aggregation over a Block's CSC (destination d's in-edges are [indptr[d], indptr[d + 1]) of indices):
// the CUDA twins of mean_aggregate / mean_aggregate_backward in csrc/cpu/nn_ops.cpp.
//
// Forward: a group of `group` lanes (a power of two <= 32, sized to the row) per destination. Each lane holds
// kUnroll packs of VEC elements (VEC * sizeof(T) <= 16 bytes: one vector load each) and walks the in-edges
// kEdges at a time, loading the sources' indices first and then all their packs, so kEdges * kUnroll loads are
// in flight per lane; sums are float32 whatever T is, scaled by 1 / degree once and stored as T. A destination
// without in-edges gets zeros; with self_col >= 0 its own row x[d] is copied next to the mean.
//
// Backward: the same groups read grad_out[d, mean_col ...] once, scale it by 1 / degree in registers and add it
// to grad_x[s] of every in-edge with atomics (vector atomics of 2 or 4 floats on sm_90 and later), plus
// grad_out[d, self_col ...] to grad_x[d]. grad_x is float32 (zeroed by the caller): the binding accumulates
// float16 / bfloat16 gradients there and casts once. The order of the atomic adds varies from run to run, so
// float32 gradients may differ in the last bits between runs (not bitwise deterministic).
//
// Bad input: a source index outside [0, num_src) or an indptr range that is decreasing or leaves
// [0, num_edges] prints the offending values and trips a device-side assert (the kernel is aborted and the next
// CUDA call in the process reports "device-side assert triggered", as torch's own indexing kernels do). The bad
// edge or destination is skipped, so nothing outside the tensors is ever read or written. No host sync.

#include <cassert>
#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "aggregate.h"

namespace distgnn_aggregate {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;  // packs per lane held in registers at once
constexpr int kEdges = 4;   // in-edges whose rows are loaded before any is summed (forward)
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __noinline__ void report_bad_range(int64_t d, int64_t first, int64_t last, int64_t num_edges) {
  printf("distgnn mean aggregation: indptr is not monotone within [0, %lld] at destination %lld "
         "(indptr[d]=%lld, indptr[d+1]=%lld)\n",
         static_cast<long long>(num_edges), static_cast<long long>(d), static_cast<long long>(first),
         static_cast<long long>(last));
  __assert_fail("0 <= indptr[d] <= indptr[d+1] <= num_edges", __FILE__, __LINE__, __func__);
}

__device__ __noinline__ void report_bad_index(int64_t e, int64_t s, int64_t num_src) {
  printf("distgnn mean aggregation: source index %lld of edge %lld is outside [0, %lld)\n",
         static_cast<long long>(s), static_cast<long long>(e), static_cast<long long>(num_src));
  __assert_fail("0 <= indices[e] < num_src", __FILE__, __LINE__, __func__);
}

// [first, last) of destination d, or an empty range (reported by lane 0) when indptr is corrupt there.
__device__ __forceinline__ void edge_range(const int64_t* __restrict__ indptr, int64_t d, int64_t num_edges,
                                           int lane, int64_t& first, int64_t& last) {
  first = indptr[d];
  last = indptr[d + 1];
  if (!(0 <= first && first <= last && last <= num_edges)) {
    if (lane == 0) report_bad_range(d, first, last, num_edges);
    first = last = 0;
  }
}

// Source row of edge e, or -1 (reported by lane 0) when out of range.
template <typename Index>
__device__ __forceinline__ int64_t source_of(const Index* __restrict__ indices, int64_t e, int64_t num_src,
                                             int lane) {
  const int64_t s = static_cast<int64_t>(indices[e]);
  if (s < 0 || s >= num_src) {
    if (lane == 0) report_bad_index(e, s, num_src);
    return -1;
  }
  return s;
}

template <typename T, int VEC>
__device__ __forceinline__ void accumulate(float (&acc)[VEC], const Pack<T, VEC>& v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] += to_float(v.v[j]);
}

template <typename T, typename Index, int VEC>
__global__ void __launch_bounds__(kThreads) mean_forward_kernel(const MeanParams p, int group_shift) {
  using P = Pack<T, VEC>;
  const int group = 1 << group_shift;
  const int lane = threadIdx.x & (group - 1);
  const int64_t num_groups = (int64_t(gridDim.x) * kThreads) >> group_shift;
  const int64_t packs = p.width / VEC;
  const Index* __restrict__ indices = static_cast<const Index*>(p.indices);
  const P* __restrict__ x = static_cast<const P*>(p.x);
  T* __restrict__ out = static_cast<T*>(p.out);

  for (int64_t d = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> group_shift; d < p.num_dst; d += num_groups) {
    int64_t first, last;
    edge_range(p.indptr, d, p.num_edges, lane, first, last);
    T* row = out + d * p.out_stride;
    if (p.self_col >= 0) {
      P* self = reinterpret_cast<P*>(row + p.self_col);
      for (int64_t k = lane; k < packs; k += group) self[k] = x[d * packs + k];
    }
    const float inv = last > first ? 1.0f / static_cast<float>(last - first) : 0.0f;
    P* mean = reinterpret_cast<P*>(row + p.mean_col);
    for (int64_t base = lane; base < packs; base += int64_t(group) * kUnroll) {
      float acc[kUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[u][j] = 0.0f;
      }
      int64_t e = first;
      for (; e + kEdges <= last; e += kEdges) {
        int64_t s[kEdges];
#pragma unroll
        for (int i = 0; i < kEdges; ++i) s[i] = source_of(indices, e + i, p.num_src, lane);
        P v[kEdges][kUnroll];
#pragma unroll
        for (int i = 0; i < kEdges; ++i) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t k = base + int64_t(u) * group;
            if (s[i] >= 0 && k < packs) {
              v[i][u] = x[s[i] * packs + k];
            } else {
#pragma unroll
              for (int j = 0; j < VEC; ++j) v[i][u].v[j] = from_float<T>(0.0f);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < kEdges; ++i) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) accumulate<T, VEC>(acc[u], v[i][u]);
        }
      }
      for (; e < last; ++e) {
        const int64_t s = source_of(indices, e, p.num_src, lane);
        if (s < 0) continue;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t k = base + int64_t(u) * group;
          if (k < packs) accumulate<T, VEC>(acc[u], x[s * packs + k]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = base + int64_t(u) * group;
        if (k < packs) {
          P o;
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = from_float<T>(acc[u][j] * inv);
          mean[k] = o;
        }
      }
    }
  }
}

// grad[0 .. N) += v[0 .. N); grad is aligned to N floats (at most 16 bytes are needed).
template <int N>
__device__ __forceinline__ void atomic_add_scalars(float* grad, const float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) atomicAdd(grad + j, v[j]);
}

// grad[0 .. N) += v[0 .. N); grad is aligned to N floats (at most 16 bytes are needed).
template <int N>
__device__ __forceinline__ void atomic_add_floats(float* grad, const float (&v)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int j = 0; j < N; j += 4) {
      atomicAdd(reinterpret_cast<float4*>(grad + j), make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]));
    }
  } else if constexpr (N == 2) {
    atomicAdd(reinterpret_cast<float2*>(grad), make_float2(v[0], v[1]));
  } else {
    atomic_add_scalars<N>(grad, v);
  }
#else
  atomic_add_scalars<N>(grad, v);
#endif
}

template <typename T, int VEC>
__device__ __forceinline__ void load_scaled(const Pack<T, VEC>& pack, float scale, float (&out)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = to_float(pack.v[j]) * scale;
}

template <typename T, typename Index, int VEC>
__global__ void __launch_bounds__(kThreads) mean_backward_kernel(const MeanBackwardParams p, int group_shift) {
  using P = Pack<T, VEC>;
  const int group = 1 << group_shift;
  const int lane = threadIdx.x & (group - 1);
  const int64_t num_groups = (int64_t(gridDim.x) * kThreads) >> group_shift;
  const int64_t packs = p.width / VEC;
  const Index* __restrict__ indices = static_cast<const Index*>(p.indices);
  const T* __restrict__ grad_out = static_cast<const T*>(p.grad_out);

  for (int64_t d = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> group_shift; d < p.num_dst; d += num_groups) {
    int64_t first, last;
    edge_range(p.indptr, d, p.num_edges, lane, first, last);
    const T* row = grad_out + d * p.grad_stride;
    if (p.self_col >= 0) {
      const P* self = reinterpret_cast<const P*>(row + p.self_col);
      for (int64_t k = lane; k < packs; k += group) {
        float g[VEC];
        load_scaled<T, VEC>(self[k], 1.0f, g);
        atomic_add_floats<VEC>(p.grad_x + (d * packs + k) * VEC, g);
      }
    }
    if (last == first) continue;
    const float inv = 1.0f / static_cast<float>(last - first);
    const P* mean = reinterpret_cast<const P*>(row + p.mean_col);
    for (int64_t base = lane; base < packs; base += int64_t(group) * kUnroll) {
      float g[kUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = base + int64_t(u) * group;
        if (k < packs) load_scaled<T, VEC>(mean[k], inv, g[u]);
      }
#pragma unroll 4
      for (int64_t e = first; e < last; ++e) {
        const int64_t s = source_of(indices, e, p.num_src, lane);
        if (s < 0) continue;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t k = base + int64_t(u) * group;
          if (k < packs) atomic_add_floats<VEC>(p.grad_x + (s * packs + k) * VEC, g[u]);
        }
      }
    }
  }
}

// The widest VEC (elements per load, VEC * elem_bytes <= 16) dividing every count and aligning every address.
template <size_t NC, size_t NA>
int pick_vec(int elem_bytes, const int64_t (&counts)[NC], const uintptr_t (&addrs)[NA]) {
  for (int vec = 16 / elem_bytes; vec > 1; vec /= 2) {
    bool ok = true;
    for (const int64_t c : counts) ok = ok && c % vec == 0;
    for (const uintptr_t a : addrs) ok = ok && a % (uintptr_t(vec) * elem_bytes) == 0;
    if (ok) return vec;
  }
  return 1;
}

// log2 of the lanes per destination: enough for kUnroll packs per lane to cover the row, at most a warp.
int group_shift_for(int64_t packs) {
  const int64_t need = (packs + kUnroll - 1) / kUnroll;
  int shift = 0;
  while (shift < 5 && (int64_t{1} << shift) < need) ++shift;
  return shift;
}

int grid_for(int64_t num_dst, int shift) {
  const int64_t per_block = kThreads >> shift;
  const int64_t blocks = (num_dst + per_block - 1) / per_block;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

int elem_bytes(Dtype dtype) { return dtype == Dtype::kFloat32 ? 4 : 2; }

template <typename T, typename Index, typename Params, template <typename, typename, int> class Kernel>
cudaError_t launch_vec(const Params& p, int vec, cudaStream_t stream) {
  const int shift = group_shift_for(p.width / vec);
  const int grid = grid_for(p.num_dst, shift);
  switch (vec) {
    case 1:
      Kernel<T, Index, 1>::launch(p, shift, grid, stream);
      break;
    case 2:
      Kernel<T, Index, 2>::launch(p, shift, grid, stream);
      break;
    case 4:
      Kernel<T, Index, 4>::launch(p, shift, grid, stream);
      break;
    case 8:
      if constexpr (sizeof(T) == 2) {
        Kernel<T, Index, 8>::launch(p, shift, grid, stream);
        break;
      }
      return cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T, typename Index, int VEC>
struct Forward {
  static void launch(const MeanParams& p, int shift, int grid, cudaStream_t stream) {
    mean_forward_kernel<T, Index, VEC><<<grid, kThreads, 0, stream>>>(p, shift);
  }
};

template <typename T, typename Index, int VEC>
struct Backward {
  static void launch(const MeanBackwardParams& p, int shift, int grid, cudaStream_t stream) {
    mean_backward_kernel<T, Index, VEC><<<grid, kThreads, 0, stream>>>(p, shift);
  }
};

template <template <typename, typename, int> class Kernel, typename Params>
cudaError_t dispatch(const Params& p, int vec, cudaStream_t stream) {
  switch (p.dtype) {
    case Dtype::kFloat32:
      return p.indices_int64 ? launch_vec<float, int64_t, Params, Kernel>(p, vec, stream)
                             : launch_vec<float, int32_t, Params, Kernel>(p, vec, stream);
    case Dtype::kFloat16:
      return p.indices_int64 ? launch_vec<__half, int64_t, Params, Kernel>(p, vec, stream)
                             : launch_vec<__half, int32_t, Params, Kernel>(p, vec, stream);
    case Dtype::kBFloat16:
      return p.indices_int64 ? launch_vec<__nv_bfloat16, int64_t, Params, Kernel>(p, vec, stream)
                             : launch_vec<__nv_bfloat16, int32_t, Params, Kernel>(p, vec, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_mean_forward(const MeanParams& p, cudaStream_t stream) {
  if (p.num_dst == 0 || p.width == 0) return cudaSuccess;
  const int vec = pick_vec(elem_bytes(p.dtype), {p.width, p.out_stride, p.mean_col, p.self_col < 0 ? 0 : p.self_col},
                           {reinterpret_cast<uintptr_t>(p.x), reinterpret_cast<uintptr_t>(p.out)});
  return dispatch<Forward>(p, vec, stream);
}

cudaError_t launch_mean_backward(const MeanBackwardParams& p, cudaStream_t stream) {
  if (p.num_dst == 0 || p.width == 0) return cudaSuccess;
  int vec = pick_vec(elem_bytes(p.dtype), {p.width, p.grad_stride, p.mean_col, p.self_col < 0 ? 0 : p.self_col},
                     {reinterpret_cast<uintptr_t>(p.grad_out)});
  // grad_x rows start at multiples of width (a multiple of vec) floats; the base must be as aligned (<= 16 bytes).
  while (vec > 1 && reinterpret_cast<uintptr_t>(p.grad_x) % (uintptr_t(vec < 4 ? vec : 4) * sizeof(float)) != 0) {
    vec /= 2;
  }
  return dispatch<Backward>(p, vec, stream);
}

}  // namespace distgnn_aggregate

// Temporal neighbour sampling on the GPU: the CUDA twin of csrc/cpu/temporal.cpp.
//
// Assumptions (the binding below checks them):
// - indptr int64 [N + 1], neighbors / eids int64 [M], times float64 [M], roots int64 [R], root_times
//   float64 [R], all contiguous device memory on one GPU; each node's times are ascending.
// - One thread per root: a binary search for the first entry at or after the root time, then the k most
//   recent entries before it (oldest first), or k distinct uniform picks among them (Floyd's algorithm on a
//   splitmix64 stream keyed by (rng_seed, root index), written in CSR order; k <= kMaxUniformK so the
//   picks fit in registers). Recent picks equal the CPU kernel's exactly; uniform picks follow the same
//   law but not the same stream.
// - A root outside [0, N) or with a corrupt indptr range gets count 0 and raises the error word; the binding
//   syncs once and raises ValueError naming the first such root.
#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxUniformK = 64;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__global__ void temporal_sample_kernel(const int64_t* __restrict__ indptr, int64_t num_nodes, int64_t num_entries,
                                       const int64_t* __restrict__ neighbors, const double* __restrict__ times,
                                       const int64_t* __restrict__ eids, const int64_t* __restrict__ roots,
                                       const double* __restrict__ root_times, int64_t num_roots, int64_t k,
                                       bool uniform, uint64_t rng_seed, int64_t* __restrict__ out_neighbors,
                                       double* __restrict__ out_times, int64_t* __restrict__ out_eids,
                                       int64_t* __restrict__ counts, unsigned long long* __restrict__ first_bad) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_roots) return;
  int64_t* nbr = out_neighbors + i * k;
  double* when = out_times + i * k;
  int64_t* eid = out_eids + i * k;
  for (int64_t j = 0; j < k; ++j) {
    nbr[j] = -1;
    when[j] = 0.0;
    eid[j] = -1;
  }
  counts[i] = 0;
  const int64_t v = roots[i];
  if (v < 0 || v >= num_nodes) {
    atomicMin(first_bad, static_cast<unsigned long long>(i));
    return;
  }
  const int64_t begin = indptr[v], end = indptr[v + 1];
  if (begin < 0 || end < begin || end > num_entries) {
    atomicMin(first_bad, static_cast<unsigned long long>(i));
    return;
  }
  const double t = root_times[i];
  int64_t lo = begin, hi = end;  // first position with times[pos] >= t
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (times[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t available = lo - begin;
  const int64_t count = available < k ? available : k;
  counts[i] = count;
  if (!uniform || count == available) {
    for (int64_t j = 0; j < count; ++j) {
      const int64_t at = lo - count + j;
      nbr[j] = neighbors[at];
      when[j] = times[at];
      eid[j] = eids[at];
    }
    return;
  }
  int64_t picks[kMaxUniformK];
  uint64_t state = mix64(rng_seed ^ mix64(static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ULL));
  for (int64_t j = available - count, n = 0; j < available; ++j, ++n) {
    state += 0x9e3779b97f4a7c15ULL;
    const int64_t r = static_cast<int64_t>(mix64(state) % static_cast<uint64_t>(j + 1));
    bool seen = false;
    for (int64_t m = 0; m < n; ++m) seen = seen || picks[m] == r;
    picks[n] = seen ? j : r;
  }
  for (int64_t a = 1; a < count; ++a) {  // insertion sort: CSR order
    const int64_t value = picks[a];
    int64_t b = a - 1;
    while (b >= 0 && picks[b] > value) {
      picks[b + 1] = picks[b];
      --b;
    }
    picks[b + 1] = value;
  }
  for (int64_t j = 0; j < count; ++j) {
    const int64_t at = begin + picks[j];
    nbr[j] = neighbors[at];
    when[j] = times[at];
    eid[j] = eids[at];
  }
}

void check_vector(const torch::Tensor& t, const char* name, c10::ScalarType dtype, const torch::Device& device) {
  DISTGNN_CHECK(t.dim() == 1, name, " must be 1-D, got ", t.dim(), " dimensions");
  DISTGNN_CHECK(t.scalar_type() == dtype, name, " must have dtype ", dtype, ", got ", t.scalar_type());
  DISTGNN_CHECK(t.device() == device, name, " is on ", t.device(), ", expected ", device);
  DISTGNN_CHECK(t.is_contiguous(), name, " must be contiguous");
}

std::vector<torch::Tensor> temporal_sample(const torch::Tensor& indptr, const torch::Tensor& neighbors,
                                           const torch::Tensor& times, const torch::Tensor& eids,
                                           const torch::Tensor& roots, const torch::Tensor& root_times, int64_t k,
                                           bool uniform, int64_t rng_seed) {
  DISTGNN_CHECK(indptr.is_cuda(), "indptr must be a CUDA tensor");
  const torch::Device device = indptr.device();
  check_vector(indptr, "indptr", torch::kInt64, device);
  check_vector(neighbors, "neighbors", torch::kInt64, device);
  check_vector(times, "times", torch::kFloat64, device);
  check_vector(eids, "eids", torch::kInt64, device);
  check_vector(roots, "roots", torch::kInt64, device);
  check_vector(root_times, "root_times", torch::kFloat64, device);
  DISTGNN_CHECK(indptr.size(0) >= 1, "indptr must have num_nodes + 1 >= 1 entries");
  DISTGNN_CHECK(times.size(0) == neighbors.size(0) && eids.size(0) == neighbors.size(0),
                "neighbors, times and eids must have one entry each per CSR position");
  DISTGNN_CHECK(root_times.size(0) == roots.size(0), "root_times must have one time per root");
  DISTGNN_CHECK(k >= 0, "k must be >= 0, got ", k);
  DISTGNN_CHECK(!uniform || k <= kMaxUniformK, "uniform sampling on the GPU takes k <= ", kMaxUniformK, ", got ", k);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t num_roots = roots.size(0);
  auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto out_neighbors = torch::empty({num_roots, k}, long_options);
  auto out_eids = torch::empty({num_roots, k}, long_options);
  auto out_times = torch::empty({num_roots, k}, long_options.dtype(torch::kFloat64));
  auto counts = torch::empty({num_roots}, long_options);
  auto first_bad = torch::full({1}, num_roots, long_options);
  if (num_roots > 0) {
    const auto stream = c10::cuda::getCurrentCUDAStream();
    const int blocks = static_cast<int>((num_roots + kThreads - 1) / kThreads);
    temporal_sample_kernel<<<blocks, kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), indptr.size(0) - 1, neighbors.size(0), neighbors.data_ptr<int64_t>(),
        times.data_ptr<double>(), eids.data_ptr<int64_t>(), roots.data_ptr<int64_t>(),
        root_times.data_ptr<double>(), num_roots, k, uniform, static_cast<uint64_t>(rng_seed),
        out_neighbors.data_ptr<int64_t>(), out_times.data_ptr<double>(), out_eids.data_ptr<int64_t>(),
        counts.data_ptr<int64_t>(), reinterpret_cast<unsigned long long*>(first_bad.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out_neighbors, out_times, out_eids, counts, first_bad};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("temporal_sample", &temporal_sample, "Temporal neighbour sampling on the GPU; see distgnn.temporal.sampler.");
}

// Python binding of the GPU neighbour sampler (sample.cu).
//
// The Python side (distgnn/sampling/gpu.py) validates types and moves the seeds to the device; this file
// checks what it hands over, resolves device-readable addresses (device memory, or pinned host memory read
// zero-copy) and runs count -> scan -> fill on the current stream, with the count pass's
// error bits returned as the third tensor (Python raises the ValueError). One host sync per call: the total
// pick count and the error word come back together.

#include <cstdint>
#include <vector>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "sample.h"

namespace {

// An address `device` may read for `t`: its own memory, or the mapped address of pinned host memory.
const void* device_readable(const torch::Tensor& t, const torch::Device& device, const char* name) {
  if (t.numel() == 0) return nullptr;
  if (t.is_cuda()) {
    TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the sampler runs on ", device);
    return t.data_ptr();
  }
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, t.data_ptr());
  if (err != cudaSuccess) {
    cudaGetLastError();
    TORCH_CHECK(false, name, ": cudaPointerGetAttributes failed: ", cudaGetErrorString(err));
  }
  TORCH_CHECK(attr.type == cudaMemoryTypeHost, name,
                    " is in pageable host memory: move it to the GPU or pin it (tensor.pin_memory())");
  TORCH_CHECK(attr.devicePointer != nullptr, name, " is pinned but not mapped into the device's address space");
  return attr.devicePointer;
}

std::vector<torch::Tensor> sample_neighbors(const torch::Tensor& indptr, const torch::Tensor& indices,
                                            const torch::Tensor& seeds, int64_t fanout, bool replace,
                                            uint64_t rng_seed, bool return_neighbors, int64_t device_index) {
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  const c10::cuda::CUDAGuard guard(device);
  TORCH_CHECK(indptr.scalar_type() == torch::kInt64 && indptr.dim() == 1 && indptr.numel() >= 1 &&
                        indptr.is_contiguous(),
                    "indptr must be a contiguous 1-D int64 tensor of num_nodes + 1 entries");
  TORCH_CHECK((indices.scalar_type() == torch::kInt64 || indices.scalar_type() == torch::kInt32) &&
                        indices.dim() == 1 && indices.is_contiguous(),
                    "indices must be a contiguous 1-D int32 or int64 tensor");
  TORCH_CHECK(seeds.scalar_type() == torch::kInt64 && seeds.dim() == 1 && seeds.is_contiguous() &&
                        seeds.device() == device,
                    "seeds must be a contiguous 1-D int64 tensor on ", device);
  TORCH_CHECK(fanout >= -1, "fanout must be >= -1 (-1 = all neighbours), got ", fanout);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const int64_t num_seeds = seeds.numel();

  torch::Tensor counts = torch::empty({num_seeds}, ids);
  torch::Tensor flags = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(device));
  distgnn_sample::CountParams cp{};
  cp.indptr = static_cast<const int64_t*>(device_readable(indptr, device, "indptr"));
  cp.num_nodes = indptr.numel() - 1;
  cp.num_edges = indices.numel();
  cp.seeds = seeds.data_ptr<int64_t>();
  cp.num_seeds = num_seeds;
  cp.fanout = fanout;
  cp.replace = replace;
  cp.counts = counts.data_ptr<int64_t>();
  cp.flags = flags.data_ptr<int32_t>();
  distgnn_sample::launch_count(cp, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  torch::Tensor ends = torch::cumsum(counts, 0);
  torch::Tensor total = num_seeds > 0 ? ends.slice(0, num_seeds - 1, num_seeds) : torch::zeros({1}, ids);
  const torch::Tensor summary = torch::cat({total, flags.to(torch::kInt64)}).cpu();  // the one sync
  const int64_t num_picks = summary[0].item<int64_t>();
  const torch::Tensor bits = summary.slice(0, 1, 2);
  if (bits.item<int64_t>() != 0) {
    // Bad seeds or a corrupt indptr: nothing is filled; Python raises the ValueError from the bits.
    return {counts, torch::empty({0}, ids), bits};
  }

  torch::Tensor positions = torch::empty({num_picks}, ids);
  torch::Tensor neighbors = return_neighbors ? torch::empty({num_picks}, ids) : torch::Tensor();
  if (num_picks > 0) {
    distgnn_sample::FillParams fp{};
    fp.indptr = cp.indptr;
    fp.indices = return_neighbors ? device_readable(indices, device, "indices") : nullptr;
    fp.indices_int64 = indices.scalar_type() == torch::kInt64;
    fp.seeds = cp.seeds;
    fp.num_seeds = num_seeds;
    fp.counts = cp.counts;
    fp.ends = ends.data_ptr<int64_t>();
    fp.fanout = fanout;
    fp.replace = replace;
    fp.rng_seed = rng_seed;
    fp.positions = positions.data_ptr<int64_t>();
    fp.neighbors = return_neighbors ? neighbors.data_ptr<int64_t>() : nullptr;
    distgnn_sample::launch_fill(fp, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (return_neighbors) return {counts, positions, bits, neighbors};
  return {counts, positions, bits};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distgnn GPU neighbour sampling (uniform, with or without replacement)";
  m.def("sample_neighbors", &sample_neighbors, "count -> scan -> fill; returns [counts, positions, error_bits(, neighbors)]",
        pybind11::arg("indptr"), pybind11::arg("indices"), pybind11::arg("seeds"), pybind11::arg("fanout"),
        pybind11::arg("replace"), pybind11::arg("rng_seed"), pybind11::arg("return_neighbors"),
        pybind11::arg("device_index"));
}

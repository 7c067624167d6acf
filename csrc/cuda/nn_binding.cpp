// distgnn's fused nn ops on the GPU (the "nn" extension): ReLU + dropout forward and backward (relu_dropout.cu).
// Shapes, dtypes and devices are checked here; both run on the current stream of x's device, without a host sync.
// The forward takes its random stream from torch's default CUDA generator of x's device (so torch.manual_seed
// fixes the masks, and a CUDA graph replays with fresh ones), or from an explicit (seed, offset) for tests.

#include <cstdint>
#include <mutex>

#include <ATen/core/Generator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "check.h"
#include "relu_dropout.h"

namespace {

void check_float32(const torch::Tensor& t, const char* name) {
  DISTGNN_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device());
  DISTGNN_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type());
  DISTGNN_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// seed < 0: draw (seed, offset) from the generator, advancing it by the elements' count rounded up to 4.
torch::Tensor relu_dropout(const torch::Tensor& x, int64_t threshold, double scale, int64_t seed, int64_t offset) {
  check_float32(x, "x");
  DISTGNN_CHECK(threshold >= 0 && threshold < 65536, "threshold must be in [0, 65536), got ", threshold);
  DISTGNN_CHECK(seed >= 0 || seed == -1, "seed must be >= 0, or -1 for torch's generator; got ", seed);
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty_like(x);
  const int64_t n = x.numel();
  at::PhiloxCudaState philox(uint64_t(seed < 0 ? 0 : seed), uint64_t(offset < 0 ? 0 : offset));
  if (seed < 0 && n > 0) {
    auto* gen = at::check_generator<at::CUDAGeneratorImpl>(at::cuda::detail::getDefaultCUDAGenerator(x.get_device()));
    const std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(uint64_t((n + 3) / 4 * 4));
  }
  C10_CUDA_CHECK(distgnn_relu_dropout::launch_forward(x.data_ptr<float>(), out.data_ptr<float>(), n,
                                                      uint32_t(threshold), float(scale), philox,
                                                      c10::cuda::getCurrentCUDAStream(x.get_device()).stream()));
  return out;
}

torch::Tensor relu_dropout_backward(const torch::Tensor& out, const torch::Tensor& grad_out, double scale) {
  check_float32(out, "out");
  check_float32(grad_out, "grad_out");
  DISTGNN_CHECK(out.sizes() == grad_out.sizes() && out.device() == grad_out.device(), "grad_out ", grad_out.sizes(),
                " on ", grad_out.device(), " must match out ", out.sizes(), " on ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  torch::Tensor grad_in = torch::empty_like(out);
  C10_CUDA_CHECK(distgnn_relu_dropout::launch_backward(out.data_ptr<float>(), grad_out.data_ptr<float>(),
                                                       grad_in.data_ptr<float>(), out.numel(), float(scale),
                                                       c10::cuda::getCurrentCUDAStream(out.get_device()).stream()));
  return grad_in;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distgnn fused nn ops on the GPU: ReLU + dropout";
  m.def("relu_dropout", &relu_dropout,
        "dropout(relu(x)) of a float32 CUDA tensor; draws from torch's CUDA generator when seed is -1",
        pybind11::arg("x"), pybind11::arg("threshold"), pybind11::arg("scale"), pybind11::arg("seed") = -1,
        pybind11::arg("offset") = 0);
  m.def("relu_dropout_backward", &relu_dropout_backward, "grad_out * scale where out > 0, else 0",
        pybind11::arg("out"), pybind11::arg("grad_out"), pybind11::arg("scale"));
}

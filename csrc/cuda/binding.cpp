// Python binding of the tiered gather (gather.cu) and the host-memory registration it reads through.
//
// The Python side (distgnn/cache/gather.py) validates dtypes, shapes and ids and builds the miss/hit plan;
// this file checks what it hands over, resolves device-readable addresses and launches on the current stream.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "check.h"
#include "gather.h"

namespace {

void check_index(const torch::Tensor& t, const char* name, const torch::Device& device) {
  DISTGNN_CHECK(t.device() == device, name, " must be on ", device, ", got ", t.device());
  DISTGNN_CHECK(t.scalar_type() == torch::kInt64 && t.dim() == 1 && t.is_contiguous(), name,
                " must be a contiguous 1-D int64 tensor");
}

void check_rows(const torch::Tensor& rows, const torch::Tensor& out, const char* name) {
  DISTGNN_CHECK(rows.dim() == 2 && rows.size(1) == out.size(1) && rows.scalar_type() == out.scalar_type(), name,
                " must be (rows, ", out.size(1), ") of ", out.scalar_type(), ", got ", rows.sizes(), " of ",
                rows.scalar_type());
  DISTGNN_CHECK(rows.size(0) == 0 || rows.size(1) == 0 || rows.is_contiguous(), name, " must be contiguous");
}

// An address the kernel on `device` may dereference for `rows`, enabling peer access where rows live on
// another GPU of this process.
const char* device_readable(const torch::Tensor& rows, const torch::Device& device, const char* name) {
  if (rows.numel() == 0) return nullptr;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, rows.data_ptr());
  if (err != cudaSuccess) {
    cudaGetLastError();
    DISTGNN_CHECK(false, name, ": cudaPointerGetAttributes failed: ", cudaGetErrorString(err));
  }
  if (attr.type == cudaMemoryTypeHost) {
    DISTGNN_CHECK(attr.devicePointer != nullptr, name, " is pinned but not mapped into the device's address space");
    return static_cast<const char*>(attr.devicePointer);
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    if (attr.type == cudaMemoryTypeDevice && attr.device != device.index()) {
      int can_access = 0;
      C10_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, device.index(), attr.device));
      DISTGNN_CHECK(can_access, name, " lives on cuda:", attr.device, ", which cuda:", device.index(),
                    " cannot read (no peer access between them)");
      const cudaError_t peer = cudaDeviceEnablePeerAccess(attr.device, 0);
      if (peer == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        C10_CUDA_CHECK(peer);
      }
    }
    return static_cast<const char*>(rows.data_ptr());
  }
  DISTGNN_CHECK(false, name,
                " is in pageable host memory: pin it (tensor.pin_memory()) or register it "
                "(distgnn.cache.HostRegistration)");
  return nullptr;
}

// Whether memory at `ptr` is pinned/registered host memory or device memory (not pageable host memory).
bool device_accessible(int64_t ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(ptr)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type != cudaMemoryTypeUnregistered;
}

int num_sms(const torch::Device& device) {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device.index()));
  return count;
}

// Plans a gather of `ids`: returns (keys, order), sorted by key when `sort`; adds hits to `hits` ([local, peer])
// and ids no tier can hold to `unplaced` ([count, example]).
std::vector<torch::Tensor> plan(torch::Tensor ids, c10::optional<torch::Tensor> table, int64_t num_shards,
                                int64_t local_rank, int64_t hit_base, int64_t bad_key, bool sort, torch::Tensor hits,
                                torch::Tensor unplaced) {
  DISTGNN_CHECK(ids.is_cuda(), "ids must be on a CUDA device");
  const torch::Device device = ids.device();
  const c10::cuda::CUDAGuard guard(device);
  check_index(ids, "ids", device);
  check_index(hits, "hits", device);
  check_index(unplaced, "unplaced", device);
  DISTGNN_CHECK(hits.numel() == 2 && unplaced.numel() == 2, "hits and unplaced hold two counters each");
  DISTGNN_CHECK(bad_key > hit_base && hit_base >= 0 && ((bad_key + 1) & bad_key) == 0,
                "need bad_key = 2^k - 1 above hit_base, got ", bad_key, " and ", hit_base);
  DISTGNN_CHECK(num_shards >= 1 && local_rank >= 0 && local_rank < num_shards, "bad shard count or local rank");

  distgnn::PlanParams p{};
  p.ids = ids.data_ptr<int64_t>();
  p.batch = ids.numel();
  if (table.has_value()) {
    DISTGNN_CHECK(table->device() == device && table->dim() == 1 && table->is_contiguous(),
                  "the slot table must be a contiguous 1-D tensor on ", device);
    DISTGNN_CHECK(table->scalar_type() == torch::kInt32 || table->scalar_type() == torch::kInt64,
                  "the slot table must be int32 or int64");
    p.table = table->data_ptr();
    p.table_is_int64 = table->scalar_type() == torch::kInt64;
    p.table_size = table->numel();
  }
  p.num_shards = int(num_shards);
  p.local_rank = int(local_rank);
  p.hit_base = hit_base;
  p.bad_key = bad_key;
  torch::Tensor keys = torch::empty_like(ids), order = torch::empty_like(ids);
  p.keys = keys.data_ptr<int64_t>();
  p.order = order.data_ptr<int64_t>();
  p.hits = reinterpret_cast<unsigned long long*>(hits.data_ptr<int64_t>());
  p.unplaced = reinterpret_cast<unsigned long long*>(unplaced.data_ptr<int64_t>());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  C10_CUDA_CHECK(distgnn::launch_plan(p, num_sms(device), stream));
  if (!sort || p.batch < 2) return {keys, order};

  int end_bit = 0;
  while (end_bit < 63 && (int64_t(1) << end_bit) <= bad_key) ++end_bit;
  torch::Tensor sorted_keys = torch::empty_like(keys), sorted_order = torch::empty_like(order);
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(distgnn::sort_plan(nullptr, &temp_bytes, p.keys, nullptr, p.order, nullptr, p.batch, end_bit,
                                    stream));
  torch::Tensor temp = torch::empty({int64_t(temp_bytes)}, ids.options().dtype(torch::kUInt8));
  C10_CUDA_CHECK(distgnn::sort_plan(temp.data_ptr(), &temp_bytes, p.keys, sorted_keys.data_ptr<int64_t>(), p.order,
                                    sorted_order.data_ptr<int64_t>(), p.batch, end_bit, stream));
  return {sorted_keys, sorted_order};
}

// [begin, end) of the sorted `keys` that the CPU share takes (plan.cu, launch_share_range), as a (2,) int64 tensor
// on the keys' device, computed on the current stream.
torch::Tensor share_range(const torch::Tensor& keys, int64_t host_start, int64_t host_end, double share) {
  DISTGNN_CHECK(keys.is_cuda(), "keys must be on a CUDA device, got ", keys.device());
  const torch::Device device = keys.device();
  const c10::cuda::CUDAGuard guard(device);
  check_index(keys, "keys", device);
  DISTGNN_CHECK(share >= 0.0 && share <= 1.0, "share must be in [0, 1], got ", share);
  DISTGNN_CHECK(host_start <= host_end, "host range [", host_start, ", ", host_end, ") is reversed");
  torch::Tensor range = torch::empty({2}, keys.options());
  C10_CUDA_CHECK(distgnn::launch_share_range(keys.data_ptr<int64_t>(), keys.numel(), host_start, host_end, share,
                                             range.data_ptr<int64_t>(),
                                             c10::cuda::getCurrentCUDAStream(device.index())));
  return range;
}

void gather_rows(torch::Tensor out, torch::Tensor keys, torch::Tensor order, int64_t hit_base, int64_t bad_key,
                 bool deduplicate,
                 c10::optional<torch::Tensor> host, int64_t host_start, c10::optional<torch::Tensor> staging,
                 c10::optional<torch::Tensor> staging_ids, std::vector<torch::Tensor> shards, torch::Tensor unplaced,
                 c10::optional<torch::Tensor> skip) {
  DISTGNN_CHECK(out.is_cuda() && out.dim() == 2 && out.is_contiguous(), "out must be a contiguous 2-D CUDA tensor");
  const torch::Device device = out.device();
  const c10::cuda::CUDAGuard guard(device);
  check_index(keys, "keys", device);
  check_index(order, "order", device);
  check_index(unplaced, "unplaced", device);
  DISTGNN_CHECK(keys.numel() == out.size(0) && order.numel() == out.size(0),
                "keys and order need one entry per output row");
  DISTGNN_CHECK(unplaced.numel() == 2, "unplaced must hold [count, example]");
  if (skip.has_value()) {
    check_index(*skip, "skip", device);
    DISTGNN_CHECK(skip->numel() == 2, "skip must hold [begin, end), got ", skip->numel(), " entries");
  }
  DISTGNN_CHECK(shards.size() <= size_t(distgnn::kMaxShards), "at most ", distgnn::kMaxShards, " cache shards");

  distgnn::GatherParams p{};
  p.out = static_cast<char*>(out.data_ptr());
  p.row_bytes = out.size(1) * int64_t(out.element_size());
  p.batch = out.size(0);
  p.keys = keys.data_ptr<int64_t>();
  p.order = order.data_ptr<int64_t>();
  p.hit_base = hit_base;
  p.bad_key = bad_key;
  p.deduplicate = deduplicate;
  p.skip = skip.has_value() ? skip->data_ptr<int64_t>() : nullptr;
  if (host.has_value()) {
    check_rows(*host, out, "host rows");
    p.host = device_readable(*host, device, "host rows");
    p.host_start = host_start;
    p.host_rows = host->size(0);
  }
  if (staging.has_value()) {
    DISTGNN_CHECK(staging_ids.has_value(), "staging rows need their ids");
    check_rows(*staging, out, "staging rows");
    check_index(*staging_ids, "staging ids", device);
    DISTGNN_CHECK(staging_ids->numel() == staging->size(0), "one staging id per staging row");
    p.staging = device_readable(*staging, device, "staging rows");
    p.staging_ids = staging_ids->data_ptr<int64_t>();
    p.staging_rows = staging->size(0);
  }
  p.num_shards = int(shards.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    check_rows(shards[s], out, "cache shard");
    p.shards[s] = device_readable(shards[s], device, "cache shard");
  }
  p.unplaced = reinterpret_cast<unsigned long long*>(unplaced.data_ptr<int64_t>());
  C10_CUDA_CHECK(distgnn::launch_gather(p, num_sms(device), c10::cuda::getCurrentCUDAStream(device.index())));
}

// The all-hit fast path (gather_cached.cu): out[i] = the cached row of ids[i], every id looked up in `table`, a
// slot table without -1 entries; [local, peer] hits are added to `hits` and a failing id is stored into `errors`
// (pinned host memory, [flag, example]). One launch on the current stream, no host sync.
void gather_cached(torch::Tensor out, torch::Tensor ids, torch::Tensor table, std::vector<torch::Tensor> shards,
                   int64_t local_rank, torch::Tensor hits, torch::Tensor errors) {
  DISTGNN_CHECK(out.is_cuda() && out.dim() == 2 && out.is_contiguous(), "out must be a contiguous 2-D CUDA tensor");
  const torch::Device device = out.device();
  const c10::cuda::CUDAGuard guard(device);
  check_index(ids, "ids", device);
  check_index(hits, "hits", device);
  DISTGNN_CHECK(ids.numel() == out.size(0), "ids need one entry per output row, got ", ids.numel(), " for ",
                out.size(0), " rows");
  DISTGNN_CHECK(hits.numel() == 2, "hits must hold [local, peer]");
  DISTGNN_CHECK(table.device() == device && table.dim() == 1 && table.is_contiguous() &&
                    (table.scalar_type() == torch::kInt32 || table.scalar_type() == torch::kInt64),
                "the slot table must be a contiguous 1-D int32 or int64 tensor on ", device);
  DISTGNN_CHECK(!errors.is_cuda() && errors.is_pinned() && errors.scalar_type() == torch::kInt64 &&
                    errors.numel() == 2 && errors.is_contiguous(),
                "errors must be a pinned (2,) int64 host tensor");
  DISTGNN_CHECK(!shards.empty() && shards.size() <= size_t(distgnn::kMaxShards), "1 to ", distgnn::kMaxShards,
                " cache shards, got ", int64_t(shards.size()));
  DISTGNN_CHECK(local_rank >= 0 && local_rank < int64_t(shards.size()), "local_rank ", local_rank,
                " out of range for ", int64_t(shards.size()), " shards");

  distgnn::CachedParams p{};
  p.out = static_cast<char*>(out.data_ptr());
  p.row_bytes = out.size(1) * int64_t(out.element_size());
  p.batch = out.size(0);
  p.ids = ids.data_ptr<int64_t>();
  p.table = table.data_ptr();
  p.table_is_int64 = table.scalar_type() == torch::kInt64;
  p.table_size = table.numel();
  p.num_shards = int(shards.size());
  p.local_rank = int(local_rank);
  for (size_t s = 0; s < shards.size(); ++s) {
    check_rows(shards[s], out, "cache shard");
    p.shards[s] = device_readable(shards[s], device, "cache shard");
  }
  p.hits = reinterpret_cast<unsigned long long*>(hits.data_ptr<int64_t>());
  p.errors = reinterpret_cast<long long*>(const_cast<char*>(device_readable(errors, device, "errors")));
  C10_CUDA_CHECK(distgnn::launch_gather_cached(p, num_sms(device), c10::cuda::getCurrentCUDAStream(device.index())));
}

// Host clocks gather_rows_cpu_share can leave in `marks` (seconds after the call began): keys copy queued, keys
// on the host, buffers allocated, first chunk's copy queued, last chunk's copy queued, side stream done.
constexpr int64_t kShareMarks = 6;

// One non-blocking stream per device for the CPU share's copies, created on first use and kept for the process.
// (Two streams taking turns, and a smaller first chunk, measured no better: docs/BENCHMARKS.md, "GPU gather".)
cudaStream_t side_stream(int device) {
  static std::mutex mutex;
  static std::vector<cudaStream_t> streams;
  const std::lock_guard<std::mutex> lock(mutex);
  if (streams.size() <= size_t(device)) streams.resize(size_t(device) + 1, nullptr);
  if (streams[device] == nullptr) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  return streams[device];
}

// A CUDA event for one call (destroying it while pending is allowed: it is released once it completes).
struct CallEvent {
  cudaEvent_t event = nullptr;
  CallEvent() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CallEvent() { cudaEventDestroy(event); }
  CallEvent(const CallEvent&) = delete;
  CallEvent& operator=(const CallEvent&) = delete;
};

// The CPU share of `host` rows (gather.py, cpu_share): gather_rows for every item but the first `share` of the
// host misses among the sorted `keys` (share_range), which CPU threads gather instead, all in one call, so the
// host spends no Python on the way:
//   current stream: share_range, event `planned`, the zero-copy kernel (skipping the CPU's items);
//   side stream, after `planned`: the CPU's [begin, end) and the keys to pinned memory;
//   host, once they arrived: index_select of the share's rows into pinned chunks of `chunk_rows`, each copied in
//   on the side stream as soon as it is full; the side stream then scatters them to their output rows, and the
//   current stream waits for it.
// Returns when the side stream is done (so the pinned and device buffers can be freed), with the GIL released
// while it waits and gathers; the kernel may still run. Returns the number of items the CPU took; `marks`, when
// given, receives host clocks of the steps (kShareMarks) for benchmarks.
int64_t gather_rows_cpu_share(torch::Tensor out, torch::Tensor keys, torch::Tensor order, int64_t hit_base,
                              int64_t bad_key, torch::Tensor host, int64_t host_start,
                              c10::optional<torch::Tensor> staging, c10::optional<torch::Tensor> staging_ids,
                              std::vector<torch::Tensor> shards, torch::Tensor unplaced, double share,
                              int64_t chunk_rows, c10::optional<torch::Tensor> marks) {
  const auto called = std::chrono::steady_clock::now();
  double* const mark = marks.has_value() ? marks->data_ptr<double>() : nullptr;
  auto stamp = [&](int k) {
    if (mark != nullptr) mark[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - called).count();
  };
  if (marks.has_value()) {
    DISTGNN_CHECK(!marks->is_cuda() && marks->scalar_type() == torch::kFloat64 && marks->is_contiguous() &&
                      marks->numel() >= kShareMarks,
                  "marks must be a contiguous float64 CPU tensor of at least ", kShareMarks, " entries");
  }
  DISTGNN_CHECK(out.is_cuda(), "out must be a CUDA tensor, got one on ", out.device());
  DISTGNN_CHECK(!host.is_cuda(), "the CPU share reads host rows in host memory, got them on ", host.device());
  DISTGNN_CHECK(chunk_rows >= 1, "chunk_rows must be >= 1, got ", chunk_rows);
  const torch::Device device = out.device();
  const c10::cuda::CUDAGuard guard(device);
  check_index(keys, "keys", device);
  check_rows(host, out, "host rows");
  const torch::Tensor range = share_range(keys, host_start, host_start + host.size(0), share);
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device.index());
  const cudaStream_t side = side_stream(device.index());
  const CallEvent planned, arrived, done;
  C10_CUDA_CHECK(cudaEventRecord(planned.event, current));
  gather_rows(out, keys, order, hit_base, bad_key, true, host, host_start, staging, staging_ids, shards, unplaced,
              range);
  const int64_t n = keys.numel();
  const torch::Tensor host_keys = torch::empty({n + 2}, torch::dtype(torch::kInt64).pinned_memory(true));
  int64_t* const on_host = host_keys.data_ptr<int64_t>();
  C10_CUDA_CHECK(cudaStreamWaitEvent(side, planned.event, 0));
  C10_CUDA_CHECK(cudaMemcpyAsync(on_host, range.data_ptr<int64_t>(), 2 * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 side));
  C10_CUDA_CHECK(cudaMemcpyAsync(on_host + 2, keys.data_ptr<int64_t>(), size_t(n) * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, side));
  C10_CUDA_CHECK(cudaEventRecord(arrived.event, side));
  stamp(0);

  const py::gil_scoped_release no_gil;
  C10_CUDA_CHECK(cudaEventSynchronize(arrived.event));
  stamp(1);
  const int64_t begin = on_host[0], count = on_host[1] - on_host[0];
  if (count > 0) {
    const int64_t row_bytes = out.size(1) * int64_t(out.element_size());
    const torch::Tensor staged = torch::empty({count, out.size(1)}, host.options().pinned_memory(true));
    const torch::Tensor landed = torch::empty({count, out.size(1)}, out.options());
    const torch::Tensor rows = torch::empty({std::min(chunk_rows, count)}, torch::dtype(torch::kInt64));
    const int64_t* const keys_of_share = on_host + 2 + begin;
    stamp(2);
    try {
      for (int64_t lo = 0; lo < count; lo += chunk_rows) {
        const int64_t m = std::min(chunk_rows, count - lo);
        int64_t* const row = rows.data_ptr<int64_t>();
        for (int64_t i = 0; i < m; ++i) row[i] = keys_of_share[lo + i] - host_start;
        torch::Tensor into = staged.narrow(0, lo, m);
        torch::index_select_out(into, host, 0, rows.narrow(0, 0, m));
        C10_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(landed.data_ptr()) + lo * row_bytes,
                                       static_cast<const char*>(staged.data_ptr()) + lo * row_bytes,
                                       size_t(m * row_bytes), cudaMemcpyHostToDevice, side));
        if (lo == 0) stamp(3);
      }
      stamp(4);
      const c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromExternal(side, device.index()));
      out.index_copy_(0, order.narrow(0, begin, count), landed);
    } catch (...) {
      cudaStreamSynchronize(side);  // the copies read `staged` and write `landed`: let them end before freeing
      throw;
    }
  }
  C10_CUDA_CHECK(cudaEventRecord(done.event, side));
  C10_CUDA_CHECK(cudaStreamWaitEvent(current, done.event, 0));
  C10_CUDA_CHECK(cudaEventSynchronize(done.event));
  stamp(5);
  return count;
}

// Page-locks [ptr, ptr + nbytes) (widened to whole pages) and maps it for the device; returns the base to pass
// to host_unregister. Read-only mappings are registered read-only.
int64_t host_register(int64_t ptr, int64_t nbytes) {
  DISTGNN_CHECK(nbytes > 0, "nothing to register");
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(ptr) & ~(page - 1);
  const uintptr_t end = (uintptr_t(ptr) + uintptr_t(nbytes) + page - 1) & ~(page - 1);
  const unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
  cudaError_t err = cudaHostRegister(reinterpret_cast<void*>(begin), end - begin, flags);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    DISTGNN_CHECK(false, "host memory at ", ptr, " is already registered (or shares a page with registered memory)");
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    err = cudaHostRegister(reinterpret_cast<void*>(begin), end - begin, flags | cudaHostRegisterReadOnly);
  }
  C10_CUDA_CHECK(err);
  return int64_t(begin);
}

void host_unregister(int64_t base) { C10_CUDA_CHECK(cudaHostUnregister(reinterpret_cast<void*>(base))); }

// CUDA IPC handle of the allocation holding `t` (from torch's caching allocator) and t's byte offset in it.
std::tuple<py::bytes, int64_t> ipc_export(const torch::Tensor& t) {
  DISTGNN_CHECK(t.is_cuda() && t.numel() > 0, "only non-empty CUDA tensors can be shared");
  const c10::cuda::CUDAGuard guard(t.device());
  size_t size = 0;
  void* base = c10::cuda::CUDACachingAllocator::getBaseAllocation(t.data_ptr(), &size);
  cudaIpcMemHandle_t handle;
  C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
  return {py::bytes(reinterpret_cast<const char*>(&handle), sizeof(handle)),
          int64_t(static_cast<char*>(t.data_ptr()) - static_cast<char*>(base))};
}

// Maps another process's allocation into this one (on `device`) and returns `nbytes` from `offset` as uint8; the
// mapping is closed when the tensor is freed.
torch::Tensor ipc_open(const std::string& handle_bytes, int64_t offset, int64_t nbytes, int64_t device) {
  cudaIpcMemHandle_t handle;
  DISTGNN_CHECK(handle_bytes.size() == sizeof(handle), "an IPC handle has ", sizeof(handle), " bytes, got ",
                handle_bytes.size());
  std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* base = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
  return torch::from_blob(
      static_cast<char*>(base) + offset, {nbytes}, [base](void*) { cudaIpcCloseMemHandle(base); },
      torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distgnn CUDA tiered feature gather";
  m.def("gather_rows", &gather_rows, "Fill out's rows from cache shards, host rows and staging rows in one launch",
        py::arg("out"), py::arg("keys"), py::arg("order"), py::arg("hit_base"), py::arg("bad_key"),
        py::arg("deduplicate"), py::arg("host"),
        py::arg("host_start"), py::arg("staging"), py::arg("staging_ids"), py::arg("shards"), py::arg("unplaced"),
        py::arg("skip") = py::none());
  m.def("gather_cached", &gather_cached,
        "Fill out's rows from a cache that holds every node: one launch, no plan, no host sync", py::arg("out"),
        py::arg("ids"), py::arg("table"), py::arg("shards"), py::arg("local_rank"), py::arg("hits"),
        py::arg("errors"));
  m.def("plan", &plan, "Look ids up in the slot table and sort the work by key", py::arg("ids"), py::arg("table"),
        py::arg("num_shards"), py::arg("local_rank"), py::arg("hit_base"), py::arg("bad_key"), py::arg("sort"), py::arg("hits"),
        py::arg("unplaced"));
  m.def("gather_rows_cpu_share", &gather_rows_cpu_share,
        "gather_rows with the first `share` of the host misses gathered by CPU threads and copied in (one call)",
        py::arg("out"), py::arg("keys"), py::arg("order"), py::arg("hit_base"), py::arg("bad_key"), py::arg("host"),
        py::arg("host_start"), py::arg("staging"), py::arg("staging_ids"), py::arg("shards"), py::arg("unplaced"),
        py::arg("share"), py::arg("chunk_rows"), py::arg("marks") = py::none());
  m.def("share_range", &share_range, "Items of the sorted keys that the CPU share takes, [begin, end) on the GPU",
        py::arg("keys"), py::arg("host_start"), py::arg("host_end"), py::arg("share"));
  m.def("device_accessible", &device_accessible, "Whether ptr is pinned/registered host or device memory",
        py::arg("ptr"));
  m.def("host_register", &host_register, "cudaHostRegister whole pages around [ptr, ptr + nbytes); returns base",
        py::arg("ptr"), py::arg("nbytes"));
  m.def("ipc_export", &ipc_export, "CUDA IPC handle and byte offset of a tensor's allocation", py::arg("tensor"));
  m.def("ipc_open", &ipc_open, "Open another process's CUDA IPC handle as a uint8 tensor", py::arg("handle"),
        py::arg("offset"), py::arg("nbytes"), py::arg("device"));
  m.def("host_unregister", &host_unregister, "cudaHostUnregister a base returned by host_register",
        py::arg("base"));
}

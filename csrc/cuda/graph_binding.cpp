// Python binding of the graph extension: GPU neighbour sampling (sample.cu), relabelling (relabel.cu) and the nn
// mean aggregation (aggregate.cu). The sampler:
// The Python side (distgnn/sampling/gpu.py) validates types and moves the seeds to the device; this file
// checks what it hands over, resolves device-readable addresses (device memory, or pinned host memory read
// zero-copy) and runs on the current stream: one memset of the scan's state, the scan pass (which also
// fills when 0 <= fanout <= 32 and the outputs are sized before the sync), the fill kernel otherwise, one
// 16-byte copy of [total, error word] into pinned host memory and one stream sync (GIL released). When the
// output size has a small upper bound (num_seeds * fanout) the outputs are allocated at that size before the
// sync, so the GPU never waits for the host; the outputs returned are views of their first `total` entries.
// Otherwise (fanout -1, or a bound too large) the sync comes between scan and fill. The error word goes back
// to Python, which raises the ValueError. `sample_blocks` queues every layer of a batch (each layer's sampling
// and its relabel over the layer's bound, the counts read on the device) back to back and makes one sync for
// all: one copy of [total, error word, new sources] of every layer.

#include <cstdint>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "aggregate.h"
#include "check.h"
#include "relabel.h"
#include "sample.h"

namespace {

// Outputs are sized before the sync when num_seeds * fanout is at most this many picks (2 x 128 MiB).
constexpr int64_t kMaxBoundPicks = int64_t{1} << 24;

// An address `device` may read for `t`: its own memory, or the mapped address of pinned host memory;
// nullptr for pageable host memory (the caller raises the flag).
const void* device_readable(const torch::Tensor& t, const torch::Device& device, const char* name) {
  if (t.is_cuda()) {
    DISTGNN_CHECK(t.device() == device, name, " is on ", t.device(), " but the sampler runs on ", device);
    return t.data_ptr();
  }
  if (t.numel() == 0) return nullptr;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, t.data_ptr());
  if (err != cudaSuccess) {
    cudaGetLastError();
    DISTGNN_CHECK(false, name, ": cudaPointerGetAttributes failed: ", cudaGetErrorString(err));
  }
  if (attr.type != cudaMemoryTypeHost) return nullptr;
  DISTGNN_CHECK(attr.devicePointer != nullptr, name, " is pinned but not mapped into the device's address space");
  return attr.devicePointer;
}

// Layers of one sample_blocks call, at most.
constexpr size_t kMaxLayers = 10;
// Pinned slots of kSlotWords words for a call's summary ([total, error word], and the new sources' total of each
// layer), reused across calls; one per call in flight, so concurrent callers (the GIL is released during the
// sync) never share one. Slots live as long as the process.
constexpr size_t kSlotWords = 3 * kMaxLayers;
class SummarySlots {
 public:
  int64_t* acquire() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      constexpr size_t kSlotsPerPage = 64;
      void* page = nullptr;
      C10_CUDA_CHECK(cudaHostAlloc(&page, kSlotsPerPage * kSlotWords * sizeof(int64_t), cudaHostAllocPortable));
      for (size_t k = 0; k < kSlotsPerPage; ++k) free_.push_back(static_cast<int64_t*>(page) + kSlotWords * k);
    }
    int64_t* slot = free_.back();
    free_.pop_back();
    return slot;
  }

  void release(int64_t* slot) {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(slot);
  }

 private:
  std::mutex mutex_;
  std::vector<int64_t*> free_;
};

SummarySlots& summary_slots() {
  static SummarySlots* slots = new SummarySlots();  // never destroyed: CUDA may be gone at process exit
  return *slots;
}

// A CSC's arrays: int64 indptr of `rows` + 1 >= 1 entries, int32 or int64 indices, both contiguous and 1-D.
void check_csc(const torch::Tensor& indptr, const torch::Tensor& indices, const char* rows) {
  DISTGNN_CHECK(indptr.scalar_type() == torch::kInt64 && indptr.dim() == 1 && indptr.numel() >= 1 &&
                    indptr.is_contiguous(),
                "indptr must be a contiguous 1-D int64 tensor of ", rows, " + 1 >= 1 entries");
  DISTGNN_CHECK((indices.scalar_type() == torch::kInt64 || indices.scalar_type() == torch::kInt32) &&
                    indices.dim() == 1 && indices.is_contiguous(),
                "indices must be a contiguous 1-D int32 or int64 tensor");
}

// Device words to read back in one sync: `count` words from `words`.
struct SummaryPiece {
  const int64_t* words;
  int64_t count;
};

// Copies the pieces' words, in order, to the host and waits for the stream (GIL released): one sync.
std::vector<int64_t> read_summary(const std::vector<SummaryPiece>& pieces, cudaStream_t stream) {
  int64_t words = 0;
  for (const SummaryPiece& piece : pieces) words += piece.count;
  DISTGNN_CHECK(words <= static_cast<int64_t>(kSlotWords), "a summary of ", words, " words, more than ", kSlotWords);
  int64_t* slot = summary_slots().acquire();
  int64_t filled = 0;
  cudaError_t err = cudaSuccess;
  for (const SummaryPiece& piece : pieces) {
    if (err != cudaSuccess) break;
    err = cudaMemcpyAsync(slot + filled, piece.words, piece.count * sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
    filled += piece.count;
  }
  if (err == cudaSuccess) {
    const pybind11::gil_scoped_release no_gil;
    err = cudaStreamSynchronize(stream);
  }
  const std::vector<int64_t> summary(slot, slot + filled);
  summary_slots().release(slot);
  C10_CUDA_CHECK(err);
  return summary;
}

// What links a layer of a batch to the one before it and to its block (sample_blocks): the count of its seeds
// in use on the device (nullptr: all), where the scan writes the block's indptr (nullptr: nowhere, or the
// scratch when the fill needs it), the offset added to the stored positions (the first edge id), the scan's
// zeroed words given by the caller (summary: 2 words, state: 1 + tiles; nullptr: the launch makes its own) and
// whether the per-seed counts are stored.
struct LayerLinks {
  const int64_t* seeds_used = nullptr;
  int64_t* offsets = nullptr;
  int64_t position_offset = 0;
  int64_t* summary = nullptr;
  int64_t* state = nullptr;
  bool counts = true;
};

// Words of a scan's state (tile counter, tile status) for a layer of `num_seeds` seeds.
int64_t scan_state_words(int64_t num_seeds, int64_t fanout, bool bounded) {
  return 1 + distgnn_sample::scan_tiles(num_seeds, fanout, bounded && distgnn_sample::fusable(fanout));
}

bool bounded_picks(int64_t num_seeds, int64_t fanout) {
  return fanout >= 0 && (fanout == 0 || num_seeds <= kMaxBoundPicks / fanout);
}

// The sampler's launches on the current stream, before its one sync: a scan (+ fill) whose summary holds
// [total, flags]. Bounded (0 <= fanout, num_seeds * fanout <= kMaxBoundPicks): positions (and neighbors)
// have the bound's length and are filled already; otherwise they are empty and `fill` waits for the total.
// `pageable` != 0: nothing was launched (a CSC array is in pageable host memory).
struct SampleLaunch {
  torch::Tensor counts, positions, neighbors, scratch;
  const int64_t* summary = nullptr;
  distgnn_sample::FillParams fill{};
  bool bounded = false;
  int64_t pageable = 0;
  cudaStream_t stream = nullptr;
};

SampleLaunch start_sample(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& seeds,
                           int64_t fanout, bool replace, uint64_t rng_seed, bool return_neighbors,
                           const torch::Device& device, const LayerLinks& links = {}) {
  check_csc(indptr, indices, "num_nodes");
  DISTGNN_CHECK(seeds.scalar_type() == torch::kInt64 && seeds.dim() == 1 && seeds.is_contiguous() &&
                    seeds.device() == device,
                "seeds must be a contiguous 1-D int64 tensor on ", device);
  DISTGNN_CHECK(fanout >= -1, "fanout must be >= -1 (-1 = all neighbours), got ", fanout);

  const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const int64_t num_seeds = seeds.numel();
  SampleLaunch out;

  const void* indptr_ptr = device_readable(indptr, device, "indptr");
  const void* indices_ptr = indices.numel() > 0 ? device_readable(indices, device, "indices") : nullptr;
  if (indptr_ptr == nullptr) out.pageable |= distgnn_sample::kIndptrPageable;
  if (indices.numel() > 0 && indices_ptr == nullptr) out.pageable |= distgnn_sample::kIndicesPageable;
  if (out.pageable != 0) return out;

  out.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  out.bounded = bounded_picks(num_seeds, fanout);
  const bool fused = out.bounded && distgnn_sample::fusable(fanout);

  // Without the caller's words, one scratch allocation: [total, flags], the scan's state (zeroed by one memset),
  // then offsets[] when the fill is a kernel of its own and the caller gave no place for them.
  distgnn_sample::ScanParams sp{};
  const bool own_offsets = !fused && links.offsets == nullptr;
  if (links.summary != nullptr) {
    sp.summary = links.summary;
    sp.state = links.state;
    if (own_offsets) out.scratch = torch::empty({num_seeds + 1}, ids);
    sp.offsets = own_offsets ? out.scratch.data_ptr<int64_t>() : links.offsets;
  } else {
    const int64_t zeroed = 2 + scan_state_words(num_seeds, fanout, out.bounded);
    out.scratch = torch::empty({zeroed + (own_offsets ? num_seeds + 1 : 0)}, ids);
    sp.summary = out.scratch.data_ptr<int64_t>();
    sp.state = sp.summary + 2;
    sp.offsets = own_offsets ? sp.summary + zeroed : links.offsets;
    C10_CUDA_CHECK(cudaMemsetAsync(sp.summary, 0, zeroed * sizeof(int64_t), out.stream));
  }
  sp.indptr = static_cast<const int64_t*>(indptr_ptr);
  sp.num_nodes = indptr.numel() - 1;
  sp.num_edges = indices.numel();
  sp.seeds = seeds.data_ptr<int64_t>();
  sp.num_seeds = num_seeds;
  sp.seeds_used = links.seeds_used;
  sp.fanout = fanout;
  sp.replace = replace;
  out.summary = sp.summary;

  if (links.counts) out.counts = torch::empty({num_seeds}, ids);
  distgnn_sample::FillParams& fp = out.fill;
  fp.indptr = sp.indptr;
  fp.indices = indices_ptr;
  fp.indices_int64 = indices.scalar_type() == torch::kInt64;
  fp.seeds = sp.seeds;
  fp.num_seeds = num_seeds;
  fp.offsets = sp.offsets;
  fp.fanout = fanout;
  fp.replace = replace;
  fp.rng_seed = rng_seed;
  fp.counts = links.counts ? out.counts.data_ptr<int64_t>() : nullptr;
  fp.position_offset = links.position_offset;
  if (out.bounded) {
    // The fill runs before the sync; a flagged seed counts 0, so a bad input makes it write nothing.
    out.positions = torch::empty({num_seeds * fanout}, ids);
    out.neighbors = return_neighbors ? torch::empty({num_seeds * fanout}, ids) : torch::Tensor();
    fp.positions = out.positions.data_ptr<int64_t>();
    fp.neighbors = return_neighbors ? out.neighbors.data_ptr<int64_t>() : nullptr;
  }
  C10_CUDA_CHECK(distgnn_sample::launch_scan(sp, fused ? &fp : nullptr, out.stream));
  if (out.bounded && !fused) C10_CUDA_CHECK(distgnn_sample::launch_fill(fp, out.stream));
  return out;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, int64_t> sample_neighbors(
    const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& seeds, int64_t fanout,
    bool replace, uint64_t rng_seed, bool return_neighbors, int64_t device_index) {
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  const c10::cuda::CUDAGuard guard(device);
  SampleLaunch run = start_sample(indptr, indices, seeds, fanout, replace, rng_seed, return_neighbors, device);
  const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const torch::Tensor none;
  if (run.pageable != 0) return {torch::empty({0}, ids), torch::empty({0}, ids), none, run.pageable};
  const auto summary = read_summary({{run.summary, 2}}, run.stream);
  const int64_t total = summary[0], flags = summary[1];
  if (flags != 0) return {run.counts, torch::empty({0}, ids), none, flags};
  torch::Tensor positions, neighbors;
  if (run.bounded) {
    positions = run.positions.narrow(0, 0, total);
    if (return_neighbors) neighbors = run.neighbors.narrow(0, 0, total);
  } else {
    positions = torch::empty({total}, ids);
    neighbors = return_neighbors ? torch::empty({total}, ids) : none;
    run.fill.positions = positions.data_ptr<int64_t>();
    run.fill.neighbors = return_neighbors ? neighbors.data_ptr<int64_t>() : nullptr;
    C10_CUDA_CHECK(distgnn_sample::launch_fill(run.fill, run.stream));
  }
  return {run.counts, positions, neighbors, 0};
}

// A relabel's hash table (relabel.cu) in int64 words: `keys_first` holds the keys then `first` (uint32), 1.5 x
// capacity words that start all-ones; `local` capacity int32 entries; `total` a zeroed device word.
struct RelabelTable {
  int64_t capacity = 0;
  int64_t* keys_first = nullptr;
  int32_t* local = nullptr;
  int64_t* total = nullptr;
};

int64_t table_words(int64_t capacity) { return capacity + capacity / 2; }

// The relabel's launches (relabel.cu) on the current stream, before its sync: src_nids (dst first, then room
// for every edge's source), indices, and the device word that will hold the new sources' total. `edges_used`
// (device, optional) is how many of the `src` entries are in use, `dst_used` (device, optional) how many of
// the `dst` entries; `map` (optional) maps src through a table; `sources` (device, optional) receives the
// destinations in use plus the new sources. `given` (optional): the table, cleared by the caller, of
// relabel_capacity(num_dst + num_edges) slots; without it the launch makes and clears its own.
struct RelabelLaunch {
  torch::Tensor src_nids, indices, table, flags, scan;
  const int64_t* total = nullptr;
  cudaStream_t stream = nullptr;
};

RelabelLaunch start_relabel(const torch::Tensor& dst, const torch::Tensor& src, const int64_t* edges_used,
                             const torch::Tensor& map, const int64_t* dst_used = nullptr, int64_t* sources = nullptr,
                             const RelabelTable* given = nullptr) {
  const int64_t num_dst = dst.numel(), num_edges = src.numel(), n = num_dst + num_edges;
  DISTGNN_CHECK(n < (int64_t{1} << 30), "at most 2^30 ids per layer, got ", n);
  RelabelLaunch out;
  out.stream = c10::cuda::getCurrentCUDAStream(dst.device().index()).stream();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dst.device());
  RelabelTable table;
  if (given != nullptr) {
    table = *given;
  } else {
    // keys | first (all-ones), local, then the zeroed total.
    table.capacity = distgnn_sample::relabel_capacity(n);
    const int64_t cleared = table_words(table.capacity);
    out.table = torch::empty({cleared + table.capacity / 2 + 1}, i64);
    table.keys_first = out.table.data_ptr<int64_t>();
    table.local = reinterpret_cast<int32_t*>(table.keys_first + cleared);
    table.total = table.keys_first + cleared + table.capacity / 2;
    C10_CUDA_CHECK(cudaMemsetAsync(table.keys_first, 0xFF, cleared * sizeof(int64_t), out.stream));
    C10_CUDA_CHECK(cudaMemsetAsync(table.total, 0, sizeof(int64_t), out.stream));
  }
  DISTGNN_CHECK(table.capacity == distgnn_sample::relabel_capacity(n), "a relabel table of ", table.capacity,
                " slots for ", n, " positions");
  out.flags = torch::empty({n + 2 * num_edges}, i64.dtype(torch::kInt32));
  out.src_nids = torch::empty({n}, i64);
  out.indices = torch::empty({num_edges}, i64);
  const size_t scan_bytes = distgnn_sample::relabel_scan_bytes(num_edges);
  out.scan = torch::empty({static_cast<int64_t>(scan_bytes) + 1}, i64.dtype(torch::kUInt8));

  distgnn_sample::RelabelParams p{};
  p.dst = dst.data_ptr<int64_t>();
  p.num_dst = num_dst;
  p.dst_used = dst_used;
  p.src = src.data_ptr<int64_t>();
  p.num_edges = num_edges;
  p.edges_used = edges_used;
  p.map = map.defined() ? map.data_ptr<int64_t>() : nullptr;
  p.keys = reinterpret_cast<unsigned long long*>(table.keys_first);
  p.first = reinterpret_cast<unsigned int*>(table.keys_first + table.capacity);
  p.local = table.local;
  p.capacity = table.capacity;
  p.slot_of = out.flags.data_ptr<int32_t>();
  p.is_new = p.slot_of + n;
  p.rank = p.is_new + num_edges;
  p.src_nids = out.src_nids.data_ptr<int64_t>();
  p.indices = out.indices.data_ptr<int64_t>();
  p.total = table.total;
  p.sources = sources;
  out.total = p.total;
  C10_CUDA_CHECK(distgnn_sample::launch_relabel(p, out.scan.data_ptr(), scan_bytes, out.stream));
  return out;
}

void check_relabel_ids(const torch::Tensor& dst, const torch::Tensor& src) {
  DISTGNN_CHECK(dst.is_cuda() && src.device() == dst.device(), "dst and src must be on one CUDA device");
  for (const auto* t : {&dst, &src}) {
    DISTGNN_CHECK(t->scalar_type() == torch::kInt64 && t->dim() == 1 && t->is_contiguous(),
                  "dst and src must be contiguous 1-D int64 tensors");
  }
}

// Relabel of one layer (relabel.cu): (src_nids, indices), one host sync to size src_nids.
std::tuple<torch::Tensor, torch::Tensor> relabel(const torch::Tensor& dst, const torch::Tensor& src) {
  check_relabel_ids(dst, src);
  const c10::cuda::CUDAGuard guard(dst.device());
  const RelabelLaunch run = start_relabel(dst, src, nullptr, torch::Tensor());
  const int64_t total = read_summary({{run.total, 1}}, run.stream)[0];
  return {run.src_nids.narrow(0, 0, dst.numel() + total), run.indices};
}

// Every layer of a batch as blocks, with one host sync. Layer 0 samples the CSC rows `rows` of the destinations
// `seeds` (global ids), each next layer the previous block's sources, taken as CSC rows (so more than one layer
// needs a CSC whose rows are the global ids: a node range starting at 0), whose count stays on the device: every
// launch covers its layer's bound (the seeds of layer l + 1 are at most bound_l x (1 + fanout_l)) and its kernels
// stop at the count. Per layer: the picks (draws keyed by rng_seeds[l] and each seed's index, as
// sample_neighbors), their neighbours' ids through local_to_global (when defined) relabelled against the layer's
// seeds, the block's indptr (written by the scan), and the picked edges' ids: edge_start + position when
// edge_start >= 0 (stored so by the fill), else edge_ids[position]. The batch's zeroed words and its tables (each
// sized to its layer's bound) are two allocations with one memset each; one copy of [picks, error word, new
// sources] of every layer and one sync at the end. Returns ([indptr, src_nids, indices, eids] for each layer,
// error word); with an error word (the first layer's that has one) the tensors are empty. Needs bounded fanouts
// (0 <= fanout, bound x fanout <= kMaxBoundPicks in every layer).
std::tuple<std::vector<torch::Tensor>, int64_t> sample_blocks(
    const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& rows, const torch::Tensor& seeds,
    const std::vector<int64_t>& fanouts, bool replace, const std::vector<uint64_t>& rng_seeds,
    const std::optional<torch::Tensor>& local_to_global, int64_t edge_start, const std::optional<torch::Tensor>& edge_ids,
    int64_t device_index) {
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  const c10::cuda::CUDAGuard guard(device);
  const size_t layers = fanouts.size();
  DISTGNN_CHECK(layers >= 1 && layers <= kMaxLayers && rng_seeds.size() == layers, "sample_blocks takes 1 to ",
                kMaxLayers, " layers with one rng seed each, got ", layers, " fanouts and ", rng_seeds.size(),
                " seeds");
  check_relabel_ids(seeds, seeds);
  DISTGNN_CHECK(seeds.device() == device && rows.numel() == seeds.numel(), "seeds must be on ", device,
                " with one CSC row each (", rows.numel(), "), got ", seeds.numel(), " on ", seeds.device());
  std::vector<int64_t> bound{seeds.numel()};
  for (const int64_t fanout : fanouts) {
    const int64_t seeds_bound = bound.back();
    DISTGNN_CHECK(fanout >= 0 && (fanout == 0 || seeds_bound <= kMaxBoundPicks / fanout),
                  "sample_blocks needs bounded fanouts: 0 <= fanout and seeds * fanout <= ", kMaxBoundPicks,
                  " in every layer, got fanout ", fanout, " for up to ", seeds_bound, " seeds");
    bound.push_back(seeds_bound + seeds_bound * fanout);
  }
  torch::Tensor map;
  if (local_to_global.has_value()) {
    map = *local_to_global;
    DISTGNN_CHECK(map.device() == device && map.scalar_type() == torch::kInt64 && map.dim() == 1 &&
                      map.is_contiguous(),
                  "local_to_global must be a contiguous 1-D int64 tensor on ", device);
  }
  DISTGNN_CHECK(edge_start >= 0 || edge_ids.has_value(), "pass edge_start >= 0 or edge_ids");
  const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  // Two allocations and two memsets for the batch's small words and tables. Zeroed: the summary the host reads
  // ([total, flags, new sources] per layer), each layer's sources in use (the next layer's seeds, written by its
  // relabel), each layer's scan state. All-ones: each layer's keys and `first`, back to back; then the local ids.
  std::vector<int64_t> capacity, state_at, table_at;
  const int64_t num_layers = static_cast<int64_t>(layers);
  int64_t zeroed = 4 * num_layers, cleared = 0, local_words = 0;
  for (size_t l = 0; l < layers; ++l) {
    state_at.push_back(zeroed);
    zeroed += scan_state_words(bound[l], fanouts[l], true);
    capacity.push_back(distgnn_sample::relabel_capacity(bound[l] + bound[l] * fanouts[l]));
    table_at.push_back(cleared);
    cleared += table_words(capacity.back());
    local_words += capacity.back() / 2;
  }
  const torch::Tensor words = torch::empty({zeroed}, ids);
  const torch::Tensor tables = torch::empty({cleared + local_words}, ids);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  C10_CUDA_CHECK(cudaMemsetAsync(words.data_ptr<int64_t>(), 0, zeroed * sizeof(int64_t), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(tables.data_ptr<int64_t>(), 0xFF, cleared * sizeof(int64_t), stream));
  int64_t* summary_words = words.data_ptr<int64_t>();
  int64_t* sources = summary_words + 3 * num_layers;
  int32_t* locals = reinterpret_cast<int32_t*>(tables.data_ptr<int64_t>() + cleared);

  std::vector<SampleLaunch> picks;
  std::vector<RelabelLaunch> blocks;
  std::vector<torch::Tensor> indptrs;
  torch::Tensor dst = seeds;
  const int64_t* dst_used = nullptr;
  for (size_t l = 0; l < layers; ++l) {
    indptrs.push_back(torch::empty({bound[l] + 1}, ids));
    LayerLinks links;
    links.seeds_used = dst_used;
    links.offsets = indptrs.back().data_ptr<int64_t>();
    links.position_offset = edge_start >= 0 ? edge_start : 0;
    links.summary = summary_words + 3 * l;
    links.state = summary_words + state_at[l];
    links.counts = false;
    const torch::Tensor& layer_rows = l == 0 ? rows : dst;
    picks.push_back(start_sample(indptr, indices, layer_rows, fanouts[l], replace, rng_seeds[l], true, device, links));
    if (picks.back().pageable != 0) return {std::vector<torch::Tensor>(), picks.back().pageable};
    const RelabelTable table{capacity[l], tables.data_ptr<int64_t>() + table_at[l], locals,
                             summary_words + 3 * l + 2};
    locals += capacity[l];
    blocks.push_back(start_relabel(dst, picks.back().neighbors, picks.back().summary, map, dst_used, sources + l,
                                   &table));
    dst = blocks.back().src_nids;  // bound[l + 1] entries, the first sources[l] in use
    dst_used = sources + l;
  }
  const auto summary = read_summary({{summary_words, 3 * num_layers}}, stream);
  std::vector<torch::Tensor> out;
  int64_t num_dst = seeds.numel();
  for (size_t l = 0; l < layers; ++l) {
    const int64_t total = summary[3 * l], flags = summary[3 * l + 1], new_sources = summary[3 * l + 2];
    if (flags != 0) return {std::vector<torch::Tensor>(), flags};
    const torch::Tensor positions = picks[l].positions.narrow(0, 0, total);
    out.push_back(indptrs[l].narrow(0, 0, num_dst + 1));
    out.push_back(blocks[l].src_nids.narrow(0, 0, num_dst + new_sources));
    out.push_back(blocks[l].indices.narrow(0, 0, total));
    out.push_back(edge_start >= 0 ? positions : edge_ids->index_select(0, positions));
    num_dst += new_sources;
  }
  return {out, 0};
}

}  // namespace

// Mean aggregation over a Block's CSC (aggregate.cu): [x[:num_dst] | mean] (with_self) or the mean alone, and its
// backward. Shapes, dtypes and devices are checked here; index ranges and indptr's monotonicity on the device
// (a device-side assert, no host sync). Both run on the current stream of x's device.
namespace {

distgnn_aggregate::Dtype aggregate_dtype(const torch::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return distgnn_aggregate::Dtype::kFloat32;
    case torch::kFloat16:
      return distgnn_aggregate::Dtype::kFloat16;
    case torch::kBFloat16:
      return distgnn_aggregate::Dtype::kBFloat16;
    default:
      DISTGNN_CHECK(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
}

void check_block_csc(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Device& device) {
  DISTGNN_CHECK(indptr.device() == device && indices.device() == device, "indptr (on ", indptr.device(),
                ") and indices (on ", indices.device(), ") must be on the features' device ", device);
  check_csc(indptr, indices, "num_dst");
}

torch::Tensor mean_aggregate(const torch::Tensor& indptr, const torch::Tensor& indices, const torch::Tensor& x,
                             bool with_self) {
  DISTGNN_CHECK(x.is_cuda(), "x must be a CUDA tensor, got one on ", x.device());
  DISTGNN_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous 2-D (num_src, F) tensor, got shape ",
                x.sizes());
  const distgnn_aggregate::Dtype dtype = aggregate_dtype(x, "x");
  check_block_csc(indptr, indices, x.device());
  const int64_t num_dst = indptr.numel() - 1, width = x.size(1);
  DISTGNN_CHECK(!with_self || x.size(0) >= num_dst, "x has ", x.size(0), " rows but the block has ", num_dst,
                " destinations, which come first among its sources");
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty({num_dst, with_self ? 2 * width : width}, x.options());
  distgnn_aggregate::MeanParams p{};
  p.indptr = indptr.data_ptr<int64_t>();
  p.indices = indices.data_ptr();
  p.indices_int64 = indices.scalar_type() == torch::kInt64;
  p.num_dst = num_dst;
  p.num_src = x.size(0);
  p.num_edges = indices.numel();
  p.width = width;
  p.dtype = dtype;
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.out_stride = out.size(1);
  p.mean_col = with_self ? width : 0;
  p.self_col = with_self ? 0 : -1;
  C10_CUDA_CHECK(distgnn_aggregate::launch_mean_forward(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream()));
  return out;
}

torch::Tensor mean_aggregate_backward(const torch::Tensor& indptr, const torch::Tensor& indices,
                                      const torch::Tensor& grad_out, int64_t num_src, bool with_self) {
  DISTGNN_CHECK(grad_out.is_cuda(), "grad_out must be a CUDA tensor, got one on ", grad_out.device());
  DISTGNN_CHECK(grad_out.dim() == 2 && grad_out.is_contiguous(), "grad_out must be a contiguous 2-D tensor, got shape ",
                grad_out.sizes());
  const distgnn_aggregate::Dtype dtype = aggregate_dtype(grad_out, "grad_out");
  check_block_csc(indptr, indices, grad_out.device());
  const int64_t num_dst = indptr.numel() - 1;
  DISTGNN_CHECK(grad_out.size(0) == num_dst, "grad_out has ", grad_out.size(0), " rows, the block ", num_dst,
                " destinations");
  DISTGNN_CHECK(!with_self || grad_out.size(1) % 2 == 0, "grad_out of [self | mean] needs an even width, got ",
                grad_out.size(1));
  DISTGNN_CHECK(num_src >= 0 && (!with_self || num_src >= num_dst), "num_src = ", num_src, " must be >= 0",
                with_self ? " and >= num_dst" : "");
  const int64_t width = with_self ? grad_out.size(1) / 2 : grad_out.size(1);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  // float32 accumulator (the atomics need it); float16 / bfloat16 gradients are cast once at the end.
  torch::Tensor grad_x = torch::zeros({num_src, width}, grad_out.options().dtype(torch::kFloat32));
  distgnn_aggregate::MeanBackwardParams p{};
  p.indptr = indptr.data_ptr<int64_t>();
  p.indices = indices.data_ptr();
  p.indices_int64 = indices.scalar_type() == torch::kInt64;
  p.num_dst = num_dst;
  p.num_src = num_src;
  p.num_edges = indices.numel();
  p.width = width;
  p.dtype = dtype;
  p.grad_out = grad_out.data_ptr();
  p.grad_stride = grad_out.size(1);
  p.mean_col = with_self ? width : 0;
  p.self_col = with_self ? 0 : -1;
  p.grad_x = grad_x.data_ptr<float>();
  C10_CUDA_CHECK(
      distgnn_aggregate::launch_mean_backward(p, c10::cuda::getCurrentCUDAStream(grad_out.get_device()).stream()));
  return dtype == distgnn_aggregate::Dtype::kFloat32 ? grad_x : grad_x.to(grad_out.scalar_type());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distgnn graph kernels on the GPU: neighbour sampling, relabel, mean aggregation";
  m.def("relabel", &relabel, "dst first, then new sources in first-appearance order; (src_nids, indices)",
        pybind11::arg("dst"), pybind11::arg("src"));
  m.def("sample_blocks", &sample_blocks,
        "every layer of a batch relabelled into blocks with one host sync; returns ([indptr, src_nids, indices, "
        "eids] per layer, error bits), the tensors meaningful (and present) only when the error bits are 0",
        pybind11::arg("indptr"), pybind11::arg("indices"), pybind11::arg("rows"), pybind11::arg("seeds"),
        pybind11::arg("fanouts"),
        pybind11::arg("replace"), pybind11::arg("rng_seeds"), pybind11::arg("local_to_global"),
        pybind11::arg("edge_start"), pybind11::arg("edge_ids"), pybind11::arg("device_index"));
  m.def("sample_neighbors", &sample_neighbors,
        "scan -> fill; returns (counts, positions, neighbors or None, error bits); outputs are meaningful only "
        "when the error bits are 0",
        pybind11::arg("indptr"), pybind11::arg("indices"), pybind11::arg("seeds"), pybind11::arg("fanout"),
        pybind11::arg("replace"), pybind11::arg("rng_seed"), pybind11::arg("return_neighbors"),
        pybind11::arg("device_index"));
  m.def("mean_aggregate", &mean_aggregate,
        "mean of each destination's in-neighbour rows of x (0 without in-edges); with_self: [x[:num_dst] | mean]",
        pybind11::arg("indptr"), pybind11::arg("indices"), pybind11::arg("x"), pybind11::arg("with_self"));
  m.def("mean_aggregate_backward", &mean_aggregate_backward,
        "gradient of mean_aggregate w.r.t. x, (num_src, F) in grad_out's dtype (float32 atomics underneath)",
        pybind11::arg("indptr"), pybind11::arg("indices"), pybind11::arg("grad_out"), pybind11::arg("num_src"),
        pybind11::arg("with_self"));
}

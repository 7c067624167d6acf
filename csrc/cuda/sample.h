// Uniform neighbour sampling of a CSC graph on the GPU: parameter blocks and launchers (sample.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace distgnn_sample {

// Bits of the error word (the Python side, distgnn/sampling/gpu.py, turns them into ValueErrors).
enum SampleFlag : int64_t {
  kSeedOutOfRange = 1,   // a seed is < 0 or >= num_nodes (scan pass)
  kCorruptIndptr = 2,    // indptr[s] > indptr[s + 1], or a seed's range leaves [0, num_edges] (scan pass)
  kIndptrEnd = 4,        // indptr[num_nodes] != num_edges (scan pass)
  kIndptrPageable = 8,   // indptr is in pageable host memory (binding, before any launch)
  kIndicesPageable = 16  // indices is in pageable host memory (binding, before any launch)
};

// Fanouts up to this are sampled by lane groups of fanout rounded up to a power of two, picks in registers.
constexpr int64_t kMaxSmallFanout = 32;

struct ScanParams {
  const int64_t* indptr;  // (num_nodes + 1,), device-readable
  int64_t num_nodes;
  int64_t num_edges;
  const int64_t* seeds;  // (num_seeds,), device memory
  int64_t num_seeds;
  // Optional: how many of the seeds are in use (<= num_seeds) in device memory (a previous layer's sources, not
  // known on the host); seeds past it count 0 and are never read. nullptr: all num_seeds.
  const int64_t* seeds_used;
  int64_t fanout;  // -1 = all
  bool replace;
  // Zeroed by the caller: summary = [total, flags] (total = the sum of the counts, flags = SampleFlag bits), the
  // words the host reads back; state = [tile counter, tile status (num_tiles)] for the decoupled look-back.
  int64_t* summary;
  int64_t* state;
  // out: (num_seeds + 1,) exclusive prefix sum of the counts (a block's indptr); needed by a scan-only launch,
  // optional (nullptr) for a fused one.
  int64_t* offsets;
};

struct FillParams {
  const int64_t* indptr;  // device-readable
  const void* indices;    // device-readable int32 or int64; read only when neighbors != nullptr
  bool indices_int64;
  const int64_t* seeds;
  int64_t num_seeds;
  const int64_t* offsets;  // from the scan pass
  int64_t fanout;
  bool replace;
  uint64_t rng_seed;
  int64_t* counts;     // optional out: (num_seeds,) offsets[i + 1] - offsets[i]; nullptr: not stored
  int64_t* positions;  // out: (offsets[num_seeds],) or more: CSC position + position_offset
  int64_t* neighbors;  // out: like positions, indices[CSC position] as int64, or nullptr
  int64_t position_offset;  // added to every stored position (e.g. the partition's first edge id)
};

// Whether the scan pass can fill too (0 <= fanout <= kMaxSmallFanout).
inline bool fusable(int64_t fanout) { return fanout >= 0 && fanout <= kMaxSmallFanout; }
// Tiles (blocks) of the scan pass, fused or scan-only: at least one, so indptr's end is always checked. The
// caller zeroes the 2 words of ScanParams::summary and 1 + scan_tiles(...) words of ScanParams::state.
int64_t scan_tiles(int64_t num_seeds, int64_t fanout, bool fused);
// Count pass + decoupled look-back scan in one kernel. With fill != nullptr (0 <= fanout <= kMaxSmallFanout)
// each tile also fills its seeds at once (counts, positions, neighbors); else it writes p.offsets.
cudaError_t launch_scan(const ScanParams& p, const FillParams* fill, cudaStream_t stream);
// Writes counts and fills positions (and neighbors) from p.offsets; seeds with count 0 (among them every
// seed the scan flagged) touch nothing but their count, so the fill may run before the flags are read.
cudaError_t launch_fill(const FillParams& p, cudaStream_t stream);

}  // namespace distgnn_sample

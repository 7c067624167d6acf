// Temporal neighbour sampling: see temporal.h. One binary search per root,
// roots in parallel on the thread pool; uniform picks use Floyd's algorithm
// on a stream keyed by root index, so results do not depend on threads.
#include "temporal.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.h"
#include "rng.h"

namespace distgnn {

namespace {

constexpr int64_t kGrain = 256;

// Floyd's algorithm: `count` distinct offsets of [0, n), written sorted.
void pick_distinct(int64_t n, int64_t count, SeedStream& rng, std::vector<int64_t>& scratch) {
  scratch.clear();
  for (int64_t j = n - count; j < n; ++j) {
    const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j + 1)));
    if (std::find(scratch.begin(), scratch.end(), t) == scratch.end())
      scratch.push_back(t);
    else
      scratch.push_back(j);
  }
  std::sort(scratch.begin(), scratch.end());
}

}  // namespace

void temporal_sample(const TemporalCsrView& csr, const int64_t* roots, const double* root_times, int64_t num_roots,
                     int64_t k, bool uniform, uint64_t rng_seed, int num_threads, int64_t* out_neighbors,
                     double* out_times, int64_t* out_eids, int64_t* counts) {
  std::atomic<int64_t> first_bad{num_roots};
  parallel_for(num_roots, num_threads, kGrain, [&] {
    return [&, scratch = std::vector<int64_t>()](int64_t first, int64_t last) mutable {
      for (int64_t i = first; i < last; ++i) {
        int64_t* nbr = out_neighbors + i * k;
        double* when = out_times + i * k;
        int64_t* eid = out_eids + i * k;
        std::fill(nbr, nbr + k, int64_t{-1});
        std::fill(when, when + k, 0.0);
        std::fill(eid, eid + k, int64_t{-1});
        counts[i] = 0;
        const int64_t v = roots[i];
        if (v < 0 || v >= csr.num_nodes) {
          int64_t seen = first_bad.load();
          while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
          }
          continue;
        }
        const int64_t begin = csr.indptr[v], end = csr.indptr[v + 1];
        if (begin < 0 || end < begin || end > csr.num_entries) {
          int64_t seen = first_bad.load();
          while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
          }
          continue;
        }
        // First entry at or after the root time: everything before it is strictly earlier.
        const int64_t stop = std::lower_bound(csr.times + begin, csr.times + end, root_times[i]) - csr.times;
        const int64_t available = stop - begin;
        const int64_t count = std::min(available, k);
        counts[i] = count;
        if (count == 0) continue;
        if (!uniform || count == available) {
          for (int64_t j = 0; j < count; ++j) {
            const int64_t at = stop - count + j;
            nbr[j] = csr.neighbors[at];
            when[j] = csr.times[at];
            eid[j] = csr.eids[at];
          }
          continue;
        }
        SeedStream rng(rng_seed, static_cast<uint64_t>(i));
        pick_distinct(available, count, rng, scratch);
        for (int64_t j = 0; j < count; ++j) {
          const int64_t at = begin + scratch[j];
          nbr[j] = csr.neighbors[at];
          when[j] = csr.times[at];
          eid[j] = csr.eids[at];
        }
      }
    };
  });
  const int64_t bad = first_bad.load();
  if (bad < num_roots) {
    const int64_t v = roots[bad];
    if (v < 0 || v >= csr.num_nodes)
      throw std::invalid_argument("root " + std::to_string(bad) + " is node " + std::to_string(v) +
                                  ", outside [0, " + std::to_string(csr.num_nodes) + ")");
    throw std::invalid_argument("indptr range of node " + std::to_string(v) + " lies outside [0, " +
                                std::to_string(csr.num_entries) + "]: the CSR is corrupt");
  }
}

}  // namespace distgnn

// Neighbour sampling kernel: a counting pass, a prefix sum, a filling pass.
//
// Both passes run in parallel over seeds (parallel.h); every seed draws from
// its own counter-based stream (rng.h), so results are identical for any
// thread count. Uniform picks without replacement use Floyd's algorithm (small
// fanouts) or a partial Fisher-Yates shuffle; weighted picks without
// replacement use exponential keys (Efraimidis-Spirakis, as DGL does);
// weighted picks with replacement invert the cumulative weights.
#include "sample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "parallel.h"
#include "rng.h"

namespace distgnn {
namespace {

enum class Fault : int { kSeed = 1, kIndptr = 2, kProb = 3 };

// Records the faulty seed with the smallest index, so messages do not depend
// on thread timing; index and kind are packed into one atomic word.
class FaultLog {
 public:
  void report(Fault fault, int64_t index) {
    const int64_t key = index * 4 + static_cast<int64_t>(fault);
    int64_t seen = key_.load(std::memory_order_relaxed);
    while (key < seen && !key_.compare_exchange_weak(seen, key)) {
    }
  }
  bool any() const { return key_.load() != kNone; }
  int64_t index() const { return key_.load() / 4; }
  Fault kind() const { return static_cast<Fault>(key_.load() % 4); }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::atomic<int64_t> key_{kNone};
};

constexpr int64_t kFloydMaxFanout = 64;
constexpr int64_t kGrain = 256;
constexpr int64_t kAhead = 8;

// Number of picks for a seed with `available` candidate edges.
int64_t pick_count(int64_t available, int64_t fanout, bool replace) {
  if (fanout < 0) return available;
  if (replace) return available > 0 ? fanout : 0;
  return std::min(fanout, available);
}

void pick_uniform(int64_t begin, int64_t degree, int64_t count, bool replace, SeedStream& rng,
                  std::vector<int64_t>& scratch, int64_t* out) {
  if (count == degree && !replace) {
    for (int64_t k = 0; k < count; ++k) out[k] = begin + k;
  } else if (replace) {
    for (int64_t k = 0; k < count; ++k) out[k] = begin + static_cast<int64_t>(rng.below(degree));
  } else if (count <= kFloydMaxFanout) {
    // Floyd: for j in [degree - count, degree) add a uniform t <= j, or j
    // itself if t is taken; the result is a uniform count-subset.
    int64_t picked = 0;
    for (int64_t j = degree - count; j < degree; ++j) {
      const int64_t t = static_cast<int64_t>(rng.below(j + 1));
      const bool taken = std::find(out, out + picked, begin + t) != out + picked;
      out[picked++] = begin + (taken ? j : t);
    }
  } else {
    scratch.resize(degree);
    std::iota(scratch.begin(), scratch.end(), begin);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t t = k + static_cast<int64_t>(rng.below(degree - k));
      std::swap(scratch[k], scratch[t]);
      out[k] = scratch[k];
    }
  }
}

void pick_weighted(int64_t begin, int64_t degree, int64_t count, int64_t nonzero, bool replace, bool take_all,
                   const float* prob, SeedStream& rng, std::vector<double>& cumulative,
                   std::vector<std::pair<double, int64_t>>& keys, int64_t* out) {
  const float* w = prob + begin;
  if (take_all || (!replace && count == nonzero)) {
    int64_t k = 0;
    for (int64_t j = 0; j < degree; ++j)
      if (w[j] > 0) out[k++] = begin + j;
  } else if (replace) {
    cumulative.resize(degree);
    double total = 0;
    int64_t last_nonzero = 0;
    for (int64_t j = 0; j < degree; ++j) {
      total += w[j];
      cumulative[j] = total;
      if (w[j] > 0) last_nonzero = j;
    }
    // upper_bound lands on the first edge whose cumulative weight exceeds x,
    // which always has a non-zero weight; rounding may push x to the total.
    for (int64_t k = 0; k < count; ++k) {
      const double x = rng.uniform() * total;
      int64_t j = std::upper_bound(cumulative.begin(), cumulative.end(), x) - cumulative.begin();
      out[k] = begin + std::min(j, last_nonzero);
    }
  } else {
    // The `count` smallest of Exp(w_j) keys are a weighted sample without
    // replacement (successive sampling proportional to weight).
    keys.clear();
    for (int64_t j = 0; j < degree; ++j)
      if (w[j] > 0) keys.emplace_back(-std::log(rng.uniform_open_zero()) / w[j], begin + j);
    std::nth_element(keys.begin(), keys.begin() + (count - 1), keys.end());
    for (int64_t k = 0; k < count; ++k) out[k] = keys[k].second;
  }
}

[[noreturn]] void raise_fault(const FaultLog& faults, const CscView& graph, const int64_t* seeds) {
  const int64_t i = faults.index();
  const int64_t seed = seeds[i];
  switch (faults.kind()) {
    case Fault::kSeed:
      throw std::invalid_argument("seeds[" + std::to_string(i) + "] = " + std::to_string(seed) +
                                  " is not a node id; expected 0 <= seed < " + std::to_string(graph.num_nodes));
    case Fault::kIndptr:
      throw std::invalid_argument("indptr is corrupt at node " + std::to_string(seed) + ": indptr[" +
                                  std::to_string(seed) + "] = " + std::to_string(graph.indptr[seed]) +
                                  ", indptr[" + std::to_string(seed + 1) + "] = " +
                                  std::to_string(graph.indptr[seed + 1]) +
                                  "; expected 0 <= indptr[v] <= indptr[v+1] <= num_edges = " +
                                  std::to_string(graph.num_edges));
    default:
      throw std::invalid_argument("prob has a negative or non-finite weight among the in-edges of node " +
                                  std::to_string(seed) + " (seeds[" + std::to_string(i) +
                                  "]); weights must be finite and >= 0");
  }
}

}  // namespace

SampleOutput sample_neighbors(const CscView& graph, const int64_t* seeds, int64_t num_seeds, int64_t fanout,
                              const int64_t* fanouts, bool replace, const float* prob, uint64_t rng_seed,
                              int num_threads, bool gather_neighbors, int64_t* counts) {
  if (fanouts == nullptr && fanout < -1)
    throw std::invalid_argument("fanout must be -1 (all) or >= 0, got " + std::to_string(fanout));
  for (int64_t i = 0; fanouts != nullptr && i < num_seeds; ++i)
    if (fanouts[i] < -1)
      throw std::invalid_argument("fanouts[" + std::to_string(i) + "] must be -1 (all) or >= 0, got " +
                                  std::to_string(fanouts[i]));
  const int threads = num_threads;
  FaultLog faults;

  // Pass 1: validate each seed's range and count its picks. Graph reads are
  // random and latency-bound, so the rows of seed i + kAhead are prefetched.
  OutputVector<int64_t> begins(num_seeds), degrees(num_seeds), nonzeros(prob != nullptr ? num_seeds : 0);
  parallel_for(num_seeds, threads, kGrain, [&] {
    return [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        if (i + 2 * kAhead < last) {
          const int64_t ahead = seeds[i + 2 * kAhead];
          if (ahead >= 0 && ahead < graph.num_nodes) __builtin_prefetch(graph.indptr + ahead);
        }
        if (prob != nullptr && i + kAhead < last) {
          const int64_t ahead = seeds[i + kAhead];
          if (ahead >= 0 && ahead < graph.num_nodes) {
            const int64_t at = graph.indptr[ahead];
            if (at >= 0 && at < graph.num_edges) __builtin_prefetch(prob + at);
          }
        }
        counts[i] = begins[i] = degrees[i] = 0;
        const int64_t seed = seeds[i];
        if (seed < 0 || seed >= graph.num_nodes) {
          faults.report(Fault::kSeed, i);
          continue;
        }
        const int64_t begin = graph.indptr[seed], end = graph.indptr[seed + 1];
        if (begin < 0 || begin > end || end > graph.num_edges) {
          faults.report(Fault::kIndptr, i);
          continue;
        }
        begins[i] = begin;
        degrees[i] = end - begin;
        int64_t available = end - begin;
        if (prob != nullptr) {
          available = 0;
          for (int64_t j = begin; j < end; ++j) {
            const float w = prob[j];
            if (!(w >= 0) || !std::isfinite(w)) {
              faults.report(Fault::kProb, i);
              break;
            }
            available += w > 0;
          }
          nonzeros[i] = available;
        }
        counts[i] = pick_count(available, fanouts != nullptr ? fanouts[i] : fanout, replace);
      }
    };
  });
  if (faults.any()) raise_fault(faults, graph, seeds);

  std::vector<int64_t> offsets(num_seeds + 1, 0);
  for (int64_t i = 0; i < num_seeds; ++i) offsets[i + 1] = offsets[i] + counts[i];
  SampleOutput output;
  output.positions.resize(offsets[num_seeds]);
  if (gather_neighbors) output.neighbors.resize(offsets[num_seeds]);

  // Pass 2: fill each seed's slice of `positions` from its own stream.
  parallel_for(num_seeds, threads, kGrain, [&] {
    return [&, scratch = std::vector<int64_t>(), cumulative = std::vector<double>(),
            keys = std::vector<std::pair<double, int64_t>>()](int64_t first, int64_t last) mutable {
      for (int64_t i = first; i < last; ++i) {
        if (prob != nullptr && i + kAhead < last) __builtin_prefetch(prob + begins[i + kAhead]);
        const int64_t count = counts[i];
        if (count == 0) continue;
        const int64_t begin = begins[i], degree = degrees[i];
        const int64_t seed_fanout = fanouts != nullptr ? fanouts[i] : fanout;
        SeedStream rng(rng_seed, static_cast<uint64_t>(i));
        int64_t* out = output.positions.data() + offsets[i];
        if (prob == nullptr) {
          pick_uniform(begin, degree, count, replace && seed_fanout >= 0, rng, scratch, out);
        } else {
          pick_weighted(begin, degree, count, nonzeros[i], replace, seed_fanout < 0, prob, rng, cumulative, keys,
                        out);
        }
      }
      // A tight loop of independent loads keeps many cache misses in flight;
      // interleaved with the picks above, they would be served one by one.
      if (gather_neighbors) {
        const int64_t* positions = output.positions.data();
        int64_t* neighbors = output.neighbors.data();
        if (graph.indices32 != nullptr) {
          for (int64_t k = offsets[first]; k < offsets[last]; ++k) neighbors[k] = graph.indices32[positions[k]];
        } else {
          for (int64_t k = offsets[first]; k < offsets[last]; ++k) neighbors[k] = graph.indices64[positions[k]];
        }
      }
    };
  });
  return output;
}

template <typename T>
void take(const T* values, int64_t num_values, const int64_t* positions, int64_t n, int num_threads, int64_t* out) {
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  parallel_for(n, num_threads, 1 << 14, [&] {
    return [&](int64_t first, int64_t last) {
      for (int64_t k = first; k < last; ++k) {
        if (k + 16 < last) {
          const int64_t ahead = positions[k + 16];
          if (ahead >= 0 && ahead < num_values) __builtin_prefetch(values + ahead);
        }
        const int64_t position = positions[k];
        if (position < 0 || position >= num_values) {
          int64_t seen = first_bad.load();
          while (k < seen && !first_bad.compare_exchange_weak(seen, k)) {
          }
          out[k] = 0;
          continue;
        }
        out[k] = values[position];
      }
    };
  });
  const int64_t bad = first_bad.load();
  if (bad != std::numeric_limits<int64_t>::max())
    throw std::invalid_argument("positions[" + std::to_string(bad) + "] = " + std::to_string(positions[bad]) +
                                " is out of range; expected 0 <= position < " + std::to_string(num_values));
}

template void take<int32_t>(const int32_t*, int64_t, const int64_t*, int64_t, int, int64_t*);
template void take<int64_t>(const int64_t*, int64_t, const int64_t*, int64_t, int, int64_t*);

}  // namespace distgnn

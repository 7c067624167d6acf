// Temporal neighbour sampling: see temporal.h. One binary search per root,
// roots in parallel on the thread pool; uniform picks use Floyd's algorithm
// on a stream keyed by root index, so results do not depend on threads.
#include "temporal.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
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

namespace {

constexpr int64_t kRootGrain = 64;

void check_rows(const int64_t* nbr, const uint8_t* mask, int64_t slots, int64_t num_kv, const int64_t* event_index,
                int64_t num_event_rows) {
  std::vector<uint8_t> taken(static_cast<size_t>(num_event_rows), 0);
  for (int64_t i = 0; i < slots; ++i) {
    if (!mask[i]) continue;
    if (nbr[i] < 0 || nbr[i] >= num_kv)
      throw std::invalid_argument("neighbour row " + std::to_string(nbr[i]) + " at slot " + std::to_string(i) +
                                  " is outside the " + std::to_string(num_kv) + " key/value rows");
    const int64_t e = event_index[i];
    if (e < 0 || e >= num_event_rows || taken[e])
      throw std::invalid_argument("event row " + std::to_string(e) + " at slot " + std::to_string(i) +
                                  (e < 0 || e >= num_event_rows ? " is outside the " + std::to_string(num_event_rows) +
                                                                      " event rows"
                                                                : " serves an earlier slot too"));
    taken[e] = 1;
  }
}

}  // namespace

void temporal_attention(const float* query, const float* kv, int64_t num_kv, const int64_t* nbr, const float* event,
                        const int64_t* event_index, int64_t num_event_rows, const uint8_t* mask, int64_t num_roots, int64_t k, int64_t heads, int64_t head_dim,
                        float scale, float* out, float* weight, int num_threads) {
  check_rows(nbr, mask, num_roots * k, num_kv, event_index, num_event_rows);
  const int64_t width = heads * head_dim;
  parallel_for(num_roots, num_threads, kRootGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* o = out + r * width;
        float* w = weight + r * k * heads;
        std::fill(o, o + width, 0.0f);
        std::fill(w, w + k * heads, 0.0f);
        const float* q = query + r * width;
        for (int64_t h = 0; h < heads; ++h) {
          float top = -INFINITY;
          for (int64_t j = 0; j < k; ++j) {
            if (!mask[r * k + j]) continue;
            const float* key = kv + nbr[r * k + j] * 2 * width + h * head_dim;
            const float* ev = event + event_index[r * k + j] * width + h * head_dim;
            float dot = 0.0f;
            for (int64_t c = 0; c < head_dim; ++c) dot += q[h * head_dim + c] * (key[c] + ev[c]);
            w[j * heads + h] = dot * scale;
            top = std::max(top, dot * scale);
          }
          if (top == -INFINITY) continue;  // no filled slot: weights and output stay 0
          float total = 0.0f;
          for (int64_t j = 0; j < k; ++j) {
            if (!mask[r * k + j]) continue;
            const float e = std::exp(w[j * heads + h] - top);
            w[j * heads + h] = e;
            total += e;
          }
          float* oh = o + h * head_dim;
          for (int64_t j = 0; j < k; ++j) {
            if (!mask[r * k + j]) continue;
            const float a = w[j * heads + h] / total;
            w[j * heads + h] = a;
            const float* value = kv + nbr[r * k + j] * 2 * width + width + h * head_dim;
            const float* ev = event + event_index[r * k + j] * width + h * head_dim;
            for (int64_t c = 0; c < head_dim; ++c) oh[c] += a * (value[c] + ev[c]);
          }
        }
      }
    };
  });
}

void temporal_attention_backward(const float* query, const float* kv, int64_t num_kv, const int64_t* nbr,
                                 const float* event, const int64_t* event_index, int64_t num_event_rows,
                                 const uint8_t* mask, const float* weight, const float* grad_out,
                                 int64_t num_roots, int64_t k, int64_t heads, int64_t head_dim, float scale,
                                 float* grad_query, float* grad_kv, float* grad_event, int num_threads) {
  check_rows(nbr, mask, num_roots * k, num_kv, event_index, num_event_rows);
  const int64_t width = heads * head_dim;
  std::fill(grad_kv, grad_kv + num_kv * 2 * width, 0.0f);
  std::fill(grad_event, grad_event + num_event_rows * width, 0.0f);  // rows no filled slot reads stay 0
  // One thread adds each slot's key and value gradients into grad_kv as it goes. Several threads would race on
  // repeated rows: they keep the key gradients in grad_key, and one serial pass adds them (with the values',
  // weight * grad_out) afterwards.
  const bool inline_scatter = num_threads <= 1 || num_roots <= kRootGrain;
  std::vector<float> grad_key(inline_scatter ? 0 : static_cast<size_t>(num_roots * k * width));
  parallel_for(num_roots, inline_scatter ? 1 : num_threads, kRootGrain, [&] {
    std::vector<float> gw(static_cast<size_t>(k));
    return [&, gw](int64_t begin, int64_t end) mutable {
      for (int64_t r = begin; r < end; ++r) {
        const float* q = query + r * width;
        const float* go = grad_out + r * width;
        float* gq = grad_query + r * width;
        std::fill(gq, gq + width, 0.0f);
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t hd = h * head_dim;
          float weighted = 0.0f;  // sum_j weight * d(loss)/d(weight)
          for (int64_t j = 0; j < k; ++j) {
            gw[j] = 0.0f;
            if (!mask[r * k + j]) continue;
            const float* value = kv + nbr[r * k + j] * 2 * width + width + hd;
            const float* ev = event + event_index[r * k + j] * width + hd;
            float dot = 0.0f;
            for (int64_t c = 0; c < head_dim; ++c) dot += go[hd + c] * (value[c] + ev[c]);
            gw[j] = dot;
            weighted += weight[(r * k + j) * heads + h] * dot;
          }
          for (int64_t j = 0; j < k; ++j) {
            const int64_t slot = r * k + j;
            if (!mask[slot]) continue;
            const float a = weight[slot * heads + h];
            const float gs = a * (gw[j] - weighted) * scale;  // softmax backward, then the score's scale
            const float* key = kv + nbr[slot] * 2 * width + hd;
            const float* ev = event + event_index[slot] * width + hd;
            float* ge = grad_event + event_index[slot] * width + hd;
            float* gk = inline_scatter ? grad_kv + nbr[slot] * 2 * width + hd : grad_key.data() + slot * width + hd;
            float* gv = grad_kv + nbr[slot] * 2 * width + width + hd;
            for (int64_t c = 0; c < head_dim; ++c) {
              gq[hd + c] += gs * (key[c] + ev[c]);
              const float key_grad = gs * q[hd + c], value_grad = a * go[hd + c];
              ge[c] = key_grad + value_grad;  // the event joins key and value
              if (inline_scatter) {
                gk[c] += key_grad;
                gv[c] += value_grad;
              } else {
                gk[c] = key_grad;
              }
            }
          }
        }
      }
    };
  });
  if (inline_scatter) return;
  for (int64_t r = 0; r < num_roots; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = r * k + j;
      if (!mask[slot]) continue;
      float* row = grad_kv + nbr[slot] * 2 * width;
      const float* gk = grad_key.data() + slot * width;
      for (int64_t c = 0; c < width; ++c) row[c] += gk[c];
      for (int64_t h = 0; h < heads; ++h) {
        const float a = weight[slot * heads + h];
        const float* go = grad_out + r * width + h * head_dim;
        float* value = row + width + h * head_dim;
        for (int64_t c = 0; c < head_dim; ++c) value[c] += a * go[c];
      }
    }
  }
}

}  // namespace distgnn


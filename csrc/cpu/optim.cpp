// Sparse optimiser kernels: the servers' row-wise Adam step. See optim.h for the exact semantics.
//
// Why not numpy: the server's adam_step gathered the touched rows' state, made a handful of (n, dim)
// temporaries, scattered the state back and then the weights (a gather, the update and a scatter
// again), all on the cores the trainers use; here each row is read and written once.
#include "optim.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.h"

namespace distgnn {
namespace {
constexpr int64_t kRowGrain = 256;  // rows per claimed chunk

// One row's update; restrict lets the compiler vectorise it (the rows of m, v, w and g never overlap).
void update_row(float* __restrict m, float* __restrict v, float* __restrict w, const float* __restrict g,
                int64_t dim, float keep1, float keep2, float lr, float correct1, float correct2, float eps) {
  for (int64_t j = 0; j < dim; ++j) {
    m[j] += keep1 * (g[j] - m[j]);
    v[j] += keep2 * (g[j] * g[j] - v[j]);
    w[j] -= lr * (m[j] / correct1) / (std::sqrt(v[j] / correct2) + eps);
  }
}
}  // namespace

void sparse_adam(float* weight, float* state, int64_t num_rows, int64_t dim, const int64_t* ids, int64_t n,
                 const float* grad, float lr, double beta1, double beta2, float eps, int num_threads) {
  std::vector<uint8_t> seen(static_cast<size_t>(num_rows), 0);  // a row updated twice would race
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= num_rows)
      throw std::out_of_range("sparse_adam: ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                              " is outside the table's rows [0, " + std::to_string(num_rows) + ")");
    if (seen[ids[i]]++)
      throw std::invalid_argument("sparse_adam: row " + std::to_string(ids[i]) +
                                  " appears twice in ids; ids must be unique (sum the gradients of repeated ids first)");
  }
  const int64_t stride = 2 * dim + 1;
  // 1 - beta and the bias corrections in double, then rounded once: 1 - float(0.999) is off by 1e-5 relative.
  const float keep1 = static_cast<float>(1.0 - beta1), keep2 = static_cast<float>(1.0 - beta2);
  parallel_for(n, num_threads, kRowGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = ids[i];
        float* m = state + r * stride;
        float* v = m + dim;
        float& t = v[dim];
        t += 1.0f;
        const float correct1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(t)));
        const float correct2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(t)));
        update_row(m, v, weight + r * dim, grad + i * dim, dim, keep1, keep2, lr, correct1, correct2, eps);
      }
    };
  });
}

}  // namespace distgnn

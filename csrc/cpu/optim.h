// Sparse optimiser kernels (float32, row-major): the servers' Adam step on the touched rows of an
// embedding table. distgnn/server/optim.py holds the plain numpy version it is tested against.
#pragma once

#include <cstdint>

namespace distgnn {

// Adam on rows ids[0..n) of weight (num_rows, dim), in place, with the moments and a per-row step count
// in state (num_rows, 2 * dim + 1) laid out [m | v | t]: for each i, with r = ids[i] and g = grad[i, :],
//   t[r] += 1;  m[r] += (1 - beta1) (g - m[r]);  v[r] += (1 - beta2) (g*g - v[r]);
//   weight[r] -= lr * (m[r] / (1 - beta1^t)) / (sqrt(v[r] / (1 - beta2^t)) + eps).
// 1 - beta1, 1 - beta2 and the bias corrections are computed in double and rounded to float once. One pass per row (the numpy version gathers, computes in temporaries and scatters back twice). ids
// may come in any order but must be unique (threads split the rows): before anything is written it throws
// std::out_of_range naming the first id outside [0, num_rows), std::invalid_argument naming a repeated one.
void sparse_adam(float* weight, float* state, int64_t num_rows, int64_t dim, const int64_t* ids, int64_t n,
                 const float* grad, float lr, double beta1, double beta2, float eps, int num_threads);

}  // namespace distgnn

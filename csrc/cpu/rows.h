// Row gather on the CPU: out[i] = table[positions[i]] for rows of any width, in parallel.
#pragma once

#include <cstdint>

namespace distgnn {

// Copies row positions[i] of `table` (num_rows rows of row_bytes bytes each, contiguous) to row i of `out`
// (n rows), on up to num_threads threads of the pool. The rows of a later item are prefetched while the
// current one is copied, so the random reads of a large table overlap. Throws std::out_of_range (naming the
// position) when a position is outside [0, num_rows); rows before it may already be written.
void gather_rows(const uint8_t* table, int64_t num_rows, int64_t row_bytes, const int64_t* positions, int64_t n,
                 uint8_t* out, int num_threads);

}  // namespace distgnn

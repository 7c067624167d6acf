// Row copies between 2-D row-major tables: dst[dst_rows[k]] = src[src_rows[k]],
// any element type (rows are copied as bytes), multi-threaded.
//
// The reads of a DistTensor place local rows and each server's reply at their
// positions in the output; numpy's `out[pos] = table[ids]` does that in two
// passes (a gather into a temporary, then a scatter), this in one.
#pragma once

#include <cstdint>

namespace distgnn {

// src_rows / dst_rows may be null (row k). Every row number is checked
// against num_src_rows / num_dst_rows before anything is written; throws
// std::invalid_argument naming the first bad one.
void copy_rows(const char* src, int64_t num_src_rows, const int64_t* src_rows, char* dst, int64_t num_dst_rows,
               const int64_t* dst_rows, int64_t n, int64_t row_bytes, int num_threads);

}  // namespace distgnn

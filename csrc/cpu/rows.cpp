#include "rows.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "parallel.h"
#include "simd.h"

namespace distgnn {

namespace {

void check_rows(const int64_t* rows, int64_t n, int64_t limit, const char* name) {
  if (rows == nullptr) return;
  for (int64_t k = 0; k < n; ++k)
    if (rows[k] < 0 || rows[k] >= limit)
      throw std::invalid_argument(std::string(name) + "[" + std::to_string(k) + "] = " + std::to_string(rows[k]) +
                                  " is out of range for " + std::to_string(limit) + " rows");
}

}  // namespace

void copy_rows(const char* src, int64_t num_src_rows, const int64_t* src_rows, char* dst, int64_t num_dst_rows,
               const int64_t* dst_rows, int64_t n, int64_t row_bytes, int num_threads) {
  if (src_rows == nullptr && n > num_src_rows) throw std::invalid_argument("src has fewer rows than copied");
  if (dst_rows == nullptr && n > num_dst_rows) throw std::invalid_argument("dst has fewer rows than copied");
  check_rows(src_rows, n, num_src_rows, "src_rows");
  check_rows(dst_rows, n, num_dst_rows, "dst_rows");
  // ~256 KiB of rows per chunk: enough work to be worth a helper thread.
  const int64_t grain = std::max<int64_t>(64, (int64_t{1} << 18) / std::max<int64_t>(row_bytes, 1));
  parallel_for(n, num_threads, grain, [&] {
    return [&](int64_t first, int64_t last) {
      for (int64_t k = first; k < last; ++k) {
        if (src_rows != nullptr && k + kPrefetchAhead < last)
          prefetch_row(src + src_rows[k + kPrefetchAhead] * row_bytes, row_bytes);
        const int64_t s = src_rows == nullptr ? k : src_rows[k];
        const int64_t d = dst_rows == nullptr ? k : dst_rows[k];
        std::memcpy(dst + d * row_bytes, src + s * row_bytes, static_cast<size_t>(row_bytes));
      }
    };
  });
}

}  // namespace distgnn

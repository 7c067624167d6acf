// Row gather on the CPU (see rows.h). The reference is torch.index_select; tests/test_cache_cpu_gather.py
// compares them on random tables, widths and positions.
#include "rows.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "parallel.h"

namespace distgnn {
namespace {

constexpr int64_t kGrain = 512;    // rows per claimed chunk
constexpr int64_t kAhead = 8;      // rows prefetched ahead of the copy
constexpr int64_t kLine = 64;      // cache line bytes
constexpr int64_t kMaxPrefetch = 1024;  // bytes of a row prefetched (wider rows stream on their own)

}  // namespace

void gather_rows(const uint8_t* table, int64_t num_rows, int64_t row_bytes, const int64_t* positions, int64_t n,
                 uint8_t* out, int num_threads) {
  const int64_t prefetch_bytes = row_bytes < kMaxPrefetch ? row_bytes : kMaxPrefetch;
  parallel_for(n, num_threads, kGrain, [&] {
    return [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t ahead = i + kAhead;
        if (ahead < end) {
          const int64_t q = positions[ahead];
          if (q >= 0 && q < num_rows) {
            const uint8_t* row = table + q * row_bytes;
            for (int64_t b = 0; b < prefetch_bytes; b += kLine) __builtin_prefetch(row + b, 0, 0);
          }
        }
        const int64_t p = positions[i];
        if (p < 0 || p >= num_rows) {
          throw std::out_of_range("row position " + std::to_string(p) + " at index " + std::to_string(i) +
                                  " is outside the table's " + std::to_string(num_rows) + " rows");
        }
        std::memcpy(out + i * row_bytes, table + p * row_bytes, static_cast<size_t>(row_bytes));
      }
    };
  });
}

}  // namespace distgnn

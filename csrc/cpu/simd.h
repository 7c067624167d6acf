// Compiling hot row loops for the CPU they run on, and prefetching the random rows they read.
//
// The extension is built with the compiler's baseline target (SSE2 on x86-64), so one build runs on every
// x86-64 CPU. A loop over a feature row then adds 4 floats per instruction, and a 64-bit hash has no vector
// multiply at all. DISTGNN_CPU_CLONES compiles a function also for AVX2 and AVX-512; the dynamic loader
// picks the best one this CPU supports when the extension is loaded (GCC/clang function multiversioning,
// an ifunc). Mark leaf functions that hold the loop itself: a lambda inside a cloned function is not cloned.
//
// Gathers of sampled rows read rows in random order. The hardware prefetcher follows strides, not index
// lists, so each row's cache lines arrive one miss at a time; prefetch_row asks for a row's lines (up to
// kPrefetchLines) a few rows ahead so that their misses overlap.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DISTGNN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DISTGNN_CPU_CLONES
#define DISTGNN_CPU_CLONES
#endif

namespace distgnn {

constexpr int64_t kPrefetchAhead = 8;    // rows between a prefetch and the row's use
constexpr int64_t kPrefetchLines = 16;   // cache lines of one row asked for (1 KiB); further lines stream

// Asks for the first lines of `bytes` bytes at `row` (write: the row is about to be written).
inline void prefetch_row(const void* row, int64_t bytes, bool write = false) {
  const char* p = static_cast<const char*>(row);
  const int64_t lines = bytes >= kPrefetchLines * 64 ? kPrefetchLines : (bytes + 63) / 64;
  if (write) {
    for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + 64 * l, 1);
  } else {
    for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + 64 * l, 0);
  }
}

}  // namespace distgnn

// A parallel loop over [0, n) in dynamically claimed chunks.
//
// OpenMP does the threading, except in a process forked from one whose
// OpenMP thread pool was already started: GNU libgomp keeps the parent's pool
// bookkeeping and hangs in the child's next parallel region, so there the
// loop runs on freshly started std::threads instead (dataloader workers are
// forked). Chunks are claimed from an atomic counter on both paths; callers
// must not let results depend on which thread ran a chunk.
#pragma once

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace distgnn {

namespace detail {

inline std::atomic<bool>& openmp_started() {
  static std::atomic<bool> started{false};
  return started;
}

inline std::atomic<bool>& forked_after_openmp() {
  static std::atomic<bool> forked{false};
  return forked;
}

inline void note_fork_in_child() {
  if (openmp_started().load()) forked_after_openmp().store(true);
}

inline void register_fork_handler() {
  static const bool registered = (pthread_atfork(nullptr, nullptr, note_fork_in_child), true);
  (void)registered;
}

}  // namespace detail

// requested > 0: exactly that many threads. Otherwise the OpenMP default,
// with dynamic teams: libgomp then shrinks a team when the machine's load
// average shows the cores are busy (servers, trainers and sampler processes
// often share them), instead of waiting on descheduled threads.
inline int resolve_num_threads(int requested) {
  omp_set_dynamic(requested > 0 ? 0 : 1);
  return requested > 0 ? requested : omp_get_max_threads();
}

// make_worker() is called once per thread and returns a callable
// worker(begin, end) that may keep per-thread scratch space.
template <typename MakeWorker>
void parallel_for(int64_t n, int threads, int64_t grain, const MakeWorker& make_worker) {
  if (threads <= 1 || n <= grain) {
    auto worker = make_worker();
    if (n > 0) worker(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  const auto run = [&] {
    auto worker = make_worker();
    for (int64_t begin; (begin = next.fetch_add(grain)) < n;) worker(begin, std::min(n, begin + grain));
  };
  detail::register_fork_handler();
  if (!detail::forked_after_openmp().load()) {
    detail::openmp_started().store(true);
#pragma omp parallel num_threads(threads)
    run();
  } else {
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(run);
    run();
    for (auto& helper : helpers) helper.join();
  }
}

}  // namespace distgnn

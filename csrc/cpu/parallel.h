// Parallel loops over [0, n) on a small persistent thread pool.
//
// Why not OpenMP: on a machine whose cores are shared with other busy
// processes (graph servers, trainers and sampler workers often share a few
// cores), an OpenMP region ends in a barrier that waits until every team
// thread has been scheduled, found nothing left to do and arrived; a helper
// stuck in the run queue for a scheduler slice makes a 1 ms region take
// 5 ms (measured 6x slower than one thread at load 4.7 on 2 cores). GNU
// libgomp also hangs in a forked child whose parent had started its pool.
// Here the calling thread claims chunks from an atomic counter together with
// any helper that joins; it waits only for helpers that actually joined, so a
// late helper costs nothing. Results must not depend on which thread ran a
// chunk (callers key their random streams by item, not by thread).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace distgnn {

namespace detail {
// Runs body on the calling thread and on up to `helpers` pool threads; body
// claims work itself. Rethrows the first exception any participant threw.
void run_on_pool(int helpers, const std::function<void()>& body);
}  // namespace detail

// make_worker() is called once per participating thread and returns a
// callable worker(begin, end) that may keep per-thread scratch space.
template <typename MakeWorker>
void parallel_for(int64_t n, int threads, int64_t grain, const MakeWorker& make_worker) {
  if (threads <= 1 || n <= grain) {
    auto worker = make_worker();
    if (n > 0) worker(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  const int64_t chunks = (n + grain - 1) / grain;
  const int helpers = static_cast<int>(std::min<int64_t>(threads, chunks)) - 1;
  detail::run_on_pool(helpers, [&] {
    auto worker = make_worker();
    for (int64_t begin; (begin = next.fetch_add(grain)) < n;) worker(begin, std::min(n, begin + grain));
  });
}

}  // namespace distgnn

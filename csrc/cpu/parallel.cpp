// The thread pool behind parallel_for (see parallel.h for why it exists).
//
// One job runs at a time; a caller that finds the pool busy (another Python
// thread sampling with the GIL released) runs its loop alone instead of
// queueing. After fork() the child gets a fresh, empty pool: the parent's
// threads do not exist there, and its locks may have been held mid-job.
#include "parallel.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace distgnn {
namespace detail {
namespace {

struct Job {
  Job(const std::function<void()>& work, int helpers) : body(&work), max_helpers(helpers) {}

  const std::function<void()>* body;
  int max_helpers;
  int joined = 0;
  int finished = 0;
  bool closed = false;  // set by the caller once its own share is done: no more joiners
  std::exception_ptr error;
};

class ThreadPool {
 public:
  void run(int helpers, const std::function<void()>& body) {
    std::unique_lock<std::mutex> exclusive(run_mutex_, std::try_to_lock);
    if (!exclusive.owns_lock() || helpers <= 0) {
      body();
      return;
    }
    Job job(body, helpers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < helpers) workers_.emplace_back([this] { work(); });
      current_ = &job;
      ++job_id_;
    }
    wake_.notify_all();
    participate(job);
    std::unique_lock<std::mutex> lock(mutex_);
    job.closed = true;
    done_.wait(lock, [&] { return job.finished == job.joined; });
    current_ = nullptr;
    lock.unlock();
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void participate(Job& job) {
    try {
      (*job.body)();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!job.error) job.error = std::current_exception();
    }
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return current_ != nullptr && job_id_ != seen; });
      seen = job_id_;
      Job& job = *current_;
      if (job.closed || job.joined >= job.max_helpers) continue;
      ++job.joined;
      lock.unlock();
      participate(job);
      lock.lock();
      ++job.finished;
      if (job.closed && job.finished == job.joined) done_.notify_all();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  Job* current_ = nullptr;
  uint64_t job_id_ = 0;
};

// Never destroyed: its threads block forever and die with the process; a
// destructor would have to join them during interpreter shutdown.
ThreadPool* pool = nullptr;
std::once_flag pool_once;

void replace_pool_in_child() { pool = new ThreadPool(); }  // the parent's pool is abandoned, not destroyed

ThreadPool& the_pool() {
  std::call_once(pool_once, [] {
    pool = new ThreadPool();
    pthread_atfork(nullptr, nullptr, replace_pool_in_child);
  });
  return *pool;
}

}  // namespace

void run_on_pool(int helpers, const std::function<void()>& body) { the_pool().run(helpers, body); }

}  // namespace detail
}  // namespace distgnn

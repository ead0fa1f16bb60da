#include "server/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "server/util/thread_name.h"

namespace gpucompute::cpu {

namespace {

// The stop flag of the innermost ThreadPool::StopScope on this thread; null: none.
thread_local const std::atomic<bool>* current_stop = nullptr;

bool Stopped(const std::atomic<bool>* stop) {
  return stop != nullptr && stop->load(std::memory_order_relaxed);
}

struct Job {
  int64_t n;
  int64_t grain;
  int64_t chunks;
  const std::function<void(int64_t, int64_t)>* body;
  const std::atomic<bool>* stop = nullptr;  // the caller's StopScope's
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
  std::mutex mu;
  std::condition_variable cv;

  // Runs chunks until none are left. Returns true if this call finished the last one.
  bool Work() {
    bool finished_last = false;
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) break;
      const int64_t begin = c * grain;
      // A stopped job's chunks are claimed and counted as done without running.
      if (!Stopped(stop)) (*body)(begin, std::min(n, begin + grain));
      if (finished.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) finished_last = true;
    }
    return finished_last;
  }
};

}  // namespace

struct ThreadPool::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> jobs;  // jobs that may still have unclaimed chunks
  bool stop = false;
  std::vector<std::thread> workers;

  void WorkerLoop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (stop) return;
        job = jobs.front();
        // A job whose chunks are all claimed leaves the queue; its owner waits for it.
        if (job->next.load(std::memory_order_relaxed) >= job->chunks) {
          jobs.pop_front();
          continue;
        }
      }
      if (job->Work()) {
        std::lock_guard lock(job->mu);
        job->cv.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(size_t threads) : impl_(std::make_unique<Impl>()) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) {
    impl_->workers.emplace_back([this] {
      NameThisThread("cpu-pool");
      impl_->WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

ThreadPool::StopScope::StopScope(const std::atomic<bool>* stop) : outer_(current_stop) {
  current_stop = stop;
}

ThreadPool::StopScope::~StopScope() { current_stop = outer_; }

size_t ThreadPool::size() const { return impl_->workers.size() + 1; }

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || impl_->workers.empty()) {
    for (int64_t b = 0; b < n && !Stopped(current_stop); b += grain) {
      body(b, std::min(n, b + grain));
    }
    return;
  }
  auto job = std::make_shared<Job>();
  job->n = n;
  job->grain = grain;
  job->chunks = chunks;
  job->body = &body;
  job->stop = current_stop;
  {
    std::lock_guard lock(impl_->mu);
    impl_->jobs.push_back(job);
  }
  impl_->cv.notify_all();
  job->Work();
  std::unique_lock lock(job->mu);
  job->cv.wait(lock, [&] { return job->finished.load(std::memory_order_acquire) == chunks; });
}

}  // namespace gpucompute::cpu

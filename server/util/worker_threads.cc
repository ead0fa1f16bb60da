#include "server/util/worker_threads.h"

#include <utility>

#include "server/util/thread_name.h"

namespace gpucompute {

WorkerThreads::WorkerThreads(size_t threads, std::string name) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name] {
      NameThisThread(name.c_str());
      Loop();
    });
  }
}

WorkerThreads::~WorkerThreads() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerThreads::Run(absl::AnyInvocable<void() &&> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

bool WorkerThreads::Ready() const { return stopping_ || !jobs_.empty(); }

void WorkerThreads::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WorkerThreads::Ready));
      if (jobs_.empty()) return;  // stopping, and nothing is left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::move(job)();
  }
}

}  // namespace gpucompute

// A few threads that run queued jobs in order of arrival: work taken off gRPC's threads,
// so that they go back to the socket (e.g. the copy of a received upload chunk into
// staging memory, which on one stream would otherwise take turns with receiving the
// next chunk).
#ifndef GPUCOMPUTE_SERVER_UTIL_WORKER_THREADS_H_
#define GPUCOMPUTE_SERVER_UTIL_WORKER_THREADS_H_

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

class WorkerThreads {
 public:
  // `threads` at least 1; each is named `name` (at most 15 characters are kept).
  WorkerThreads(size_t threads, std::string name);
  // Runs every job already queued, then joins the threads.
  ~WorkerThreads();
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Queues `job`; it runs on one of the threads, never on the caller's.
  void Run(absl::AnyInvocable<void() &&> job);

  size_t size() const { return threads_.size(); }

 private:
  void Loop();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_WORKER_THREADS_H_

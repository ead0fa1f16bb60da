// Whether a backend's devices can still be trusted: OK until the backend hits an error
// after which their state cannot be (a sticky CUDA error such as an illegal address). A
// backend that can fail owns one and answers Backend::health, SetFailureListener and
// ReportFailure from it.
#ifndef GPUCOMPUTE_SERVER_CORE_BACKEND_HEALTH_H_
#define GPUCOMPUTE_SERVER_CORE_BACKEND_HEALTH_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

// Thread-safe.
class BackendHealth {
 public:
  using Listener = std::function<void(const absl::Status&)>;

  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // `listener` runs once, on the thread that reports the failure.
  void SetFailureListener(Listener listener) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
  }
  // Records that the backend is broken; the first report wins.
  void ReportFailure(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    Listener listener;
    {
      absl::MutexLock lock(&mu_);
      if (!status_.ok() || status.ok()) return;
      status_ = status;
      listener = listener_;
    }
    if (listener) listener(status);
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_BACKEND_HEALTH_H_

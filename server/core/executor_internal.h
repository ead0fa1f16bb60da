// The executor's own types, shared by the files that implement it (executor.cc: streams,
// submission and hazards; executor_dispatch.cc: handing work to the device;
// executor_completion.cc: finishing it). Not for use outside the executor.
#ifndef GPUCOMPUTE_SERVER_CORE_EXECUTOR_INTERNAL_H_
#define GPUCOMPUTE_SERVER_CORE_EXECUTOR_INTERNAL_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "server/core/backend.h"
#include "server/core/executor.h"

namespace gpucompute {

// An operation on its way to the device, and what its launch produced.
struct QueuedLaunch {
  std::shared_ptr<Operation> op;
  std::vector<std::shared_ptr<Event>> waits;  // on other streams' work
  absl::Status status;                        // of the launch
  std::shared_ptr<Event> start;
  std::shared_ptr<Event> end;
  size_t recorded_run = 0;  // on the first of a recorded run: the run's length
  double compile_seconds = 0;
  OpResult result;
};

struct StreamState {
  std::string id;
  std::string client;
  int device = 0;
  bool is_default = false;
  std::unique_ptr<Stream> stream;
  // Submitted and not yet dispatched, in submission order.
  std::deque<std::shared_ptr<Operation>> pending;
  // The newest submission. Weak: an operation holds its stream, not the reverse, and
  // an operation no longer retained is long done.
  std::weak_ptr<Operation> last;
  uint64_t unfinished = 0;
  // Launching or dispatched to the backend stream, and not yet complete; at most the
  // backend's DispatchWindow.
  int dispatched = 0;
  // Taken off `pending`, to be launched in this order by the thread that launches
  // this stream's work (launching).
  std::vector<QueuedLaunch> launch_queue;
  bool launching = false;
  // PumpLocked re-entrancy: a pump asked for while one runs is folded into it.
  bool pumping = false;
  bool repump = false;
  Work* blocked_on = nullptr;  // the dependency the head waits for, if any
};

// Holds the executor's mutex; on destruction releases it, then drops the references let
// go meanwhile, tells the observer of the operations completed meanwhile, and runs their
// own callbacks and those queued meanwhile: callers' callbacks never run under the lock,
// and memory is never freed under it.
class ABSL_SCOPED_LOCKABLE Executor::Guard {
 public:
  explicit Guard(Executor& e) ABSL_EXCLUSIVE_LOCK_FUNCTION(e.mu_) : e_(e) { e_.mu_.Lock(); }
  ~Guard() ABSL_UNLOCK_FUNCTION() {
    std::vector<absl::AnyInvocable<void()&&>> run;
    std::vector<std::shared_ptr<Operation>> completed;
    std::vector<std::shared_ptr<const void>> dropped;
    run.swap(e_.deferred_);
    completed.swap(e_.completed_);
    dropped.swap(e_.dropped_);
    // The executor may be gone once the mutex is released; the observer outlives it.
    OperationObserver* const observer = e_.observer_;
    e_.mu_.Unlock();
    // First, so that a caller told of a completion finds the memory of the buffers only
    // that work still held already released.
    dropped.clear();
    // Final statuses, which nothing changes any more.
    if (observer != nullptr) {
      for (const auto& op : completed) observer->OnCompleted(op->status_);
    }
    for (const auto& op : completed) {
      if (op->own_done_ != nullptr) std::move(op->own_done_)(op);
    }
    for (auto& fn : run) std::move(fn)();
  }

 private:
  Executor& e_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_EXECUTOR_INTERNAL_H_

// The CUDA backend's streams and the machinery that completes their work: pooled CUDA
// events, the Event and Stream of the Backend contract over them, recorded graphs, and
// the completion pollers that run callbacks once the work before them is done. Private to
// server/cuda/.
#ifndef GPUCOMPUTE_SERVER_CUDA_DETAIL_STREAMS_H_
#define GPUCOMPUTE_SERVER_CUDA_DETAIL_STREAMS_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/backend.h"
#include "server/cuda/cuda_check.h"

namespace gpucompute::cuda::detail {

class CudaBackend;

// Reuses CUDA events: every operation records two (start and end, and its completion
// waits for the end), every other completion callback one, and creating and destroying
// each would cost driver calls on the submission path. Handing a pending event back is
// safe: a later record replaces what queries see, and a stream that waits on it waits for
// the record made before its wait call.
class EventPool {
 public:
  explicit EventPool(unsigned flags) : flags_(flags) {}
  ~EventPool() {
    absl::MutexLock lock(&mu_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaError_t Acquire(cudaEvent_t* event) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        *event = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    return cudaEventCreateWithFlags(event, flags_);
  }
  void Release(cudaEvent_t event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    free_.push_back(event);
  }

 private:
  const unsigned flags_;
  absl::Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaEvent_t event, int device, EventPool& pool)
      : event_(event), device_(device), pool_(pool) {}
  ~CudaEvent() override { pool_.Release(event_); }
  bool IsComplete() const override {
    const cudaError_t error = cudaEventQuery(event_);
    if (error == cudaErrorNotReady) return false;
    // A failed event counts as complete, so that nothing waits forever on a broken
    // device; the failure itself reaches the backend through the completion callbacks.
    if (error != cudaSuccess && !IsStickyError(error)) cudaGetLastError();
    return true;
  }
  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }

 private:
  cudaEvent_t event_;
  int device_;
  EventPool& pool_;
};

// Runs the callbacks of a set of streams once the work before them is done, polling
// their events from a thread of its own: a CUDA host callback would hop through the
// driver's callback thread first, delaying every operation's completion. The thread spins
// while callbacks are pending and otherwise sleeps until one is added. The backend has a
// few, each serving the streams given to it, so that completions of different streams do
// not queue behind each other.
class CompletionPoller {
 public:
  // A callback waiting for the work before `event` on its stream.
  struct Callback {
    cudaEvent_t event;
    int device;
    absl::AnyInvocable<void(absl::Status) &&> fn;
    // The event's owner when the caller recorded it (OnEvent); null when the event is
    // the backend's own, from the device's sync_events.
    std::shared_ptr<Event> owner;
  };
  // Runs a callback whose event completed, with the event's query result.
  using FinishFn = std::function<void(Callback, cudaError_t)>;

  explicit CompletionPoller(FinishFn finish);
  // Finishes the callbacks still pending, then stops.
  ~CompletionPoller() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  void Add(cudaStream_t stream, Callback callback) ABSL_LOCKS_EXCLUDED(mu_) {
    const auto now = std::chrono::steady_clock::now();
    absl::MutexLock lock(&mu_);
    pending_[stream].push_back(std::move(callback));
    ++pending_count_;
    last_added_ = now;
  }

  // Runs the callbacks whose events completed, on the calling thread, unless another
  // thread is doing so.
  void TrySweep() ABSL_LOCKS_EXCLUDED(sweep_mu_, mu_) {
    if (!sweep_mu_.TryLock()) return;
    SweepLocked();
    sweep_mu_.Unlock();
  }

  // Removes every pending callback, for the caller to fail.
  std::vector<Callback> TakeAll() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Callback> taken;
    absl::MutexLock lock(&mu_);
    for (auto& [stream, queue] : pending_) {
      for (Callback& c : queue) taken.push_back(std::move(c));
    }
    pending_.clear();
    pending_count_ = 0;
    return taken;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void Run() ABSL_LOCKS_EXCLUDED(sweep_mu_, mu_);
  // Takes the callbacks whose events completed and runs them, in order; returns how many.
  // Under sweep_mu_, so that callbacks one sweep takes run before those of the next.
  size_t SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweep_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the poller is still within its spin after `last_progress` or the last addition.
  bool Spinning(Clock::time_point last_progress) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets go of mu_ for one sweep interval without calling CUDA.
  void Pause() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasPendingOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || pending_count_ > 0;
  }

  const FinishFn finish_;
  // Held by the thread sweeping: this poller's, or one in TrySweep.
  absl::Mutex sweep_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  // Per stream, oldest first: an event completes only after its stream's earlier ones.
  absl::flat_hash_map<cudaStream_t, std::deque<Callback>> pending_ ABSL_GUARDED_BY(mu_);
  size_t pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last callback was added: new work restarts the spin (see Run).
  Clock::time_point last_added_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it runs on the members above
};

class CudaStream final : public Stream {
 public:
  CudaStream(CudaBackend& backend, int device, cudaStream_t stream, CompletionPoller& poller)
      : backend_(backend), device_(device), stream_(stream), poller_(poller) {}
  ~CudaStream() override;

  int device() const override { return device_; }
  absl::Status Wait(std::shared_ptr<Event> event) override;
  absl::StatusOr<std::shared_ptr<Event>> Record() override;
  absl::Status OnComplete(absl::AnyInvocable<void(absl::Status) &&> fn) override;
  absl::Status OnEvent(std::shared_ptr<Event> event,
                       absl::AnyInvocable<void(absl::Status) &&> fn) override;
  bool CanCapture() const override { return true; }
  absl::Status BeginCapture() override;
  absl::Status EndCapture() override;
  absl::Status LaunchCaptured() override;
  absl::StatusOr<std::unique_ptr<Recording>> EndRecording() override;
  absl::Status LaunchRecording(const Recording& recording) override;

  cudaStream_t get() const { return stream_; }
  CompletionPoller& poller() const { return poller_; }

 private:
  CudaBackend& backend_;
  const int device_;
  const cudaStream_t stream_;
  CompletionPoller& poller_;
  // Instantiated recordings by their number of nodes. A run of the same operations has
  // the same graph with other pointers, and updating an instance in place costs a
  // fraction of instantiating one. Only the thread launching the stream's work touches it.
  static constexpr size_t kMaxGraphs = 16;
  absl::flat_hash_map<size_t, cudaGraphExec_t> graphs_;
  cudaGraphExec_t ready_ = nullptr;  // what EndCapture readied, one of graphs_

  // Reports a failed call of recording or launching a recording; clears the error unless
  // it is sticky, in which case Check has marked the backend failed.
  absl::Status RecordingError(cudaError_t error, const char* call);
  // Ends the capture: the graph recorded, owned by the caller.
  absl::StatusOr<cudaGraph_t> EndCaptureGraph();
};

// A graph instantiated for good, owned by whoever recorded it (Stream::EndRecording).
class CudaRecording final : public Recording {
 public:
  CudaRecording(int device, cudaGraphExec_t exec) : device_(device), exec_(exec) {}
  // A launch still running frees the graph once it completes.
  ~CudaRecording() override { cudaGraphExecDestroy(exec_); }
  CudaRecording(const CudaRecording&) = delete;
  CudaRecording& operator=(const CudaRecording&) = delete;

  int device() const { return device_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  const int device_;
  const cudaGraphExec_t exec_;
};

inline CudaStream& AsCuda(Stream& stream) { return static_cast<CudaStream&>(stream); }

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_SERVER_CUDA_DETAIL_STREAMS_H_

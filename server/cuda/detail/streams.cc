// Streams and completions of the CUDA backend: the completion pollers' loop, CudaStream's
// calls (events, waits, callbacks, graph capture), and the backend's side of callbacks.
#include "server/cuda/detail/streams.h"

#include <sys/prctl.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/util/status_macros.h"
#include "server/util/thread_name.h"

namespace gpucompute::cuda::detail {
namespace {

// Spin this long after the last completion or the last callback added, work pending or
// not, before backing off to short sleeps (or, with nothing pending, to waiting for an
// addition): a chain of operations completes one after another, and each waits for the
// poll. Counting from additions too keeps a client that submits work taking about this
// long, one at a time, from waiting on a sleep at every completion.
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr auto kSweepInterval = std::chrono::microseconds(4);
constexpr auto kSleep = std::chrono::microseconds(20);

}  // namespace

CompletionPoller::CompletionPoller(FinishFn finish)
    : finish_(std::move(finish)), thread_([this] {
        NameThisThread("cuda-complete");
        Run();
      }) {}

bool CompletionPoller::Spinning(Clock::time_point last_progress) const {
  return Clock::now() - std::max(last_progress, last_added_) < kSpin;
}

void CompletionPoller::Pause() {
  // Between sweeps, wait without calling CUDA: every CUDA call takes the driver's lock,
  // and back-to-back queries would hold up the threads launching work.
  mu_.Unlock();
  const Clock::time_point until = Clock::now() + kSweepInterval;
  while (Clock::now() < until) std::this_thread::yield();
  mu_.Lock();
}

void CompletionPoller::Run() {
  // Sleeps of kSleep, not the default slack's 50 us more.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  Clock::time_point last_progress = Clock::now();
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (pending_count_ == 0 && !stopping_ && Spinning(last_progress)) {
      // Idle, but busy a moment ago: stay awake for the next operation. A client that
      // submits and waits, one operation at a time, would otherwise wait for this
      // thread's wake-up every time.
      Pause();
      continue;
    }
    if (pending_count_ == 0) {
      mu_.Await(absl::Condition(this, &CompletionPoller::HasPendingOrStopping));
      if (pending_count_ == 0) return;  // stopping, and nothing left to finish
      // New work: spin for it rather than sleep, since a sleep overshoots by longer than a
      // short operation takes, and its caller would wait on that.
      last_progress = Clock::now();
    }
    mu_.Unlock();
    size_t finished = 0;
    {
      absl::MutexLock sweeping(&sweep_mu_);
      finished = SweepLocked();
    }
    mu_.Lock();
    if (finished > 0) {
      last_progress = Clock::now();
    } else if (Spinning(last_progress)) {
      Pause();
    } else {
      mu_.Unlock();
      std::this_thread::sleep_for(kSleep);
      mu_.Lock();
    }
  }
}

size_t CompletionPoller::SweepLocked() {
  struct Done {
    Callback callback;
    cudaError_t error;
  };
  std::vector<Done> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      std::deque<Callback>& queue = it->second;
      while (!queue.empty()) {
        Callback& head = queue.front();
        const cudaError_t error = cudaEventQuery(head.event);
        if (error == cudaErrorNotReady) break;
        done.push_back(Done{std::move(head), error});
        queue.pop_front();
        --pending_count_;
      }
      if (queue.empty()) {
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (Done& d : done) finish_(std::move(d.callback), d.error);
  return done.size();
}

CudaStream::~CudaStream() {
  // Work still queued finishes first: destroying a stream does not cancel it.
  const cudaError_t error = cudaStreamDestroy(stream_);
  if (backend_.health().ok()) LogIfFailed(error, "cudaStreamDestroy");  // else every call fails
  // A graph still running is freed once it completes.
  for (const auto& [nodes, graph] : graphs_) cudaGraphExecDestroy(graph);
}

absl::Status CudaStream::BeginCapture() {
  RETURN_IF_ERROR(backend_.health());
  RETURN_IF_ERROR(backend_.SetDevice(device_));
  // Thread-local: other threads' CUDA calls (completion polls, allocations) go on as usual.
  RETURN_IF_ERROR(backend_.Check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                 "cudaStreamBeginCapture", __FILE__, __LINE__));
  return absl::OkStatus();
}

absl::StatusOr<cudaGraph_t> CudaStream::EndCaptureGraph() {
  cudaGraph_t graph = nullptr;
  const cudaError_t error = cudaStreamEndCapture(stream_, &graph);
  if (error == cudaSuccess) return graph;
  if (graph != nullptr) cudaGraphDestroy(graph);
  return RecordingError(error, "cudaStreamEndCapture");
}

absl::Status CudaStream::EndCapture() {
  ready_ = nullptr;
  ASSIGN_OR_RETURN(cudaGraph_t graph, EndCaptureGraph());
  cudaError_t error = cudaSuccess;
  auto failed = [&](const char* call) {
    cudaGraphDestroy(graph);
    return RecordingError(error, call);
  };
  size_t nodes = 0;
  error = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (error != cudaSuccess) return failed("cudaGraphGetNodes");
  auto it = graphs_.find(nodes);
  if (it != graphs_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(it->second, graph, &info) != cudaSuccess) {
      cudaGetLastError();  // not the same shape after all: instantiate it anew
      cudaGraphExecDestroy(it->second);
      graphs_.erase(it);
      it = graphs_.end();
    }
  }
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      for (const auto& [n, g] : graphs_) cudaGraphExecDestroy(g);
      graphs_.clear();
    }
    cudaGraphExec_t exec = nullptr;
    error = cudaGraphInstantiate(&exec, graph, 0);
    if (error != cudaSuccess) return failed("cudaGraphInstantiate");
    it = graphs_.emplace(nodes, exec).first;
  }
  cudaGraphDestroy(graph);
  ready_ = it->second;
  return absl::OkStatus();
}

absl::Status CudaStream::LaunchCaptured() {
  if (ready_ == nullptr) return absl::FailedPreconditionError("no recording is ready to launch");
  const cudaGraphExec_t exec = std::exchange(ready_, nullptr);
  const cudaError_t error = cudaGraphLaunch(exec, stream_);
  return error == cudaSuccess ? absl::OkStatus() : RecordingError(error, "cudaGraphLaunch");
}

absl::StatusOr<std::unique_ptr<Recording>> CudaStream::EndRecording() {
  ASSIGN_OR_RETURN(cudaGraph_t graph, EndCaptureGraph());
  cudaGraphExec_t exec = nullptr;
  const cudaError_t error = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (error != cudaSuccess) return RecordingError(error, "cudaGraphInstantiate");
  return std::make_unique<CudaRecording>(device_, exec);
}

absl::Status CudaStream::LaunchRecording(const Recording& recording) {
  const auto& graph = static_cast<const CudaRecording&>(recording);
  if (graph.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("a recording made on device ", graph.device(),
                                                   " cannot run on device ", device_));
  }
  const cudaError_t error = cudaGraphLaunch(graph.exec(), stream_);
  return error == cudaSuccess ? absl::OkStatus() : RecordingError(error, "cudaGraphLaunch");
}

absl::Status CudaStream::RecordingError(cudaError_t error, const char* call) {
  // A recording that went wrong is not the device's failure: clear it, report it.
  absl::Status status = backend_.Check(error, call, __FILE__, __LINE__);
  if (!IsStickyError(error)) cudaGetLastError();
  return status;
}

absl::Status CudaStream::Wait(std::shared_ptr<Event> event) {
  auto* e = dynamic_cast<CudaEvent*>(event.get());
  if (e == nullptr) return absl::InvalidArgumentError("event is not from the CUDA backend");
  RETURN_IF_ERROR(backend_.SetDevice(device_));
  return backend_.Check(cudaStreamWaitEvent(stream_, e->get(), 0), "cudaStreamWaitEvent", __FILE__,
                        __LINE__);
}

absl::StatusOr<std::shared_ptr<Event>> CudaStream::Record() {
  RETURN_IF_ERROR(backend_.SetDevice(device_));
  cudaEvent_t event = nullptr;
  // Timing stays enabled: the executor times every operation between two of these.
  EventPool& pool = backend_.TimingEvents(device_);
  RETURN_IF_ERROR(
      backend_.Check(pool.Acquire(&event), "cudaEventCreateWithFlags", __FILE__, __LINE__));
  auto wrapped = std::make_shared<CudaEvent>(event, device_, pool);
  RETURN_IF_ERROR(
      backend_.Check(cudaEventRecord(event, stream_), "cudaEventRecord", __FILE__, __LINE__));
  return wrapped;
}

absl::Status CudaStream::OnComplete(absl::AnyInvocable<void(absl::Status) &&> fn) {
  return backend_.EnqueueCallback(*this, std::move(fn));
}

absl::Status CudaStream::OnEvent(std::shared_ptr<Event> event,
                                 absl::AnyInvocable<void(absl::Status) &&> fn) {
  const auto* e = dynamic_cast<const CudaEvent*>(event.get());
  if (e == nullptr || e->device() != device_) {
    return absl::InvalidArgumentError("the event is not from this stream's device");
  }
  RETURN_IF_ERROR(backend_.health());
  poller_.Add(stream_,
              CompletionPoller::Callback{e->get(), device_, std::move(fn), std::move(event)});
  return absl::OkStatus();
}

// The backend's side of completion callbacks.

absl::Status CudaBackend::EnqueueCallback(CudaStream& stream,
                                          absl::AnyInvocable<void(absl::Status) &&> fn) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  cudaEvent_t event = nullptr;
  EventPool& pool = devices_[stream.device()]->sync_events;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, pool.Acquire(&event));
  if (absl::Status s =
          Check(cudaEventRecord(event, stream.get()), "cudaEventRecord", __FILE__, __LINE__);
      !s.ok()) {
    pool.Release(event);
    return s;
  }
  stream.poller().Add(stream.get(),
                      CompletionPoller::Callback{event, stream.device(), std::move(fn), nullptr});
  return absl::OkStatus();
}

void CudaBackend::ReleaseSyncEvent(const CompletionPoller::Callback& callback) {
  if (callback.owner == nullptr) devices_[callback.device]->sync_events.Release(callback.event);
}

void CudaBackend::FinishCallback(CompletionPoller::Callback callback, cudaError_t error) {
  ReleaseSyncEvent(callback);
  // A sticky error also marks the backend failed.
  absl::Status status = error == cudaSuccess
                            ? absl::OkStatus()
                            : Check(error, "work enqueued on the stream", __FILE__, __LINE__);
  std::move(callback.fn)(std::move(status));
}

void CudaBackend::FailPendingCallbacks(const absl::Status& status) {
  for (const auto& poller : pollers_) {
    for (CompletionPoller::Callback& c : poller->TakeAll()) {
      ReleaseSyncEvent(c);
      std::move(c.fn)(status);
    }
  }
}

absl::StatusOr<std::unique_ptr<Stream>> CudaBackend::CreateStream(int device) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(device));
  cudaStream_t stream = nullptr;
  // Non-blocking: independent of the legacy default stream that libraries may use.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check,
                                      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CompletionPoller& poller = *pollers_[next_poller_.fetch_add(1) % pollers_.size()];
  return std::make_unique<CudaStream>(*this, device, stream, poller);
}

absl::StatusOr<double> CudaBackend::ElapsedSeconds(const Event& start, const Event& end) {
  const auto* s = dynamic_cast<const CudaEvent*>(&start);
  const auto* e = dynamic_cast<const CudaEvent*>(&end);
  if (s == nullptr || e == nullptr)
    return absl::InvalidArgumentError("event is not from the CUDA backend");
  float ms = 0;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaEventElapsedTime(&ms, s->get(), e->get()));
  return ms / 1e3;
}

}  // namespace gpucompute::cuda::detail

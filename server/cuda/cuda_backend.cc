#include "server/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda.h>  // CUresult and CUdeviceptr only: the driver is reached through the runtime
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/kernels.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/elementwise_kernels.h"
#include "server/cuda/pinned_staging.h"
#include "server/cuda/small_block_cache.h"
#include "server/util/status_macros.h"
#include "server/util/thread_name.h"

namespace gpucompute::cuda {
namespace {

// Staging blocks: large ones for transfer chunks, small ones for the few bytes of an
// inline reduction result, so that those never queue behind a large transfer.
constexpr uint64_t kLargeBlockBytes = 8 << 20;
constexpr uint64_t kSmallBlockBytes = 64 << 10;
constexpr size_t kSmallBlocks = 64;

// cudaSetDevice, skipped when the calling thread's current device already is `device`:
// the call takes a driver lock, and submitting one operation would make it several
// times. Every device switch of this backend goes through here, so the cache stays true.
cudaError_t SwitchDevice(int device) {
  thread_local int current = -1;
  if (current == device) return cudaSuccess;
  const cudaError_t error = cudaSetDevice(device);
  current = error == cudaSuccess ? device : -1;
  return error;
}

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
// driver's callback thread first, adding tens of microseconds to every operation's
// completion. The thread spins while callbacks are pending and otherwise sleeps until one
// is added. The backend has a few, each serving the streams given to it, so
// that completions of different streams do not queue behind each other.
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

  explicit CompletionPoller(FinishFn finish)
      : finish_(std::move(finish)), thread_([this] {
          NameThisThread("cuda-complete");
          Run();
        }) {}
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

// Spin this long after the last completion or the last callback added, work pending or
// not, before backing off to short sleeps (or, with nothing pending, to waiting for an
// addition): a chain of operations completes one after another, and each waits for the
// poll. Counting from additions too keeps a client that submits work taking about this
// long, one at a time, from waiting on a sleep at every completion.
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr auto kSweepInterval = std::chrono::microseconds(4);
constexpr auto kSleep = std::chrono::microseconds(20);

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
      // New work: spin for it rather than sleep, since a sleep overshoots by tens of
      // microseconds, which a short operation's caller would wait on.
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

class CudaBackend;

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

CudaStream& AsCuda(Stream& stream) { return static_cast<CudaStream&>(stream); }
char* Bytes(const DeviceMemory& m) { return static_cast<char*>(m.data()); }

// One GPU: its memory pool, a stream for allocations, its cuBLAS handle and staging.
struct Device {
  int index = 0;
  int compute_capability = 0;  // 90 for sm_90
  int sm_count = 0;
  cudaMemPool_t pool = nullptr;
  // Allocations and frees are ordered on this stream, and each allocation is waited for,
  // so that memory can be used on any stream as soon as Allocate returns.
  cudaStream_t alloc_stream = nullptr;
  absl::Mutex cublas_mu;  // a cuBLAS handle is not safe for concurrent use
  cublasHandle_t cublas ABSL_GUARDED_BY(cublas_mu) = nullptr;
  std::unique_ptr<PinnedStaging> large_staging;
  std::unique_ptr<PinnedStaging> small_staging;
  // Freed blocks of up to 1 MiB, kept for the next allocations of their size.
  std::unique_ptr<SmallBlockCache> small_blocks;
  EventPool timing_events{cudaEventDefault};
  EventPool sync_events{cudaEventDisableTiming};
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  const std::vector<DeviceDescription>& devices() const override { return descriptions_; }
  // Deep enough that a busy session's burst of up to 128 small operations is recorded
  // and launched as one graph, and that a chain's runs of 32 queue behind one another,
  // rather than a tail waiting for its head to finish on the device. With an event
  // before and after each operation launched on its own, that is under 400 entries in
  // the stream's queue.
  int DispatchWindow() const override { return 128; }
  void PollCompletions() override {
    for (const std::unique_ptr<CompletionPoller>& poller : pollers_) poller->TrySweep();
  }

  absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override;
  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override;

  absl::Status CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst, uint64_t dst_offset,
                            uint64_t bytes) override;
  absl::Status CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset, void* dst,
                          uint64_t bytes) override;
  absl::Status Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset, DeviceMemory& dst,
                    uint64_t dst_offset, uint64_t bytes) override;
  // Host staging is pinned: CopyFromPinnedHost and CopyToPinnedHost move it in one DMA,
  // without the staging blocks.
  absl::StatusOr<DeviceMemory> AllocateHostStaging(uint64_t bytes) override;
  absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                    int64_t count) override;
  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs,
                                         DeviceMemory& out, DType out_dtype, int64_t n) override;
  absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype, const DeviceMemory& in,
                      const ReduceShape& shape, DeviceMemory& out) override;
  absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                    const DeviceMemory& a, const DeviceMemory& x, double beta,
                    DeviceMemory& y) override;
  absl::Status Random(Stream& stream, const RandomParams& params, DType dtype, DeviceMemory& out,
                      int64_t n) override;

  absl::StatusOr<double> PrepareElementwise(const expr::Program& program, DType out_dtype) override;
  PoolUsage MemoryPoolUsage(int device) const override;
  absl::StatusOr<PoolUsage> TrimMemoryPool(int device, uint64_t keep_bytes) override;
  absl::Status StartProfiler() override;
  absl::Status StopProfiler() override;
  void PushRange(const std::string& name) override { nvtxRangePushA(name.c_str()); }
  void PopRange() override { nvtxRangePop(); }

  absl::Status PinHostMemory(void* ptr, uint64_t bytes, bool read_only) override;
  void UnpinHostMemory(void* ptr) override;
  absl::Status CopyFromPinnedHost(Stream& stream, const void* src, DeviceMemory& dst,
                                  uint64_t dst_offset, uint64_t bytes) override;
  absl::Status CopyToPinnedHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                void* dst, uint64_t bytes) override;
  absl::StatusOr<DeviceMemory> AllocateExportable(int device, uint64_t bytes) override;
  absl::StatusOr<std::string> ExportIpcHandle(const DeviceMemory& memory) override;
  absl::StatusOr<DeviceMemory> OpenIpcHandle(int device, absl::string_view handle,
                                             uint64_t bytes) override;

  // Checks a CUDA call's result; a sticky error also marks the backend failed.
  absl::Status Check(cudaError_t error, const char* call, const char* file, int line);
  // Runs `fn` on the stream's completion poller once the work enqueued on it is done.
  absl::Status EnqueueCallback(CudaStream& stream, absl::AnyInvocable<void(absl::Status) &&> fn);
  EventPool& TimingEvents(int device) { return devices_[device]->timing_events; }
  absl::Status SetDevice(int device) {
    return Check(SwitchDevice(device), "cudaSetDevice", __FILE__, __LINE__);
  }
  // Raises a sticky error on `device` and waits for it to surface (tests only).
  absl::Status InjectIllegalAddress(int device);

 private:
  CudaBackend() = default;
  absl::Status Init(const CudaBackendOptions& options);
  absl::Status WarmUp(int device);
  // Hands a callback's event back to sync_events, unless the caller owns it (OnEvent).
  void ReleaseSyncEvent(const CompletionPoller::Callback& callback);
  // Runs a callback whose event completed (a completion poller's FinishFn).
  void FinishCallback(CompletionPoller::Callback callback, cudaError_t error);
  // Fails every pending callback with `status` (the device is unusable).
  void FailPendingCallbacks(const absl::Status& status);
  absl::Status CheckDevice(int device) const;
  absl::Status CheckHealthy() const { return health(); }
  // Frees the device's kept small blocks (on its allocation stream; the device is current).
  void FreeSmallBlocks(Device& d);
  // Copies between host and device through staging blocks, one block at a time.
  absl::Status StagedCopy(CudaStream& stream, const char* src, char* dst, uint64_t bytes,
                          bool to_device);

  std::vector<DeviceDescription> descriptions_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<ElementwiseKernels> elementwise_;
  // Streams are given to the pollers in turn as they are made.
  std::vector<std::unique_ptr<CompletionPoller>> pollers_;
  std::atomic<size_t> next_poller_{0};
};

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

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend());
  RETURN_IF_ERROR(backend->Init(options));
  return backend;
}

absl::Status CudaBackend::Init(const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device is usable here (",
        error == cudaSuccess ? "none found" : cudaGetErrorName(error), "); use --backend=cpu"));
  }
  for (int d = 0; d < count; ++d) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, SwitchDevice(d));
    cudaDeviceProp prop{};
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaGetDeviceProperties(&prop, d));
    int memory_clock_khz = 0;
    int bus_width_bits = 0;
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, d));
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, d));

    auto device = std::make_unique<Device>();
    device->index = d;
    device->compute_capability = prop.major * 10 + prop.minor;
    device->sm_count = prop.multiProcessorCount;

    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = d;
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaMemPoolCreate(&device->pool, &props));
    // Memory the pool keeps when freed; the initial reservation is kept in any case.
    uint64_t threshold = std::max(options.pool_release_threshold_bytes, options.pool_initial_bytes);
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, cudaMemPoolSetAttribute(device->pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    // Plain cudaMallocAsync (kernels' scratch) draws from this pool too.
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaDeviceSetMemPool(d, device->pool));
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, cudaStreamCreateWithFlags(&device->alloc_stream, cudaStreamNonBlocking));
    if (options.pool_initial_bytes > 0) {
      void* p = nullptr;
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
          Check, cudaMallocFromPoolAsync(&p, options.pool_initial_bytes, device->pool,
                                         device->alloc_stream));
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaFreeAsync(p, device->alloc_stream));
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(device->alloc_stream));
    }
    device->large_staging = std::make_unique<PinnedStaging>(
        kLargeBlockBytes, static_cast<size_t>(std::max<uint64_t>(
                              options.pinned_staging_bytes / kLargeBlockBytes, 2)));
    device->small_staging = std::make_unique<PinnedStaging>(kSmallBlockBytes, kSmallBlocks);
    device->small_blocks = std::make_unique<SmallBlockCache>(options.small_block_cache_bytes);

    DeviceDescription description;
    description.index = d;
    description.name = prop.name;
    description.total_memory_bytes = prop.totalGlobalMem;
    // Double data rate: two transfers per clock over the bus.
    description.peak_bandwidth_gbps = 2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8) / 1e9;
    description.compute_units = prop.multiProcessorCount;
    descriptions_.push_back(std::move(description));
    devices_.push_back(std::move(device));
  }
  elementwise_ = std::make_unique<ElementwiseKernels>(options.kernel_cache_dir);
  // A poller per four cores, at most four: enough that sessions on many streams are
  // not answered one at a time, few enough that their spinning costs little.
  const size_t pollers = std::clamp<size_t>(std::thread::hardware_concurrency() / 4, 1, 4);
  for (size_t i = 0; i < pollers; ++i) {
    pollers_.push_back(std::make_unique<CompletionPoller>(
        [this](CompletionPoller::Callback c, cudaError_t e) { FinishCallback(std::move(c), e); }));
  }
  for (const auto& device : devices_) {
    RETURN_IF_ERROR(WarmUp(device->index));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::WarmUp(int device) {
  // The CUDA runtime loads each kernel on its first launch, and cuBLAS sets up on its first
  // call: tens of milliseconds that would land on a client's first gemv or reduction (and
  // in its device time). Paying them here keeps them off every request.
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, CreateStream(device));
  constexpr int64_t kN = 128;  // 16384-element reductions take the chunked path large ones do
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    ASSIGN_OR_RETURN(DeviceMemory a, Allocate(device, kN * kN * DTypeSize(dtype)));
    ASSIGN_OR_RETURN(DeviceMemory v, Allocate(device, kN * DTypeSize(dtype)));
    ASSIGN_OR_RETURN(DeviceMemory w, Allocate(device, kN * DTypeSize(dtype)));
    for (Distribution distribution : {Distribution::kUniform, Distribution::kNormal}) {
      RandomParams params;
      params.distribution = distribution;
      RETURN_IF_ERROR(Random(*stream, params, dtype, a, kN * kN));
    }
    RETURN_IF_ERROR(Fill(*stream, v, dtype, 0, kN));
    for (bool col_major : {false, true}) {
      for (bool transpose : {false, true}) {
        const GemvShape shape{kN, kN, col_major, transpose};
        RETURN_IF_ERROR(Gemv(*stream, dtype, shape, 1.0, a, v, 0.0, w));
      }
    }
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin,
                            ReduceKind::kNorm2, ReduceKind::kMean}) {
      RETURN_IF_ERROR(Reduce(*stream, kind, dtype, a, ReduceShape{1, kN * kN, 1}, w));
    }
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(AsCuda(*stream).get()));
  }
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  for (auto& device : devices_) {
    SwitchDevice(device->index);
    // After a sticky error every call fails; there is nothing left to wait for or log.
    if (health().ok()) LogIfFailed(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  pollers_.clear();  // each finishes its pending callbacks first
  elementwise_.reset();
  for (auto& device : devices_) {
    SwitchDevice(device->index);
    absl::MutexLock lock(&device->cublas_mu);
    if (device->cublas != nullptr) {
      const cublasStatus_t destroyed = cublasDestroy(device->cublas);
      if (health().ok()) LogIfFailed(destroyed, "cublasDestroy");
    }
    device->large_staging.reset();
    device->small_staging.reset();
    if (!health().ok()) continue;
    FreeSmallBlocks(*device);
    if (device->alloc_stream != nullptr)
      LogIfFailed(cudaStreamDestroy(device->alloc_stream), "cudaStreamDestroy");
    if (device->pool != nullptr)
      LogIfFailed(cudaMemPoolDestroy(device->pool), "cudaMemPoolDestroy");
  }
}

absl::Status CudaBackend::Check(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  absl::Status status = CudaStatus(error, call, file, line);
  if (IsStickyError(error)) {
    ReportFailure(status);
    FailPendingCallbacks(status);
  }
  return status;
}

absl::Status CudaBackend::CheckDevice(int device) const {
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("no device ", device, " (this server has ", devices_.size(), ")"));
  }
  return absl::OkStatus();
}

// ---- completion callbacks

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

// ---- memory and streams

absl::StatusOr<DeviceMemory> CudaBackend::Allocate(int device, uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  Device& d = *devices_[device];
  // A small allocation takes a whole block of its size class, so that the block can
  // serve any allocation of that class once freed.
  const uint64_t block_bytes = SmallBlockCache::BlockBytes(bytes);
  // Runs once every use has completed (the executor keeps buffers alive until then), so
  // the block may go to any stream's next allocation, and freeing it in the allocation
  // stream's order is safe.
  auto release = [this, &d, block_bytes](void* ptr, uint64_t) {
    if (block_bytes != 0 && health().ok() && d.small_blocks->Keep(ptr, block_bytes)) return;
    SwitchDevice(d.index);
    const cudaError_t freed = cudaFreeAsync(ptr, d.alloc_stream);
    if (health().ok()) LogIfFailed(freed, "cudaFreeAsync");
  };
  if (block_bytes != 0) {
    if (void* p = d.small_blocks->Take(block_bytes)) {
      return DeviceMemory(p, bytes, device, std::move(release));
    }
  }
  RETURN_IF_ERROR(SetDevice(device));
  void* p = nullptr;
  const uint64_t pool_bytes = block_bytes != 0 ? block_bytes : std::max<uint64_t>(bytes, 1);
  cudaError_t error = cudaMallocFromPoolAsync(&p, pool_bytes, d.pool, d.alloc_stream);
  if (error == cudaErrorMemoryAllocation && d.small_blocks->kept_bytes() > 0) {
    // The kept blocks may be what is missing: give them back to the pool and try again.
    cudaGetLastError();
    FreeSmallBlocks(d);
    error = cudaMallocFromPoolAsync(&p, pool_bytes, d.pool, d.alloc_stream);
  }
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("device ", device, " is out of memory allocating ", bytes,
                     " bytes (pool holds ", MemoryPoolUsage(device).reserved_bytes, " bytes)"));
  }
  RETURN_IF_ERROR(Check(error, "cudaMallocFromPoolAsync", __FILE__, __LINE__));
  // Waiting here orders the allocation before any use on any stream.
  RETURN_IF_ERROR(
      Check(cudaStreamSynchronize(d.alloc_stream), "cudaStreamSynchronize", __FILE__, __LINE__));
  return DeviceMemory(p, bytes, device, std::move(release));
}

void CudaBackend::FreeSmallBlocks(Device& d) {
  for (const auto& [block, block_bytes] : d.small_blocks->TakeAll()) {
    LogIfFailed(cudaFreeAsync(block, d.alloc_stream), "cudaFreeAsync");
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

PoolUsage CudaBackend::MemoryPoolUsage(int device) const {
  PoolUsage usage;
  if (device < 0 || device >= static_cast<int>(devices_.size())) return usage;
  cudaMemPool_t pool = devices_[device]->pool;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &usage.reserved_bytes);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &usage.used_bytes);
  // Kept small blocks are free to reuse, not in use.
  usage.used_bytes -= std::min(usage.used_bytes, devices_[device]->small_blocks->kept_bytes());
  return usage;
}

absl::StatusOr<PoolUsage> CudaBackend::TrimMemoryPool(int device, uint64_t keep_bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(SetDevice(device));
  Device& d = *devices_[device];
  FreeSmallBlocks(d);
  // Frees still pending in the allocation stream's order would not be released.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(d.alloc_stream));
  // Nothing to do when the pool holds no more than keep_bytes; the driver would round a
  // huge keep_bytes up to its granularity, overflow, and trim everything.
  if (keep_bytes < MemoryPoolUsage(device).reserved_bytes) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaMemPoolTrimTo(d.pool, keep_bytes));
  }
  return MemoryPoolUsage(device);
}

absl::Status CudaBackend::StartProfiler() {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaProfilerStart());
  return absl::OkStatus();
}

absl::Status CudaBackend::StopProfiler() {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaProfilerStop());
  return absl::OkStatus();
}

// ---- transfers

namespace {

// Splits a transfer of `bytes` into pieces of at most one staging block and calls
// fn(block, offset, piece) for each, with a block acquired for it; fn enqueues the piece
// and arranges for the block's release.
template <typename Fn>
absl::Status ForEachStagedPiece(PinnedStaging& staging, uint64_t bytes, Fn&& fn) {
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t piece = std::min(bytes - done, staging.block_bytes());
    ASSIGN_OR_RETURN(void* block, staging.Acquire());
    RETURN_IF_ERROR(fn(block, done, piece));
    done += piece;
  }
  return absl::OkStatus();
}

// What a host function does once a staged piece's DMA copy has completed: copy the block
// out to the caller's memory (downloads only) and give the block back. Runs on CUDA's
// callback thread as a stream operation, so later work on the stream waits for it.
struct StagedPieceDone {
  PinnedStaging* staging;
  void* block;
  char* deliver_to;  // null for uploads
  uint64_t bytes;

  static void CUDART_CB Run(void* p) {
    auto* self = static_cast<StagedPieceDone*>(p);
    if (self->deliver_to != nullptr) std::memcpy(self->deliver_to, self->block, self->bytes);
    self->staging->Release(self->block);
    delete self;
  }
};

}  // namespace

absl::Status CudaBackend::StagedCopy(CudaStream& stream, const char* src, char* dst, uint64_t bytes,
                                     bool to_device) {
  Device& d = *devices_[stream.device()];
  PinnedStaging& staging = bytes <= kSmallBlockBytes ? *d.small_staging : *d.large_staging;
  return ForEachStagedPiece(
      staging, bytes, [&](void* block, uint64_t offset, uint64_t piece) -> absl::Status {
        // Uploads copy into the block now and DMA from it; downloads DMA into it and copy out
        // when the DMA is done.
        if (to_device) std::memcpy(block, src + offset, piece);
        absl::Status s =
            Check(cudaMemcpyAsync(
                      to_device ? dst + offset : block, to_device ? block : src + offset, piece,
                      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream.get()),
                  "cudaMemcpyAsync", __FILE__, __LINE__);
        if (!s.ok()) {
          staging.Release(block);
          return s;
        }
        auto* done =
            new StagedPieceDone{&staging, block, to_device ? nullptr : dst + offset, piece};
        s = Check(cudaLaunchHostFunc(stream.get(), &StagedPieceDone::Run, done),
                  "cudaLaunchHostFunc", __FILE__, __LINE__);
        // A block whose copy was enqueued but whose release was not is lost with the stream.
        if (!s.ok()) delete done;
        return s;
      });
}

absl::Status CudaBackend::CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst,
                                       uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  return StagedCopy(AsCuda(stream), static_cast<const char*>(src), Bytes(dst) + dst_offset, bytes,
                    /*to_device=*/true);
}

absl::Status CudaBackend::CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                     void* dst, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  return StagedCopy(AsCuda(stream), Bytes(src) + src_offset, static_cast<char*>(dst), bytes,
                    /*to_device=*/false);
}

absl::Status CudaBackend::Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                               DeviceMemory& dst, uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0 || (src.data() == dst.data() && src_offset == dst_offset)) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(Bytes(dst) + dst_offset, Bytes(src) + src_offset, bytes,
                             cudaMemcpyDeviceToDevice, AsCuda(stream).get()));
  return absl::OkStatus();
}

// ---- shared memory and CUDA IPC

absl::Status CudaBackend::PinHostMemory(void* ptr, uint64_t bytes, bool read_only) {
  RETURN_IF_ERROR(CheckHealthy());
  // Portable: pinned for every device's context, whichever device a copy runs on.
  unsigned int flags = cudaHostRegisterPortable;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaHostRegister(ptr, bytes, flags));
  return absl::OkStatus();
}

void CudaBackend::UnpinHostMemory(void* ptr) {
  const cudaError_t error = cudaHostUnregister(ptr);
  if (health().ok()) LogIfFailed(error, "cudaHostUnregister");
}

absl::Status CudaBackend::CopyFromPinnedHost(Stream& stream, const void* src, DeviceMemory& dst,
                                             uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(Bytes(dst) + dst_offset, src, bytes, cudaMemcpyHostToDevice,
                             AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToPinnedHost(Stream& stream, const DeviceMemory& src,
                                           uint64_t src_offset, void* dst, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(dst, Bytes(src) + src_offset, bytes, cudaMemcpyDeviceToHost,
                             AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemory> CudaBackend::AllocateExportable(int device, uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(device));
  // cudaMalloc, not the pool: cudaIpcGetMemHandle exports only such allocations.
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "device ", device, " is out of memory allocating ", bytes, " exportable bytes"));
  }
  RETURN_IF_ERROR(Check(error, "cudaMalloc", __FILE__, __LINE__));
  return DeviceMemory(p, bytes, device, [this, device](void* ptr, uint64_t) {
    // cudaFree waits for the device: every use has been enqueued and is done or will be.
    SwitchDevice(device);
    const cudaError_t freed = cudaFree(ptr);
    if (health().ok()) LogIfFailed(freed, "cudaFree");
  });
}

absl::StatusOr<std::string> CudaBackend::ExportIpcHandle(const DeviceMemory& memory) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(memory.device()));
  cudaIpcMemHandle_t handle;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaIpcGetMemHandle(&handle, memory.data()));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

namespace {

// The allocation that `ptr` lies in (cuMemGetAddressRange), through the runtime's driver
// entry point, so that nothing links libcuda.
absl::Status AllocationRange(void* ptr, CUdeviceptr* base, size_t* size) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetAddressRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetAddressRange>(fn);
  }();
  if (get_range == nullptr) {
    return absl::FailedPreconditionError(
        "the CUDA driver offers no cuMemGetAddressRange to check an IPC allocation's size");
  }
  if (get_range(base, size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed on an opened IPC allocation");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceMemory> CudaBackend::OpenIpcHandle(int device, absl::string_view handle,
                                                        uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle is ", sizeof(h), " bytes, not ", handle.size()));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  RETURN_IF_ERROR(SetDevice(device));
  void* p = nullptr;
  const cudaError_t error = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (error != cudaSuccess) {
    // A bad handle is the caller's mistake; Check still marks a sticky error.
    absl::Status s = Check(error, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
    if (IsStickyError(error)) return s;
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open the CUDA IPC handle on device ", device, ": ", s.message()));
  }
  DeviceMemory memory(p, bytes, device, [this, device](void* ptr, uint64_t) {
    SwitchDevice(device);
    const cudaError_t closed = cudaIpcCloseMemHandle(ptr);
    if (health().ok()) LogIfFailed(closed, "cudaIpcCloseMemHandle");
  });
  // The client says how large its allocation is; a copy past its end would fault the
  // server's context, so the driver's word is taken instead.
  CUdeviceptr base = 0;
  size_t size = 0;
  RETURN_IF_ERROR(AllocationRange(p, &base, &size));
  const uint64_t available = size - (reinterpret_cast<CUdeviceptr>(p) - base);
  if (bytes > available) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA IPC allocation holds ", available,
                                                   " bytes, fewer than the ", bytes,
                                                   " the region would cover"));
  }
  return memory;
}

absl::StatusOr<DeviceMemory> CudaBackend::AllocateHostStaging(uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  void* p = nullptr;
  // Portable: pinned for every device's DMA engines, whichever device a transfer uses.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocPortable));
  return DeviceMemory(p, bytes, -1, [](void* ptr, uint64_t) {
    if (cudaError_t e = cudaFreeHost(ptr); e != cudaSuccess) {
      std::fprintf(stderr, "gpucompute: cudaFreeHost failed: %s\n", cudaGetErrorName(e));
    }
  });
}

// ---- kernels

absl::Status CudaBackend::Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                               int64_t count) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (count == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, FillAsync(dst.data(), dtype, value_bits, count, AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::PrepareElementwise(const expr::Program& program,
                                                       DType out_dtype) {
  RETURN_IF_ERROR(CheckHealthy());
  double seconds = 0;
  // One kernel per distinct architecture among the devices.
  std::vector<int> done;
  for (const auto& device : devices_) {
    if (std::find(done.begin(), done.end(), device->compute_capability) != done.end()) continue;
    done.push_back(device->compute_capability);
    RETURN_IF_ERROR(SetDevice(device->index));
    double compile = 0;
    RETURN_IF_ERROR(elementwise_->Get(program, out_dtype, device->compute_capability, &compile));
    seconds += compile;
  }
  return seconds;
}

absl::StatusOr<LaunchInfo> CudaBackend::Elementwise(Stream& stream, const expr::Program& program,
                                                    std::span<const DeviceMemory* const> inputs,
                                                    DeviceMemory& out, DType out_dtype, int64_t n) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  const Device& d = *devices_[stream.device()];
  LaunchInfo info;
  ASSIGN_OR_RETURN(
      const CompiledElementwise* kernel,
      elementwise_->Get(program, out_dtype, d.compute_capability, &info.compile_seconds));
  if (n == 0) return info;
  std::vector<const void*> pointers;
  pointers.reserve(inputs.size());
  for (const DeviceMemory* m : inputs) pointers.push_back(m == nullptr ? nullptr : m->data());
  absl::Status s = LaunchElementwise(*kernel, program, pointers, out.data(), n, d.sm_count,
                                     AsCuda(stream).get());
  if (!s.ok()) {
    // A launch error may be sticky; the launcher reports it as a status only.
    Check(cudaPeekAtLastError(), "elementwise launch", __FILE__, __LINE__).IgnoreError();
    return s;
  }
  return info;
}

absl::Status CudaBackend::Reduce(Stream& stream, ReduceKind kind, DType in_dtype,
                                 const DeviceMemory& in, const ReduceShape& shape,
                                 DeviceMemory& out) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  const Device& d = *devices_[stream.device()];
  // f_order_rows only changes what argmin and argmax report (see kernels/ops.h).
  const bool arg = kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax;
  ReduceShape plain = shape;
  plain.f_order_rows = 0;
  if (arg && shape.f_order_rows > 0) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, ArgExtremeInCOrderAsync(kind == ReduceKind::kArgmin, in_dtype, in.data(),
                                       shape.f_order_rows, shape.extent / shape.f_order_rows,
                                       out.data(), d.pool, AsCuda(stream).get()));
    return absl::OkStatus();
  }
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, ReduceAsync(kind, in_dtype, in.data(), plain,
                                                         out.data(), d.pool, AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                               const DeviceMemory& a, const DeviceMemory& x, double beta,
                               DeviceMemory& y) {
  RETURN_IF_ERROR(CheckHealthy());
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv takes float32 or float64, not ", DTypeName(dtype)));
  }
  RETURN_IF_ERROR(SetDevice(stream.device()));
  Device& d = *devices_[stream.device()];
  cudaStream_t s = AsCuda(stream).get();
  // cuBLAS is column-major. An F-layout A is A itself; a C-layout A is, read column-major,
  // the cols x rows matrix A^T, so op(A) flips between N and T.
  const int64_t m = shape.col_major ? shape.rows : shape.cols;
  const int64_t n = shape.col_major ? shape.cols : shape.rows;
  const bool transpose = shape.col_major ? shape.transpose : !shape.transpose;
  const int64_t y_len = shape.transpose ? shape.cols : shape.rows;
  const int64_t inner = shape.transpose ? shape.rows : shape.cols;
  absl::MutexLock lock(&d.cublas_mu);
  if (d.cublas == nullptr) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cublasCreate(&d.cublas));
    // Host scalars; no atomics, so results are deterministic run to run.
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cublasSetPointerMode(d.cublas, CUBLAS_POINTER_MODE_HOST));
  }
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cublasSetStream(d.cublas, s));
  if (y_len == 0) return absl::OkStatus();
  if (inner == 0) {
    // An empty sum: y = beta * y (BLAS would leave y untouched), and y is not read when
    // beta is 0.
    if (beta == 0) return Fill(stream, y, dtype, 0, y_len);
    if (dtype == DType::kFloat64) {
      return CudaStatus(cublasDscal_64(d.cublas, y_len, &beta, static_cast<double*>(y.data()), 1),
                        "cublasDscal_64", __FILE__, __LINE__);
    }
    const float beta_f = static_cast<float>(beta);
    return CudaStatus(cublasSscal_64(d.cublas, y_len, &beta_f, static_cast<float*>(y.data()), 1),
                      "cublasSscal_64", __FILE__, __LINE__);
  }
  const cublasOperation_t op = transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t lda = std::max<int64_t>(m, 1);
  absl::Status st;
  if (dtype == DType::kFloat64) {
    st = CudaStatus(cublasDgemv_64(d.cublas, op, m, n, &alpha, static_cast<const double*>(a.data()),
                                   lda, static_cast<const double*>(x.data()), 1, &beta,
                                   static_cast<double*>(y.data()), 1),
                    "cublasDgemv_64", __FILE__, __LINE__);
  } else {
    const float alpha_f = static_cast<float>(alpha);
    const float beta_f = static_cast<float>(beta);
    st =
        CudaStatus(cublasSgemv_64(d.cublas, op, m, n, &alpha_f, static_cast<const float*>(a.data()),
                                  lda, static_cast<const float*>(x.data()), 1, &beta_f,
                                  static_cast<float*>(y.data()), 1),
                   "cublasSgemv_64", __FILE__, __LINE__);
  }
  if (!st.ok()) Check(cudaPeekAtLastError(), "gemv launch", __FILE__, __LINE__).IgnoreError();
  return st;
}

absl::Status CudaBackend::Random(Stream& stream, const RandomParams& params, DType dtype,
                                 DeviceMemory& out, int64_t n) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (n == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, RandomAsync(params, dtype, out.data(), n, AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::InjectIllegalAddress(int device) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(SetDevice(device));
  cudaStream_t stream = nullptr;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check,
                                      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t error = IllegalAddressForTestingAsync(stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  return Check(error, "IllegalAddressForTestingAsync", __FILE__, __LINE__);
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

std::string DefaultKernelCacheDir() {
  if (const char* dir = std::getenv("GPUCOMPUTE_KERNEL_CACHE"); dir != nullptr) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/gpucompute/kernels");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/gpucompute/kernels");
  }
  return "";
}

absl::Status InjectIllegalAddressForTesting(Backend& backend, int device) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return absl::InvalidArgumentError("not a CUDA backend");
  return cuda->InjectIllegalAddress(device);
}

}  // namespace gpucompute::cuda

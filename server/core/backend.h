// The contract every compute backend implements: device memory, streams with events,
// and the kernels the service runs. The executor (server/core/executor.h) is written against
// this interface alone, so the CPU backend and the CUDA backend are interchangeable and
// are checked by one conformance suite (tests/backend/backend_conformance_test.cc).
//
// The model is CUDA's: work is enqueued on a Stream and runs in enqueue order; an Event
// recorded on a stream completes when the work enqueued before it has; a stream can be
// made to wait for an event recorded on another. Enqueueing never waits for the device.
#ifndef GPUCOMPUTE_SERVER_CORE_BACKEND_H_
#define GPUCOMPUTE_SERVER_CORE_BACKEND_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "server/arrays/strided_layout.h"
#include "server/expression/expression.h"

namespace gpucompute {

// Owns an allocation of device memory. Move-only; frees on destruction.
class DeviceMemory {
 public:
  using Deleter = std::function<void(void* ptr, uint64_t size)>;

  DeviceMemory() = default;
  DeviceMemory(void* ptr, uint64_t size, int device, Deleter deleter)
      : ptr_(ptr), size_(size), device_(device), deleter_(std::move(deleter)) {}
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      size_ = std::exchange(other.size_, 0);
      device_ = other.device_;
      deleter_ = std::move(other.deleter_);
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Reset(); }

  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }

 private:
  void Reset() {
    if (ptr_ != nullptr && deleter_) deleter_(ptr_, size_);
    ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  uint64_t size_ = 0;
  int device_ = 0;
  Deleter deleter_;
};

// Device work recorded once (Stream::EndRecording) and launched again as one unit
// (Stream::LaunchRecording) on any stream of the device it was recorded on, as often as
// wanted: each launch runs after the launch before it. Destroying it while a launch runs
// is allowed; the launch finishes.
class Recording {
 public:
  virtual ~Recording() = default;
};

// A point in a stream's work. Completes when everything enqueued before it has.
class Event {
 public:
  virtual ~Event() = default;
  // Whether the event has completed; never waits.
  virtual bool IsComplete() const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual int device() const = 0;
  // Work enqueued after this call starts only once `event` (from any stream of the
  // same backend) has completed.
  virtual absl::Status Wait(std::shared_ptr<Event> event) = 0;
  virtual absl::StatusOr<std::shared_ptr<Event>> Record() = 0;
  // Runs `fn` on a backend-owned host thread (or one in Backend::PollCompletions) once
  // all work enqueued before it has completed, with the stream's error state. `fn` may
  // enqueue work on any stream.
  virtual absl::Status OnComplete(absl::AnyInvocable<void(absl::Status) &&> fn) = 0;
  // As OnComplete, but `fn` waits only for `event`, which the caller recorded on this
  // stream, rather than for all enqueued so far; a backend may poll it rather than
  // record an event of its own. Callbacks of one stream still run in the order given.
  virtual absl::Status OnEvent(std::shared_ptr<Event> event,
                               absl::AnyInvocable<void(absl::Status) &&> fn) {
    return OnComplete(std::move(fn));
  }

  // --- Optional: recording work and launching it as one unit (a CUDA graph), so that a
  // run of small operations costs one launch instead of one per kernel. The executor
  // records only launches that enqueue kernels and device copies: no events, waits,
  // callbacks, host work or allocations.
  virtual bool CanCapture() const { return false; }
  // From now until EndCapture, the work this thread enqueues on the stream is recorded
  // rather than run.
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError("this backend's streams cannot record work");
  }
  // Ends the recording and readies it to launch. On failure the capture has ended all
  // the same and nothing recorded will run.
  virtual absl::Status EndCapture() { return BeginCapture(); }
  // Enqueues what the last successful EndCapture readied, as one unit. Apart, so that
  // work enqueued between the two (the event that times the unit) comes after the
  // host's recording, not before it.
  virtual absl::Status LaunchCaptured() { return BeginCapture(); }
  // Ends the recording begun by BeginCapture and hands it over instead of readying it for
  // LaunchCaptured; it bakes in the addresses the recorded work used. On failure, as
  // EndCapture.
  virtual absl::StatusOr<std::unique_ptr<Recording>> EndRecording() { return BeginCapture(); }
  // Enqueues a recording made on a stream of this stream's device.
  virtual absl::Status LaunchRecording(const Recording& recording) { return BeginCapture(); }
};

struct DeviceDescription {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  double peak_bandwidth_gbps = 0;  // 0 when unknown
  int compute_units = 0;
};

// An array read by a strided operation: device memory and where the elements lie in it.
// Null memory stands for a scalar input of an expression (its value is in the Program).
struct StridedInput {
  const DeviceMemory* memory = nullptr;
  StridedLayout layout;
};

// A reduction over some axes of the values of an elementwise expression, or of one array.
// The values are program(inputs) at every index of `shape` (each input's layout has that
// shape: broadcasting is already in its strides), or, without a program, inputs[0]'s
// elements. The output holds one result per index of the kept axes, in C order, of dtype
// ReduceResultDType(kind, value dtype).
struct StridedReduce {
  ReduceKind kind = ReduceKind::kSum;
  // The values' dtype: program->result_dtype() with a program, else inputs[0]'s.
  DType dtype = DType::kFloat32;
  const expr::Program* program = nullptr;
  std::vector<StridedInput> inputs;
  std::vector<int64_t> shape;
  // The reduced axes of `shape`: sorted, without repeats. All of them for a whole-array
  // reduction; none reduces each value alone.
  std::vector<int32_t> axes;
  double ddof = 0;  // kVar, kStd
};

// What a kernel launch reports besides its device time.
struct LaunchInfo {
  double compile_seconds = 0;  // time spent compiling before launching
  // Set by a launch that did host work of its own on the stream before its device work
  // (recording it, Stream::EndRecording): an event it recorded after that work, from
  // which the operation is timed rather than from before the launch, so that the host's
  // work is not counted as the device's.
  std::shared_ptr<Event> started;
};

// A device's memory pool: what it holds from the device (reserved) and what of that is
// handed out to live allocations (used).
struct PoolUsage {
  uint64_t reserved_bytes = 0;
  uint64_t used_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view name() const = 0;  // "cpu" or "cuda"
  virtual const std::vector<DeviceDescription>& devices() const = 0;

  // Allocates `bytes` on `device`, aligned to at least 256 bytes.
  virtual absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) = 0;
  // Seconds of device time between two events recorded on one stream, both complete.
  virtual absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) = 0;

  // Every call below enqueues work on `stream` and returns without waiting for it.
  // Memory and host pointers passed in must stay valid until that work completes;
  // sizes and offsets have been validated by the caller.
  virtual absl::Status CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst,
                                    uint64_t dst_offset, uint64_t bytes) = 0;
  virtual absl::Status CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                  void* dst, uint64_t bytes) = 0;
  virtual absl::Status Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                            DeviceMemory& dst, uint64_t dst_offset, uint64_t bytes) = 0;
  // Sets `count` elements of `dtype` at the start of `dst` to `value` (already
  // converted to dtype, in its native representation, DTypeSize(dtype) bytes).
  virtual absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                            int64_t count) = 0;
  // out[i] = program(inputs[..][i]) for i < n. inputs follow program.inputs(); entries
  // for scalar inputs are null. `out` may be one of the inputs.
  virtual absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                                 std::span<const DeviceMemory* const> inputs,
                                                 DeviceMemory& out, DType out_dtype, int64_t n) = 0;
  // See cpu::Reduce in server/cpu/kernels.h for the exact semantics.
  virtual absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype,
                              const DeviceMemory& in, const ReduceShape& shape,
                              DeviceMemory& out) = 0;
  virtual absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                            const DeviceMemory& a, const DeviceMemory& x, double beta,
                            DeviceMemory& y) = 0;
  virtual absl::Status Random(Stream& stream, const RandomParams& params, DType dtype,
                              DeviceMemory& out, int64_t n) = 0;
  // As Elementwise over strided arrays: out[idx] = program(inputs[..][idx]) for every index
  // idx of the iteration space, the shape every layout here has (inputs broadcast to it
  // with stride 0, `out_layout` included; the caller has coalesced them). `out` may be
  // one of the inputs only with exactly that input's layout.
  virtual absl::StatusOr<LaunchInfo> ElementwiseStrided(Stream& stream,
                                                        const expr::Program& program,
                                                        std::span<const StridedInput> inputs,
                                                        DeviceMemory& out,
                                                        const StridedLayout& out_layout,
                                                        DType out_dtype) {
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend has no strided elementwise kernels"));
  }
  // See StridedReduce. The combination order is a function of the shape and the axes
  // alone (kernels/reduce_ops.h), so results are bitwise the same run to run.
  virtual absl::StatusOr<LaunchInfo> ReduceStrided(Stream& stream, const StridedReduce& reduce,
                                                   DeviceMemory& out) {
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend has no strided reductions"));
  }

  // --- Optional services; the defaults suit a backend without them.

  // Makes Elementwise(program, ..., out_dtype) launch without compiling, and returns the
  // seconds spent compiling now (0 when the kernel was cached). Thread-safe and may take
  // long: the service calls it before submitting, outside the executor's lock.
  virtual absl::StatusOr<double> PrepareElementwise(const expr::Program& program, DType out_dtype) {
    return 0.0;
  }
  virtual PoolUsage MemoryPoolUsage(int device) const { return {}; }
  // How many operations the executor puts on one of this backend's streams ahead of
  // their completion; the rest wait in the executor, where a shutdown can still cancel
  // them. Deep enough to keep the device busy between the executor's turns.
  virtual int DispatchWindow() const { return 64; }
  // For the shutdown, once its grace is over: kernels stop where the backend can stop
  // them, and the operations they belong to fail with `status`; copies still run (the
  // final snapshot reads through them). The CPU backend stops a running kernel between
  // chunks and skips those not started; a launched device kernel cannot be stopped, so a
  // backend without the means does nothing and its launched work runs to its end.
  virtual void StopKernels(absl::Status status) {}
  // Runs, on the calling thread, the completion callbacks (Stream::OnComplete, OnEvent)
  // whose work is done, rather than leaving them for the backend's own threads to notice:
  // for a thread that spins anyway (server/util/warm_lane.h). Returns at once when another
  // thread is doing it. A backend whose own threads run the callbacks as the work ends
  // (the CPU backend's) has nothing to do.
  virtual void PollCompletions() {}
  // Returns pool memory beyond `keep_bytes` (and beyond what live allocations use) to the
  // device; reports the pool afterwards.
  virtual absl::StatusOr<PoolUsage> TrimMemoryPool(int device, uint64_t keep_bytes) {
    return MemoryPoolUsage(device);
  }
  // Start and stop the profiler's capture range (nsys --capture-range=cudaProfilerApi).
  virtual absl::Status StartProfiler() {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", name(), " backend has no profiler capture range"));
  }
  virtual absl::Status StopProfiler() { return StartProfiler(); }
  // Names the work enqueued on this thread until the matching PopRange (NVTX ranges on
  // CUDA), so that a profiler trace shows what each call did. Ranges nest.
  virtual void PushRange(const std::string& name) {}
  virtual void PopRange() {}

  // --- Shared memory and CUDA IPC (server/shared_memory/). The defaults suit a backend
  // whose device memory is host memory, as the CPU backend's: nothing to pin, no IPC.

  // Pins [ptr, ptr + bytes) of host memory (a mapped shared-memory region) for DMA until
  // UnpinHostMemory(ptr), so that CopyFromPinnedHost and CopyToPinnedHost move it in one
  // transfer. `read_only`: the mapping is readable only.
  virtual absl::Status PinHostMemory(void* ptr, uint64_t bytes, bool read_only) {
    return absl::OkStatus();
  }
  virtual void UnpinHostMemory(void* ptr) {}
  // CopyFromHost and CopyToHost for pinned host memory: memory pinned with PinHostMemory,
  // or host staging from AllocateHostStaging.
  virtual absl::Status CopyFromPinnedHost(Stream& stream, const void* src, DeviceMemory& dst,
                                          uint64_t dst_offset, uint64_t bytes) {
    return CopyFromHost(stream, src, dst, dst_offset, bytes);
  }
  virtual absl::Status CopyToPinnedHost(Stream& stream, const DeviceMemory& src,
                                        uint64_t src_offset, void* dst, uint64_t bytes) {
    return CopyToHost(stream, src, src_offset, dst, bytes);
  }
  // Device memory that ExportIpcHandle can export. Allocate's memory may come from a
  // stream-ordered pool, whose allocations cudaIpcGetMemHandle cannot export.
  virtual absl::StatusOr<DeviceMemory> AllocateExportable(int device, uint64_t bytes) {
    return NoCudaIpc();
  }
  // The CUDA IPC handle (the bytes of a cudaIpcMemHandle_t) of memory from
  // AllocateExportable; it maps from the memory's start.
  virtual absl::StatusOr<std::string> ExportIpcHandle(const DeviceMemory& memory) {
    return NoCudaIpc();
  }
  // Maps another process's device allocation from its IPC handle; the mapping closes when
  // the result is destroyed. INVALID_ARGUMENT if the allocation is smaller than `bytes`.
  virtual absl::StatusOr<DeviceMemory> OpenIpcHandle(int device, absl::string_view handle,
                                                     uint64_t bytes) {
    return NoCudaIpc();
  }
  // --- Host staging for transfers. Chunks of uploads and downloads pass through host
  // memory the backend can copy to and from the device at its full speed: pinned memory on
  // CUDA (one DMA, no bounce through the backend's own staging blocks), plain memory on the
  // CPU backend. The defaults suit a backend whose device memory is host memory.

  // Host memory of `bytes` for CopyFromPinnedHost / CopyToPinnedHost, aligned to at least
  // 64 bytes; device() of the result is -1. Allocation may be slow (callers pool it: see
  // HostStagingPool in server/core/host_staging_pool.h).
  virtual absl::StatusOr<DeviceMemory> AllocateHostStaging(uint64_t bytes);

  // --- Health. OK until the backend hits an error after which its devices' state can no
  // longer be trusted (a sticky CUDA error such as an illegal address); from then on the
  // service refuses work rather than serve possibly wrong results. Thread-safe. A backend
  // that can fail answers all three from a BackendHealth (server/core/backend_health.h);
  // the defaults suit one that never does.
  virtual absl::Status health() const { return absl::OkStatus(); }
  // `listener` runs once, on the thread that reports the failure.
  virtual void SetFailureListener(std::function<void(const absl::Status&)> listener) {}
  // Records that the backend is broken; the first report wins.
  virtual void ReportFailure(absl::Status status) {}

 private:
  absl::Status NoCudaIpc() const {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA IPC needs the cuda backend; this server runs the ", name(), " backend"));
  }

};

inline absl::StatusOr<DeviceMemory> Backend::AllocateHostStaging(uint64_t bytes) {
  constexpr size_t kAlignment = 4096;
  void* p = ::operator new(static_cast<size_t>(std::max<uint64_t>(bytes, 1)),
                           std::align_val_t(kAlignment), std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host staging memory"));
  }
  return DeviceMemory(p, bytes, -1, [](void* ptr, uint64_t) {
    ::operator delete(ptr, std::align_val_t(kAlignment));
  });
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_BACKEND_H_

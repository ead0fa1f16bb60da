// The CUDA backend itself: the class behind server/cuda/cuda_backend.h, and the state it
// keeps per GPU. Its definitions are spread by concern: server/cuda/cuda_backend.cc
// (setup, checks, kernel launches), and in server/cuda/detail/ streams.cc (streams and
// completions), memory.cc (the pool), transfers.cc (host copies) and ipc.cc (shared
// memory and CUDA IPC). Private to server/cuda/.
#ifndef GPUCOMPUTE_SERVER_CUDA_DETAIL_CUDA_BACKEND_IMPL_H_
#define GPUCOMPUTE_SERVER_CUDA_DETAIL_CUDA_BACKEND_IMPL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/core/backend.h"
#include "server/core/backend_health.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/streams.h"
#include "kernels/cuda/kernels.h"
#include "server/cuda/pinned_staging.h"
#include "server/cuda/small_block_cache.h"

namespace gpucompute::cuda {

class ElementwiseKernels;
class ReduceKernels;

namespace detail {

// Staging blocks: large ones for transfer chunks, small ones for the few bytes of an
// inline reduction result, so that those never queue behind a large transfer.
inline constexpr uint64_t kLargeBlockBytes = 8 << 20;
inline constexpr uint64_t kSmallBlockBytes = 64 << 10;
inline constexpr size_t kSmallBlocks = 64;

// cudaSetDevice, skipped when the calling thread's current device already is `device`:
// the call takes a driver lock, and submitting one operation would make it several
// times. Every device switch of this backend goes through here, so the cache stays true.
inline cudaError_t SwitchDevice(int device) {
  thread_local int current = -1;
  if (current == device) return cudaSuccess;
  const cudaError_t error = cudaSetDevice(device);
  current = error == cudaSuccess ? device : -1;
  return error;
}

inline char* Bytes(const DeviceMemory& m) { return static_cast<char*>(m.data()); }

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
  // Through the contiguous kernels when every layout is unit-stride after coalescing,
  // else the strided kernel of the layouts' specialisation (kernels/cuda/kernels.h).
  absl::StatusOr<LaunchInfo> ElementwiseStrided(Stream& stream, const expr::Program& program,
                                                std::span<const StridedInput> inputs,
                                                DeviceMemory& out, const StridedLayout& out_layout,
                                                DType out_dtype) override;
  absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype, const DeviceMemory& in,
                      const ReduceShape& shape, DeviceMemory& out) override;
  absl::StatusOr<LaunchInfo> ReduceStrided(Stream& stream, const StridedReduce& reduce,
                                           DeviceMemory& out) override;
  absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                    const DeviceMemory& a, const DeviceMemory& x, double beta,
                    DeviceMemory& y) override;
  absl::Status Random(Stream& stream, const RandomParams& params, DType dtype, DeviceMemory& out,
                      int64_t n) override;
  // cuBLAS GemmEx / GemmStridedBatchedEx (server/cuda/matmul.cc).
  absl::StatusOr<LaunchInfo> Matmul(Stream& stream, DType dtype, const MatmulShape& shape,
                                    double alpha, const DeviceMemory& a, const DeviceMemory& b,
                                    double beta, DeviceMemory& c) override;

  absl::StatusOr<double> PrepareElementwise(const expr::Program& program, DType out_dtype) override;
  PoolUsage MemoryPoolUsage(int device) const override;
  absl::StatusOr<PoolUsage> TrimMemoryPool(int device, uint64_t keep_bytes) override;
  absl::Status StartProfiler() override;
  absl::Status StopProfiler() override;
  absl::Status health() const override { return health_.status(); }
  void SetFailureListener(BackendHealth::Listener listener) override {
    health_.SetFailureListener(std::move(listener));
  }
  void ReportFailure(absl::Status status) override { health_.ReportFailure(std::move(status)); }
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
  absl::Status WarmTransfers(Stream& stream, int device);
  // Hands a callback's event back to sync_events, unless the caller owns it (OnEvent).
  void ReleaseSyncEvent(const CompletionPoller::Callback& callback);
  // Runs a callback whose event completed (a completion poller's FinishFn).
  void FinishCallback(CompletionPoller::Callback callback, cudaError_t error);
  // Fails every pending callback with `status` (the device is unusable).
  void FailPendingCallbacks(const absl::Status& status);
  absl::Status CheckDevice(int device) const;
  // ReduceStrided of an expression (reduce.program set): the fused generated kernels.
  absl::StatusOr<LaunchInfo> ReduceExpression(Stream& stream, const StridedReduce& reduce,
                                              std::span<const StridedOperand> operands,
                                              DeviceMemory& out);
  absl::Status CheckHealthy() const { return health(); }
  // Frees the device's kept small blocks (on its allocation stream; the device is current).
  void FreeSmallBlocks(Device& d);
  // Copies between host and device through staging blocks, one block at a time.
  absl::Status StagedCopy(CudaStream& stream, const char* src, char* dst, uint64_t bytes,
                          bool to_device);

  // Failed for good after a sticky error (Check). First, so that it outlives what the
  // destructor tears down.
  BackendHealth health_;
  std::vector<DeviceDescription> descriptions_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<ElementwiseKernels> elementwise_;
  std::unique_ptr<ReduceKernels> reductions_;
  // Streams are given to the pollers in turn as they are made.
  std::vector<std::unique_ptr<CompletionPoller>> pollers_;
  std::atomic<size_t> next_poller_{0};
};

}  // namespace detail
}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_DETAIL_CUDA_BACKEND_IMPL_H_

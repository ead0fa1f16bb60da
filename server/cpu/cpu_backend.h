// The CPU backend: host memory stands in for device memory, each Stream is a thread
// that runs its work in order, and kernels run data-parallel on a shared ThreadPool.
// It keeps every semantic of the Backend contract, and is the reference the other
// backends are compared against.
#ifndef GPUCOMPUTE_SERVER_CPU_CPU_BACKEND_H_
#define GPUCOMPUTE_SERVER_CPU_CPU_BACKEND_H_

#include <atomic>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/core/backend.h"
#include "server/core/backend_health.h"
#include "server/cpu/block_cache.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {

class CpuBackend final : public Backend {
 public:
  // threads == 0: one per hardware thread.
  explicit CpuBackend(size_t threads = 0);
  ~CpuBackend() override;

  absl::string_view name() const override { return "cpu"; }
  const std::vector<DeviceDescription>& devices() const override { return devices_; }

  absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override;
  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override;

  absl::Status CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst, uint64_t dst_offset,
                            uint64_t bytes) override;
  absl::Status CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset, void* dst,
                          uint64_t bytes) override;
  absl::Status Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset, DeviceMemory& dst,
                    uint64_t dst_offset, uint64_t bytes) override;
  absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                    int64_t count) override;
  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs,
                                         DeviceMemory& out, DType out_dtype, int64_t n) override;
  absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype, const DeviceMemory& in,
                      const ReduceShape& shape, DeviceMemory& out) override;
  absl::StatusOr<LaunchInfo> ReduceStrided(Stream& stream, const StridedReduce& reduce,
                                           DeviceMemory& out) override;
  absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                    const DeviceMemory& a, const DeviceMemory& x, double beta,
                    DeviceMemory& y) override;
  absl::Status Random(Stream& stream, const RandomParams& params, DType dtype, DeviceMemory& out,
                      int64_t n) override;

  // Used: the bytes live allocations asked for; reserved adds the freed blocks kept for
  // reuse (BlockCache), which TrimMemoryPool frees.
  PoolUsage MemoryPoolUsage(int device) const override;
  absl::StatusOr<PoolUsage> TrimMemoryPool(int device, uint64_t keep_bytes) override;
  // A stream's thread runs one operation at a time; one more ready behind it is all it
  // takes to never wait for the executor.
  int DispatchWindow() const override { return 2; }
  // Nothing in this backend fails for good, but a failure may be reported (tests do).
  absl::Status health() const override { return health_.status(); }
  void SetFailureListener(BackendHealth::Listener listener) override {
    health_.SetFailureListener(std::move(listener));
  }
  void ReportFailure(absl::Status status) override { health_.ReportFailure(std::move(status)); }

  // From now on kernels (elementwise, reduce, gemv, random, fill) stop: one running ends
  // after the chunks under way, one not yet started is skipped, and the completion that
  // follows either on its stream reports `status`; copies still run. For the shutdown,
  // once the grace is over: a long CPU operation need not hold it.
  void StopKernels(absl::Status status) override;

  // What the streams share of StopKernels; shared with them, which may outlive the
  // backend's own reference.
  struct KernelStop {
    std::atomic<bool> stopped{false};
    absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
  };

 private:
  // Index of the first minimum (or maximum) of an F-layout rows x cols array in C order,
  // as numpy.argmin gives; NaN counts as the extreme.
  int64_t ArgExtremeInCOrder(bool is_min, DType dtype, const void* data, int64_t rows,
                             int64_t cols);
  // Copies of large ranges are split across the pool.
  void ParallelCopy(void* dst, const void* src, uint64_t bytes);

  BackendHealth health_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<DeviceDescription> devices_;
  // Bytes of live allocations. Shared with their deleters, since memory may outlive
  // the backend.
  std::shared_ptr<std::atomic<uint64_t>> allocated_bytes_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  // Freed large blocks; shared with the deleters as well.
  std::shared_ptr<BlockCache> blocks_;
  const std::shared_ptr<KernelStop> kernel_stop_ = std::make_shared<KernelStop>();
};

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_CPU_BACKEND_H_

#include "server/cpu/cpu_backend.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/config/cgroup_limits.h"
#include "server/cpu/elementwise.h"
#include "server/cpu/kernels.h"
#include "server/cpu/matmul.h"
#include "server/util/thread_name.h"

namespace gpucompute::cpu {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kAlignment = 256;
constexpr uint64_t kMaxCachedBytes = uint64_t{1} << 30;
constexpr int64_t kCopyGrain = 1 << 22;  // bytes per parallel copy chunk

class CpuEvent final : public Event {
 public:
  void Complete() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    time_ = Clock::now();
    done_ = true;
  }
  Clock::time_point WaitDone() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return time_;
  }
  bool IsComplete() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point time_ ABSL_GUARDED_BY(mu_);
};

// A thread draining a FIFO of tasks: the CPU image of a CUDA stream.
class CpuStream final : public Stream {
 public:
  CpuStream(int device, std::shared_ptr<CpuBackend::KernelStop> kernel_stop)
      : device_(device), kernel_stop_(std::move(kernel_stop)), thread_([this] {
          NameThisThread("cpu-stream");
          Run();
        }) {}
  ~CpuStream() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  int device() const override { return device_; }

  absl::Status Wait(std::shared_ptr<Event> event) override {
    auto e = std::dynamic_pointer_cast<CpuEvent>(std::move(event));
    if (e == nullptr) return absl::InvalidArgumentError("event is not from the CPU backend");
    Enqueue([e = std::move(e)] { e->WaitDone(); });
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Event>> Record() override {
    auto event = std::make_shared<CpuEvent>();
    // The task holds the event alive until it fires, so dropping the handle early is safe.
    Enqueue([event] { event->Complete(); });
    return event;
  }

  absl::Status OnComplete(absl::AnyInvocable<void(absl::Status) &&> fn) override {
    Enqueue([this, fn = std::move(fn)]() mutable {
      absl::Status status;
      if (std::exchange(kernel_stopped_, false)) {
        absl::MutexLock lock(&kernel_stop_->mu);
        status = kernel_stop_->status;
      }
      std::move(fn)(std::move(status));
    });
    return absl::OkStatus();
  }

  // Enqueues a kernel, which CpuBackend::StopKernels skips or stops between chunks.
  void EnqueueKernel(absl::AnyInvocable<void() &&> kernel) {
    Enqueue([this, kernel = std::move(kernel)]() mutable {
      const std::atomic<bool>& stopped = kernel_stop_->stopped;
      if (!stopped.load(std::memory_order_acquire)) {
        ThreadPool::StopScope scope(&stopped);
        std::move(kernel)();
      }
      // Read again after: a stop that came while it ran may have cut it short.
      if (stopped.load(std::memory_order_acquire)) kernel_stopped_ = true;
    });
  }

  void Enqueue(absl::AnyInvocable<void() &&> task) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  bool HasTaskOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !tasks_.empty();
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      absl::AnyInvocable<void() &&> task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &CpuStream::HasTaskOrStop));
        // Drain before stopping: queued work may hold callbacks someone waits for.
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::move(task)();
    }
  }

  const int device_;
  const std::shared_ptr<CpuBackend::KernelStop> kernel_stop_;
  // A kernel was skipped or stopped since the last completion: the next one reports it.
  // Only the stream's thread touches it.
  bool kernel_stopped_ = false;
  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the queue exists
};

CpuStream& AsCpu(Stream& stream) { return static_cast<CpuStream&>(stream); }

char* Bytes(const DeviceMemory& m) { return static_cast<char*>(m.data()); }

uint64_t PhysicalMemoryBytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return 0;
  // In a container, the container's memory, not the host's.
  return LimitedMemoryBytes(static_cast<uint64_t>(info.totalram) * info.mem_unit,
                            ReadCgroupLimits());
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "CPU";
}

}  // namespace

CpuBackend::CpuBackend(size_t threads)
    : pool_(std::make_unique<ThreadPool>(
          threads != 0 ? threads : LimitedThreadCount(AvailableProcessors(), ReadCgroupLimits()))) {
  DeviceDescription d;
  d.index = 0;
  d.name = CpuModelName();
  d.total_memory_bytes = PhysicalMemoryBytes();
  d.compute_units = static_cast<int>(pool_->size());
  devices_.push_back(d);
  // A sixteenth of the memory, at most 1 GiB: room for the arrays of a few shapes
  // without holding much that nothing asks for again (`trim` returns it).
  blocks_ =
      std::make_shared<BlockCache>(std::min<uint64_t>(d.total_memory_bytes / 16, kMaxCachedBytes));
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::StopKernels(absl::Status status) {
  {
    absl::MutexLock lock(&kernel_stop_->mu);
    kernel_stop_->status = std::move(status);
  }
  kernel_stop_->stopped.store(true, std::memory_order_release);
}

absl::StatusOr<DeviceMemory> CpuBackend::Allocate(int device, uint64_t bytes) {
  if (device != 0) return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  // aligned_alloc needs a size that is a multiple of the alignment, and a non-zero one.
  const uint64_t rounded =
      bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes) return absl::ResourceExhaustedError("allocation size overflows");
  void* p = blocks_->Take(rounded);
  if (p == nullptr) p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr && blocks_->cached_bytes() > 0) {
    // Out of memory: the blocks kept for reuse go back, and the allocation is tried again.
    blocks_->Trim(0);
    p = std::aligned_alloc(kAlignment, rounded);
  }
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", bytes, " bytes"));
  }
  allocated_bytes_->fetch_add(bytes, std::memory_order_relaxed);
  return DeviceMemory(p, bytes, device,
                      [allocated = allocated_bytes_, blocks = blocks_, rounded](void* ptr,
                                                                                uint64_t size) {
                        blocks->Give(ptr, rounded);
                        allocated->fetch_sub(size, std::memory_order_relaxed);
                      });
}

PoolUsage CpuBackend::MemoryPoolUsage(int device) const {
  if (device != 0) return {};
  const uint64_t bytes = allocated_bytes_->load(std::memory_order_relaxed);
  return PoolUsage{bytes + blocks_->cached_bytes(), bytes};
}

absl::StatusOr<PoolUsage> CpuBackend::TrimMemoryPool(int device, uint64_t keep_bytes) {
  if (device != 0) return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  const uint64_t used = allocated_bytes_->load(std::memory_order_relaxed);
  // Like the CUDA pool: what live allocations use is never returned.
  blocks_->Trim(keep_bytes > used ? keep_bytes - used : 0);
  return MemoryPoolUsage(device);
}

absl::StatusOr<std::unique_ptr<Stream>> CpuBackend::CreateStream(int device) {
  if (device != 0) return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  // Each stream is a thread, which the system may refuse (a thread or address-space
  // limit): that is the caller's RESOURCE_EXHAUSTED, not the server's end.
  try {
    return std::make_unique<CpuStream>(device, kernel_stop_);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the thread of a CPU stream: ", e.what()));
  }
}

absl::StatusOr<double> CpuBackend::ElapsedSeconds(const Event& start, const Event& end) {
  const auto* s = dynamic_cast<const CpuEvent*>(&start);
  const auto* e = dynamic_cast<const CpuEvent*>(&end);
  if (s == nullptr || e == nullptr)
    return absl::InvalidArgumentError("event is not from the CPU backend");
  if (!s->IsComplete() || !e->IsComplete())
    return absl::FailedPreconditionError("event has not completed");
  return std::chrono::duration<double>(e->WaitDone() - s->WaitDone()).count();
}

int64_t CpuBackend::ArgExtremeInCOrder(bool is_min, DType dtype, const void* data, int64_t rows,
                                       int64_t cols) {
  return VisitDType(dtype, [&](auto zero) -> int64_t {
    using T = decltype(zero);
    using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    const auto* a = static_cast<const Stored*>(data);
    auto value = [&](int64_t r, int64_t c) -> T {
      if constexpr (std::is_same_v<T, bool>) {
        return a[c * rows + r] != 0;
      } else {
        return a[c * rows + r];
      }
    };
    // Each chunk of rows is a contiguous range of C-order indices; its first extreme
    // (or first NaN, which counts as the extreme) is combined with the others in order.
    constexpr int64_t kRowsPerChunk = 64;
    const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
    std::vector<int64_t> best(chunks);
    std::vector<T> best_value(chunks);
    std::vector<uint8_t> best_nan(chunks);
    pool_->ParallelFor(rows, kRowsPerChunk, [&](int64_t begin, int64_t end) {
      const int64_t chunk = begin / kRowsPerChunk;
      int64_t bi = begin * cols;
      T bv = value(begin, 0);
      bool nan = false;
      for (int64_t r = begin; r < end && !nan; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const T v = value(r, c);
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(v)) {
              bi = r * cols + c;
              bv = v;
              nan = true;
              break;
            }
          }
          if (is_min ? v < bv : bv < v) {
            bv = v;
            bi = r * cols + c;
          }
        }
      }
      best[chunk] = bi;
      best_value[chunk] = bv;
      best_nan[chunk] = nan;
    });
    int64_t result = best[0];
    T result_value = best_value[0];
    for (int64_t k = 0; k < chunks; ++k) {
      if (best_nan[k]) return best[k];  // no earlier chunk had a NaN
      if (is_min ? best_value[k] < result_value : result_value < best_value[k]) {
        result = best[k];
        result_value = best_value[k];
      }
    }
    return result;
  });
}

void CpuBackend::ParallelCopy(void* dst, const void* src, uint64_t bytes) {
  if (dst == src) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  pool_->ParallelFor(static_cast<int64_t>(bytes), kCopyGrain, [&](int64_t begin, int64_t end) {
    std::memmove(d + begin, s + begin, end - begin);
  });
}

absl::Status CpuBackend::CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst,
                                      uint64_t dst_offset, uint64_t bytes) {
  char* d = Bytes(dst) + dst_offset;
  AsCpu(stream).Enqueue([this, d, src, bytes] { ParallelCopy(d, src, bytes); });
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                    void* dst, uint64_t bytes) {
  const char* s = Bytes(src) + src_offset;
  AsCpu(stream).Enqueue([this, s, dst, bytes] { ParallelCopy(dst, s, bytes); });
  return absl::OkStatus();
}

absl::Status CpuBackend::Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                              DeviceMemory& dst, uint64_t dst_offset, uint64_t bytes) {
  const char* s = Bytes(src) + src_offset;
  char* d = Bytes(dst) + dst_offset;
  AsCpu(stream).Enqueue([this, s, d, bytes] { ParallelCopy(d, s, bytes); });
  return absl::OkStatus();
}

absl::Status CpuBackend::Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                              int64_t count) {
  char* d = Bytes(dst);
  AsCpu(stream).EnqueueKernel([this, d, dtype, value_bits, count] {
    VisitDType(dtype, [&](auto zero) {
      using T = std::conditional_t<std::is_same_v<decltype(zero), bool>, uint8_t, decltype(zero)>;
      T value;
      std::memcpy(&value, &value_bits, sizeof(T));
      T* out = reinterpret_cast<T*>(d);
      pool_->ParallelFor(count, kCopyGrain / sizeof(T), [&](int64_t begin, int64_t end) {
        std::fill(out + begin, out + end, value);
      });
    });
  });
  return absl::OkStatus();
}

absl::StatusOr<LaunchInfo> CpuBackend::Elementwise(Stream& stream, const expr::Program& program,
                                                   std::span<const DeviceMemory* const> inputs,
                                                   DeviceMemory& out, DType out_dtype, int64_t n) {
  std::vector<const void*> ptrs;
  ptrs.reserve(inputs.size());
  for (const DeviceMemory* m : inputs) ptrs.push_back(m == nullptr ? nullptr : m->data());
  void* o = out.data();
  // The Program is copied into the task: the caller's may not outlive the enqueue.
  AsCpu(stream).EnqueueKernel([this, program, ptrs = std::move(ptrs), o, out_dtype, n] {
    EvaluateElementwise(program, ptrs, o, out_dtype, n, *pool_);
  });
  return LaunchInfo{};
}

absl::StatusOr<LaunchInfo> CpuBackend::ElementwiseStrided(Stream& stream,
                                                          const expr::Program& program,
                                                          std::span<const StridedInput> inputs,
                                                          DeviceMemory& out,
                                                          const StridedLayout& out_layout,
                                                          DType out_dtype) {
  std::vector<StridedArray> arrays;
  arrays.reserve(inputs.size());
  for (const StridedInput& in : inputs) {
    arrays.push_back({in.memory == nullptr ? nullptr : in.memory->data(), in.layout});
  }
  AsCpu(stream).EnqueueKernel([this, program, arrays = std::move(arrays), o = out.data(),
                               out_layout, out_dtype] {
    EvaluateElementwiseStrided(program, arrays, o, out_layout, out_dtype, *pool_);
  });
  return LaunchInfo{};
}

absl::Status CpuBackend::Reduce(Stream& stream, ReduceKind kind, DType in_dtype,
                                const DeviceMemory& in, const ReduceShape& shape,
                                DeviceMemory& out) {
  if (!IsShapeReduceKind(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ReduceKindName(kind), " reductions take ReduceStrided, not a ReduceShape"));
  }
  const void* i = in.data();
  void* o = out.data();
  const bool arg = kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax;
  AsCpu(stream).EnqueueKernel([this, kind, in_dtype, i, shape, o, arg] {
    if (arg && shape.f_order_rows > 0) {
      *static_cast<int64_t*>(o) =
          ArgExtremeInCOrder(kind == ReduceKind::kArgmin, in_dtype, i, shape.f_order_rows,
                             shape.extent / shape.f_order_rows);
    } else {
      cpu::Reduce(kind, in_dtype, i, shape, o, *pool_);
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<LaunchInfo> CpuBackend::ReduceStrided(Stream& stream, const StridedReduce& reduce,
                                                     DeviceMemory& out) {
  std::vector<StridedOperand> inputs;
  inputs.reserve(reduce.inputs.size());
  for (const StridedInput& in : reduce.inputs) {
    inputs.push_back({in.memory == nullptr ? nullptr : in.memory->data(), in.layout});
  }
  // The Program is copied into the task: the caller's may not outlive the enqueue.
  std::optional<expr::Program> program;
  if (reduce.program != nullptr) program = *reduce.program;
  AsCpu(stream).EnqueueKernel([this, kind = reduce.kind, dtype = reduce.dtype,
                               program = std::move(program), inputs = std::move(inputs),
                               shape = reduce.shape, axes = reduce.axes, ddof = reduce.ddof,
                               o = out.data()] {
    cpu::ReduceStrided(kind, dtype, program.has_value() ? &*program : nullptr, inputs, shape, axes,
                       ddof, o, *pool_);
  });
  return LaunchInfo{};
}

absl::Status CpuBackend::Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                              const DeviceMemory& a, const DeviceMemory& x, double beta,
                              DeviceMemory& y) {
  const void* pa = a.data();
  const void* px = x.data();
  void* py = y.data();
  AsCpu(stream).EnqueueKernel([this, dtype, shape, alpha, pa, px, beta, py] {
    cpu::Gemv(dtype, shape, alpha, pa, px, beta, py, *pool_);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Random(Stream& stream, const RandomParams& params, DType dtype,
                                DeviceMemory& out, int64_t n) {
  void* o = out.data();
  AsCpu(stream).EnqueueKernel(
      [this, params, dtype, o, n] { cpu::Random(params, dtype, o, n, *pool_); });
  return absl::OkStatus();
}

absl::StatusOr<LaunchInfo> CpuBackend::Matmul(Stream& stream, DType dtype,
                                              const MatmulShape& shape, double alpha,
                                              const DeviceMemory& a, const DeviceMemory& b,
                                              double beta, DeviceMemory& c) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul takes float32 or float64, not ", DTypeName(dtype)));
  }
  if (absl::Status loaded = LoadOpenBlas(); !loaded.ok()) return loaded;
  constexpr int64_t kBlasMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {shape.k, shape.a.row_stride, shape.a.col_stride, shape.b.row_stride,
                    shape.b.col_stride, shape.c.row_stride, shape.c.col_stride}) {
    if (v > kBlasMax) {
      return absl::OutOfRangeError(absl::StrCat(
          "matmul on the CPU backend takes an inner dimension and leading dimensions up to ",
          kBlasMax, " (its BLAS has 32-bit sizes); got ", v));
    }
  }
  const void* pa = a.data();
  const void* pb = b.data();
  void* pc = c.data();
  AsCpu(stream).EnqueueKernel([this, dtype, shape, alpha, pa, pb, beta, pc] {
    cpu::Matmul(dtype, shape, alpha, pa, pb, beta, pc, *pool_);
  });
  return LaunchInfo{};
}

}  // namespace gpucompute::cpu

// The CUDA backend's public face (server/cuda/cuda_backend.h) and the backend's setup,
// checks and kernel launches; the rest of it is in server/cuda/detail/.
#include "server/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/kernels.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/cuda/elementwise_kernels.h"
#include "server/cuda/reduce_codegen.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {
namespace detail {

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
  int caller_device = 0;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaGetDevice(&caller_device));
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
  reductions_ = std::make_unique<ReduceKernels>(options.kernel_cache_dir);
  // A poller per four cores, at most four: enough that sessions on many streams are
  // not answered one at a time, few enough that their spinning costs little.
  const size_t pollers = std::clamp<size_t>(std::thread::hardware_concurrency() / 4, 1, 4);
  for (size_t i = 0; i < pollers; ++i) {
    pollers_.push_back(std::make_unique<CompletionPoller>(
        [this](CompletionPoller::Callback c, cudaError_t e) { FinishCallback(std::move(c), e); }));
  }
  // Setting up and warming each device makes it current in turn: leave the caller's
  // current device as it found it (raw runtime calls on that thread, such as a test's
  // cudaMemcpy, go to the current device).
  for (const auto& device : devices_) {
    RETURN_IF_ERROR(WarmUp(device->index));
  }
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaSetDevice(caller_device));
  return absl::OkStatus();
}

absl::Status CudaBackend::WarmUp(int device) {
  // The CUDA runtime loads each kernel on its first launch, and cuBLAS sets up on its first
  // call: time that would land on a client's first gemv or reduction (and in its device
  // time). Paying it here keeps it off every request.
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
    ASSIGN_OR_RETURN(DeviceMemory c, Allocate(device, kN * kN * DTypeSize(dtype)));
    MatmulShape square;
    square.m = square.n = square.k = kN;
    square.a = square.b = square.c = MatrixLayout{0, kN, 1, 0};
    RETURN_IF_ERROR(Matmul(*stream, dtype, square, 1.0, a, a, 0.0, c).status());
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(AsCuda(*stream).get()));
  }
  return WarmTransfers(*stream, device);
}

absl::Status CudaBackend::WarmTransfers(Stream& stream, int device) {
  // Each device's first copy from or to the host sets up its DMA path and staging blocks,
  // which took milliseconds on a device other than the default one, where the server's
  // copy-ceiling probe does not reach. Every path an upload or a download takes is run once: the small and the
  // large staging blocks (pageable host memory), host staging (pinned), and a copy
  // within the device.
  constexpr uint64_t kLarge = kSmallBlockBytes + 4096;  // past the small blocks
  ASSIGN_OR_RETURN(DeviceMemory dev, Allocate(device, 2 * kLarge));
  ASSIGN_OR_RETURN(DeviceMemory pinned, AllocateHostStaging(kLarge));
  std::vector<char> pageable(kLarge, 1);
  for (uint64_t bytes : {uint64_t{64}, kLarge}) {
    RETURN_IF_ERROR(CopyFromHost(stream, pageable.data(), dev, 0, bytes));
    RETURN_IF_ERROR(CopyToHost(stream, dev, 0, pageable.data(), bytes));
  }
  RETURN_IF_ERROR(CopyFromPinnedHost(stream, pinned.data(), dev, 0, kLarge));
  RETURN_IF_ERROR(CopyToPinnedHost(stream, dev, 0, pinned.data(), kLarge));
  RETURN_IF_ERROR(Copy(stream, dev, 0, dev, kLarge, kLarge));
  // Staged downloads copy out of their blocks on CUDA's callback thread: `pageable` must
  // outlive them.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(AsCuda(stream).get()));
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
  reductions_.reset();
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

absl::Status CudaBackend::StartProfiler() {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaProfilerStart());
  return absl::OkStatus();
}

absl::Status CudaBackend::StopProfiler() {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaProfilerStop());
  return absl::OkStatus();
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

absl::StatusOr<LaunchInfo> CudaBackend::ElementwiseStrided(Stream& stream,
                                                           const expr::Program& program,
                                                           std::span<const StridedInput> inputs,
                                                           DeviceMemory& out,
                                                           const StridedLayout& out_layout,
                                                           DType out_dtype) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  const Device& d = *devices_[stream.device()];
  if (inputs.size() != program.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("the program has ", program.inputs().size(),
                                                   " inputs but ", inputs.size(), " were given"));
  }
  if (const std::vector<int64_t> index_axes = expr::IndexAxes(program.ir()); !index_axes.empty()) {
    // index(k) reads the coordinates along axis k from an int64 array in device memory
    // (expr::IndexAsInputs), so the kernels' templates, and the kernels of expressions
    // without index(), stay as they are. One allocation holds every axis's coordinates,
    // written on the device.
    std::vector<std::pair<int, int64_t>> axis_offsets;
    int64_t total = 0;
    for (int64_t k : index_axes) {
      const int axis = expr::ResolveIndexAxis(k, out_layout.ndim());
      if (axis < 0 || axis >= out_layout.ndim()) {
        return absl::InvalidArgumentError(absl::StrCat("index(", k, ") names no axis of a rank ",
                                                       out_layout.ndim(), " result"));
      }
      axis_offsets.push_back({axis, total});
      total += out_layout.shape[axis];  // each at most the result's element count
    }
    cudaStream_t cuda_stream = AsCuda(stream).get();
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(total, 1)) * sizeof(int64_t);
    void* p = nullptr;
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check,
                                        cudaMallocFromPoolAsync(&p, bytes, d.pool, cuda_stream));
    // Freed in stream order, after the kernel that reads it, whatever happens below.
    const DeviceMemory memory(p, bytes, stream.device(), [cuda_stream](void* ptr, uint64_t) {
      LogIfFailed(cudaFreeAsync(ptr, cuda_stream), "cudaFreeAsync(coordinates)");
    });
    for (const auto& [axis, offset] : axis_offsets) {
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
          Check, IotaAsync(static_cast<int64_t*>(p) + offset, out_layout.shape[axis], cuda_stream));
    }
    std::vector<StridedInput> all(inputs.begin(), inputs.end());
    for (const auto& [axis, offset] : axis_offsets) {
      StridedLayout layout = CoordinatesLayout(out_layout.shape, axis);
      layout.offset = offset;
      all.push_back({&memory, std::move(layout)});
    }
    return ElementwiseStrided(stream, expr::IndexAsInputs(program), all, out, out_layout,
                              out_dtype);
  }
  // The layouts arrive coalesced (backend.h); any layout is computed right all the same.
  std::vector<StridedLayout> layouts;
  std::vector<StridedLayout*> arrays_layouts;  // those of arrays, and the output's
  for (const StridedInput& input : inputs) layouts.push_back(input.layout);
  layouts.push_back(out_layout);
  int64_t elements = 1;
  for (int64_t extent : out_layout.shape) elements *= extent;
  for (size_t k = 0; k < layouts.size(); ++k) {
    const StridedLayout& l = layouts[k];
    if (k < inputs.size() && inputs[k].memory == nullptr) continue;
    if (l.shape != out_layout.shape || l.strides.size() != l.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an array's layout has shape (", absl::StrJoin(l.shape, ", "), ") and ",
          l.strides.size(), " strides; the operation's shape is (",
          absl::StrJoin(out_layout.shape, ", "), ")"));
    }
    arrays_layouts.push_back(&layouts[k]);
  }
  LaunchInfo info;
  if (elements == 0) return info;
  std::vector<int64_t> shape = out_layout.shape;
  if (shape.empty()) {
    // One element: a 1-D layout of it, which the contiguous kernels take.
    shape = {1};
    for (StridedLayout* layout : arrays_layouts) layout->strides = {1};
  }
  const int dims = static_cast<int>(shape.size());
  if (dims > kElementwiseMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the strided elementwise operation has ", dims, " axes after merging those that allow it; "
        "the CUDA backend handles at most ", kElementwiseMaxDims));
  }
  auto data = [](const DeviceMemory* memory) -> const char* {
    return memory == nullptr ? nullptr : static_cast<const char*>(memory->data());
  };
  auto to_array = [&](const char* base, const StridedLayout& layout) {
    StridedArray array;
    array.data = base;
    if (base == nullptr) return array;  // a scalar input: its layout means nothing
    array.offset = layout.offset;
    std::copy(layout.strides.begin(), layout.strides.end(), array.strides);
    return array;
  };
  const StridedArray out_array = to_array(Bytes(out), layouts.back());
  std::vector<StridedArray> arrays;
  for (size_t k = 0; k < inputs.size(); ++k) {
    arrays.push_back(to_array(data(inputs[k].memory), layouts[k]));
  }
  auto launched = [&](absl::Status s) -> absl::StatusOr<LaunchInfo> {
    if (!s.ok()) {
      // A launch error may be sticky; the launcher reports it as a status only.
      Check(cudaPeekAtLastError(), "elementwise launch", __FILE__, __LINE__).IgnoreError();
      return s;
    }
    return info;
  };

  // Every array unit-stride along one axis, or an input of one element (stride 0, a 0-d
  // array): the contiguous kernels, from each array's first element, the 0-d ones read
  // once per thread as a parameter is.
  const bool contiguous =
      dims == 1 && layouts.back().strides[0] == 1 &&
      std::all_of(arrays_layouts.begin(), arrays_layouts.end(),
                  [](const StridedLayout* l) { return l->strides[0] == 1 || l->strides[0] == 0; });
  if (contiguous) {
    std::vector<bool> constant_arrays;  // parallel to the program's array inputs
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (std::holds_alternative<expr::ArrayInput>(program.input_types()[k])) {
        constant_arrays.push_back(inputs[k].memory != nullptr && layouts[k].strides[0] == 0);
      }
    }
    ASSIGN_OR_RETURN(const CompiledElementwise* kernel,
                     elementwise_->Get(program, out_dtype, d.compute_capability,
                                       &info.compile_seconds, constant_arrays));
    std::vector<const void*> pointers;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const auto* array = std::get_if<expr::ArrayInput>(&program.input_types()[k]);
      pointers.push_back(array == nullptr || arrays[k].data == nullptr
                             ? nullptr
                             : data(inputs[k].memory) + arrays[k].offset * DTypeSize(array->dtype));
    }
    return launched(LaunchElementwise(*kernel, program, pointers,
                                      Bytes(out) + out_array.offset * DTypeSize(out_dtype),
                                      shape[0], d.sm_count, AsCuda(stream).get()));
  }
  const StridedSpecialization spec = SpecializationOf(program, arrays, out_array, shape, out_dtype);
  ASSIGN_OR_RETURN(const CompiledStridedElementwise* kernel,
                   elementwise_->GetStrided(program, out_dtype, spec, d.compute_capability,
                                            &info.compile_seconds));
  return launched(LaunchElementwiseStrided(*kernel, program, arrays, out_array, shape, d.sm_count,
                                           AsCuda(stream).get()));
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

absl::StatusOr<LaunchInfo> CudaBackend::ReduceStrided(Stream& stream, const StridedReduce& reduce,
                                                      DeviceMemory& out) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  const Device& d = *devices_[stream.device()];
  std::vector<StridedOperand> operands;
  for (const StridedInput& input : reduce.inputs) {
    if (input.memory == nullptr) continue;  // a scalar of the program
    if (input.layout.shape != reduce.shape) {
      return absl::InvalidArgumentError(
          "a strided reduction's inputs must have the shape of its iteration space");
    }
    operands.push_back({input.memory->data(), input.layout.strides, input.layout.offset});
  }
  if (reduce.program == nullptr) {
    if (operands.size() != 1) {
      return absl::InvalidArgumentError("a reduction without an expression reads one array");
    }
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
        Check, ReduceStridedAsync(reduce.kind, reduce.dtype, reduce.shape, reduce.axes,
                                  operands[0], reduce.ddof, out.data(), d.pool,
                                  AsCuda(stream).get()));
    return LaunchInfo{};
  }
  return ReduceExpression(stream, reduce, operands, out);
}

absl::StatusOr<LaunchInfo> CudaBackend::ReduceExpression(Stream& stream,
                                                         const StridedReduce& reduce,
                                                         std::span<const StridedOperand> operands,
                                                         DeviceMemory& out) {
  const Device& d = *devices_[stream.device()];
  LaunchInfo info;
  ASSIGN_OR_RETURN(const CompiledReduction* kernels,
                   reductions_->Get(*reduce.program, reduce.kind, d.compute_capability,
                                    &info.compile_seconds));
  absl::Status s =
      LaunchReduction(*kernels, reduce, operands, out.data(), d.pool, AsCuda(stream).get());
  if (!s.ok()) {
    // A launch error may be sticky; the launcher reports it as a status only.
    Check(cudaPeekAtLastError(), "reduction launch", __FILE__, __LINE__).IgnoreError();
    return s;
  }
  return info;
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
  absl::MutexLock lock(&d.cublas_mu);
  if (d.cublas == nullptr) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cublasCreate(&d.cublas));
    // Host scalars; no atomics, so results are deterministic run to run.
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cublasSetPointerMode(d.cublas, CUBLAS_POINTER_MODE_HOST));
  }
  const GemvStatus result = GemvAsync(d.cublas, dtype, shape, alpha, a.data(), x.data(), beta,
                                      y.data(), AsCuda(stream).get());
  if (result.ok()) return absl::OkStatus();
  if (result.cuda != cudaSuccess) return Check(result.cuda, result.call, __FILE__, __LINE__);
  absl::Status status = CudaStatus(result.cublas, result.call, __FILE__, __LINE__);
  // A failed launch may leave a sticky error, which cuBLAS reports as a status only.
  Check(cudaPeekAtLastError(), "gemv launch", __FILE__, __LINE__).IgnoreError();
  return status;
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

}  // namespace detail

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<detail::CudaBackend> backend, detail::CudaBackend::Create(options));
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
  auto* cuda = dynamic_cast<detail::CudaBackend*>(&backend);
  if (cuda == nullptr) return absl::InvalidArgumentError("not a CUDA backend");
  return cuda->InjectIllegalAddress(device);
}

}  // namespace gpucompute::cuda

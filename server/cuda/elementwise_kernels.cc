#include "server/cuda/elementwise_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/cuda/cuda_check.h"
#include "server/expression/ir.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {
namespace {

// Resident blocks per SM when the runtime cannot say: 8 blocks of 256 threads fill an
// SM's 2048 thread slots on sm_80/sm_90.
constexpr int64_t kBlocksPerSm = 8;
constexpr int64_t kWaves = 4;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool Overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A parameter's value as the kernel argument's bytes (the DType's storage type).
uint64_t ParameterBits(DType dtype, const expr::ConstantValue& v) {
  uint64_t bits = 0;
  switch (dtype) {
    case DType::kBool: {
      const uint8_t x = v.i != 0;
      std::memcpy(&bits, &x, sizeof(x));
      break;
    }
    case DType::kInt32: {
      const auto x = static_cast<int32_t>(v.i);
      std::memcpy(&bits, &x, sizeof(x));
      break;
    }
    case DType::kInt64:
      std::memcpy(&bits, &v.i, sizeof(v.i));
      break;
    case DType::kFloat32: {
      const auto x = static_cast<float>(v.f);
      std::memcpy(&bits, &x, sizeof(x));
      break;
    }
    case DType::kFloat64:
      std::memcpy(&bits, &v.f, sizeof(v.f));
      break;
  }
  return bits;
}

// How many blocks of `threads` fit on one SM at once (registers and shared memory
// decide); kBlocksPerSm when the runtime cannot tell. The grid is kWaves times that:
// blocks that finish early take the next from the hardware's queue, which evens out SMs
// that run slower (math-bound expressions diverge in their slow paths), as the
// hand-written kernels in kernels/ do with their grids.
int ResidentBlocksPerSm(cudaKernel_t kernel, int threads) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel),
                                                    threads, 0) != cudaSuccess ||
      blocks <= 0) {
    cudaGetLastError();
    return static_cast<int>(kBlocksPerSm);
  }
  return blocks;
}

absl::Status LaunchKernel(const CompiledElementwise& kernel, std::vector<const void*>& arrays,
                          void* out, int64_t n, std::vector<uint64_t>& parameters, int sm_count,
                          cudaStream_t stream) {
  const ElementwiseSignature& sig = kernel.signature;
  bool aligned = Aligned16(out);
  for (const void* p : arrays) aligned = aligned && Aligned16(p);
  const int64_t per_thread =
      aligned ? int64_t{sig.elements_per_pack} * sig.packs_per_thread : int64_t{1};
  const int64_t threads = sig.threads_per_block;
  const int64_t work = (n + per_thread - 1) / per_thread;  // thread-iterations needed
  const int64_t blocks_per_sm = aligned ? kernel.vector_blocks_per_sm : kernel.scalar_blocks_per_sm;
  const int64_t blocks = std::max<int64_t>(
      1, std::min((work + threads - 1) / threads, int64_t{sm_count} * blocks_per_sm * kWaves));

  std::vector<void*> args;
  args.reserve(arrays.size() + 2 + parameters.size());
  for (const void*& p : arrays) args.push_back(&p);
  args.push_back(&out);
  args.push_back(&n);
  for (uint64_t& p : parameters) args.push_back(&p);
  const cudaKernel_t function = aligned ? kernel.vector_kernel : kernel.scalar_kernel;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(
      cudaLaunchKernel(reinterpret_cast<const void*>(function), dim3(static_cast<unsigned>(blocks)),
                       dim3(static_cast<unsigned>(threads)), args.data(), 0, stream));
  return absl::OkStatus();
}

}  // namespace

struct ElementwiseKernels::Slot {
  absl::Notification done;
  // Written once, before `done` is notified; read only after.
  absl::Status status;
  std::unique_ptr<CompiledElementwise> kernel;
};

size_t ElementwiseKernels::KeyHash::Hash(const KeyView& k) {
  return absl::Hash<std::tuple<absl::string_view, DType, int>>()(
      std::make_tuple(k.canonical, k.out_dtype, k.arch));
}

ElementwiseKernels::ElementwiseKernels(std::string disk_cache_dir)
    : compiler_(std::move(disk_cache_dir)) {}

ElementwiseKernels::~ElementwiseKernels() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, slot] : slots_) {
    if (!slot->done.HasBeenNotified() || slot->kernel == nullptr) continue;
    const cudaError_t error = cudaLibraryUnload(slot->kernel->library);
    // At process exit the runtime may already be gone, taking the libraries with it.
    if (error != cudaErrorCudartUnloading)
      LogIfFailed(error, "cudaLibraryUnload of an elementwise kernel");
  }
}

absl::StatusOr<const CompiledElementwise*> ElementwiseKernels::Get(const expr::Program& program,
                                                                   DType out_dtype, int arch,
                                                                   double* compile_seconds) {
  if (compile_seconds != nullptr) *compile_seconds = 0;
  const KeyView key{program.canonical(), out_dtype, arch};
  std::shared_ptr<Slot> slot;
  bool build = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      // Set under the lock once built, and never taken back: the common case ends here.
      if (it->second->kernel != nullptr) return it->second->kernel.get();
    } else {
      it =
          slots_.emplace(Key{std::string(key.canonical), out_dtype, arch}, std::make_shared<Slot>())
              .first;
      build = true;
    }
    slot = it->second;
  }
  const auto start = std::chrono::steady_clock::now();
  if (!build) {
    const bool hit = slot->done.HasBeenNotified();
    slot->done.WaitForNotification();
    if (!hit && compile_seconds != nullptr) *compile_seconds = SecondsSince(start);
    RETURN_IF_ERROR(slot->status);
    return slot->kernel.get();
  }

  // This call builds; concurrent callers of the same key wait on `slot->done`.
  auto kernel = std::make_unique<CompiledElementwise>();
  absl::Status status = [&]() -> absl::Status {
    ElementwiseSource generated = GenerateElementwise(program, out_dtype);
    if (generated.signature.argument_bytes > kMaxElementwiseArgumentBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the expression needs ", generated.signature.argument_bytes,
                       " bytes of CUDA kernel arguments (", generated.signature.array_inputs.size(),
                       " arrays, ", generated.signature.parameter_dtypes.size(),
                       " uses of scalar inputs); at most ", kMaxElementwiseArgumentBytes,
                       " are supported. Use fewer scalar inputs, or pass some values as arrays."));
    }
    ASSIGN_OR_RETURN(const std::string cubin, compiler_.Compile(generated.source, arch));
    kernel->canonical = program.canonical();
    kernel->out_dtype = out_dtype;
    kernel->arch = arch;
    kernel->signature = std::move(generated.signature);
    // The runtime copies the image (cudaLibraryBinaryIsPreserved is not set), so the
    // CUBIN need not outlive the call.
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryLoadData(&kernel->library, cubin.data(), nullptr,
                                                        nullptr, 0, nullptr, nullptr, 0));
    absl::Status found = [&]() -> absl::Status {
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryGetKernel(&kernel->vector_kernel, kernel->library,
                                                           generated.vector_kernel.c_str()));
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryGetKernel(&kernel->scalar_kernel, kernel->library,
                                                           generated.scalar_kernel.c_str()));
      kernel->vector_blocks_per_sm =
          ResidentBlocksPerSm(kernel->vector_kernel, kernel->signature.threads_per_block);
      kernel->scalar_blocks_per_sm =
          ResidentBlocksPerSm(kernel->scalar_kernel, kernel->signature.threads_per_block);
      return absl::OkStatus();
    }();
    if (!found.ok()) {
      cudaLibraryUnload(kernel->library);
      kernel->library = nullptr;
    }
    return found;
  }();

  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      slot->kernel = std::move(kernel);
    } else {
      slot->status = status;
      slots_.erase(key);  // not remembered: a later call tries again
    }
  }
  slot->done.Notify();
  if (compile_seconds != nullptr) *compile_seconds = SecondsSince(start);
  RETURN_IF_ERROR(status);
  return slot->kernel.get();
}

absl::Status LaunchElementwise(const CompiledElementwise& kernel, const expr::Program& program,
                               std::span<const void* const> inputs, void* out, int64_t n,
                               int sm_count, cudaStream_t stream) {
  if (program.canonical() != kernel.canonical) {
    return absl::InvalidArgumentError(absl::StrCat("the compiled elementwise kernel is for ",
                                                   kernel.canonical, ", not for the program ",
                                                   program.canonical()));
  }
  if (inputs.size() != program.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("the program has ", program.inputs().size(),
                                                   " inputs but ", inputs.size(),
                                                   " pointers were given"));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative element count ", n));
  if (sm_count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sm_count must be positive, got ", sm_count));
  }
  if (n == 0) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("the output pointer is null");
  // Byte sizes below are at most 8n; larger n cannot be memory anyway.
  if (n > std::numeric_limits<int64_t>::max() / 16) {
    return absl::InvalidArgumentError(absl::StrCat("element count ", n, " is too large"));
  }

  const ElementwiseSignature& sig = kernel.signature;
  std::vector<const void*> arrays(sig.array_inputs.size());
  for (size_t a = 0; a < arrays.size(); ++a) {
    arrays[a] = inputs[sig.array_inputs[a]];
    if (arrays[a] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input '",
                                                     program.inputs()[sig.array_inputs[a]],
                                                     "' is an array but its pointer is null"));
    }
  }
  std::vector<uint64_t> parameters(sig.parameter_dtypes.size());
  size_t found = 0;
  for (const expr::Node& node : program.ir().nodes) {
    if (node.op != expr::OpKind::kConstant || node.parameter < 0) continue;
    // Same canonical() implies the same parameters; checked anyway, since a mismatch
    // would pass garbage to the kernel.
    if (static_cast<size_t>(node.parameter) >= parameters.size() ||
        sig.parameter_dtypes[node.parameter] != node.dtype) {
      return absl::InternalError("the program's parameters do not match its compiled kernel");
    }
    parameters[node.parameter] = ParameterBits(node.dtype, node.value);
    ++found;
  }
  if (found != parameters.size()) {
    return absl::InternalError("the program's parameters do not match its compiled kernel");
  }

  // Every element is read and written by the same thread, reads first, so out == input
  // with equal element sizes is safe. Any other overlap (a different element size, or an
  // offset) would let one thread overwrite what another has yet to read: compute into a
  // temporary and copy, in stream order.
  const uint64_t out_size = DTypeSize(sig.out_dtype);
  const uint64_t out_bytes = static_cast<uint64_t>(n) * out_size;
  bool needs_temp = false;
  for (size_t a = 0; a < arrays.size(); ++a) {
    const uint64_t size = DTypeSize(sig.array_dtypes[a]);
    if (Overlaps(arrays[a], static_cast<uint64_t>(n) * size, out, out_bytes) &&
        !(arrays[a] == out && size == out_size)) {
      needs_temp = true;
    }
  }
  if (!needs_temp) return LaunchKernel(kernel, arrays, out, n, parameters, sm_count, stream);

  void* temp = nullptr;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&temp, out_bytes, stream));
  absl::Status status = LaunchKernel(kernel, arrays, temp, n, parameters, sm_count, stream);
  if (status.ok()) {
    const cudaError_t copied =
        cudaMemcpyAsync(out, temp, out_bytes, cudaMemcpyDeviceToDevice, stream);
    if (copied != cudaSuccess) {
      status = CudaStatus(copied, "cudaMemcpyAsync(out, temp)", __FILE__, __LINE__);
    }
  }
  if (const cudaError_t freed = cudaFreeAsync(temp, stream); freed != cudaSuccess && status.ok()) {
    status = CudaStatus(freed, "cudaFreeAsync(temp)", __FILE__, __LINE__);
  }
  return status;
}

}  // namespace gpucompute::cuda

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
#include <variant>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "kernels/cuda/kernels.h"
#include "server/cuda/cuda_check.h"
#include "server/expression/ir.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool Overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

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

// The launch of a loaded kernel pair (the kernel library's entry point), as a status.
absl::Status LaunchKernel(const CompiledElementwise& kernel, const std::vector<const void*>& arrays,
                          void* out, int64_t n, const std::vector<uint64_t>& parameters,
                          int sm_count, cudaStream_t stream) {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(ElementwiseAsync(kernel.signature, kernel.kernels, arrays.data(),
                                                   out, n, parameters.data(), sm_count, stream));
  return absl::OkStatus();
}

// INVALID_ARGUMENT when a kernel of `signature` would need more than
// kMaxElementwiseArgumentBytes of kernel arguments (`bytes`).
absl::Status CheckArgumentBytes(const ElementwiseSignature& signature, int64_t bytes) {
  if (bytes <= kMaxElementwiseArgumentBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the expression needs ", bytes, " bytes of CUDA kernel arguments (",
      signature.array_inputs.size(), " arrays, ", signature.parameter_dtypes.size(),
      " uses of scalar inputs); at most ", kMaxElementwiseArgumentBytes,
      " are supported. Use fewer scalar inputs, or pass some values as arrays."));
}

// INVALID_ARGUMENT unless `program` is the one `canonical` was compiled from and `inputs`
// (that many) is parallel to its inputs.
absl::Status CheckProgram(const std::string& canonical, const expr::Program& program,
                          size_t inputs) {
  if (program.canonical() != canonical) {
    return absl::InvalidArgumentError(absl::StrCat("the compiled elementwise kernel is for ",
                                                   canonical, ", not for the program ",
                                                   program.canonical()));
  }
  if (inputs != program.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("the program has ", program.inputs().size(),
                                                   " inputs but ", inputs,
                                                   " pointers were given"));
  }
  return absl::OkStatus();
}

absl::Status NullArrayError(const expr::Program& program, int32_t input) {
  return absl::InvalidArgumentError(absl::StrCat(
      "input '", program.inputs()[input], "' is an array but its pointer is null"));
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> KernelParameters(const expr::Program& program,
                                                       const std::vector<DType>& dtypes) {
  std::vector<uint64_t> parameters(dtypes.size());
  size_t found = 0;
  for (const expr::Node& node : program.ir().nodes) {
    if (node.op != expr::OpKind::kConstant || node.parameter < 0) continue;
    // Same canonical() implies the same parameters; checked anyway, since a mismatch
    // would pass garbage to the kernel.
    if (static_cast<size_t>(node.parameter) >= parameters.size() ||
        dtypes[node.parameter] != node.dtype) {
      return absl::InternalError("the program's parameters do not match its compiled kernel");
    }
    parameters[node.parameter] = ParameterBits(node.dtype, node.value);
    ++found;
  }
  if (found != parameters.size()) {
    return absl::InternalError("the program's parameters do not match its compiled kernel");
  }
  return parameters;
}

struct ElementwiseKernels::Slot {
  absl::Notification done;
  // Written once, before `done` is notified; read only after. One of the two kernels is
  // set once built, as the key says.
  absl::Status status;
  std::unique_ptr<CompiledElementwise> kernel;
  std::unique_ptr<CompiledStridedElementwise> strided;
  bool built() const { return kernel != nullptr || strided != nullptr; }
};

size_t ElementwiseKernels::KeyHash::Hash(const KeyView& k) {
  return absl::Hash<std::tuple<absl::string_view, DType, int, absl::string_view>>()(
      std::make_tuple(k.canonical, k.out_dtype, k.arch, k.specialization));
}

ElementwiseKernels::ElementwiseKernels(std::string disk_cache_dir)
    : compiler_(std::move(disk_cache_dir)) {}

ElementwiseKernels::~ElementwiseKernels() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, slot] : slots_) {
    if (!slot->done.HasBeenNotified() || !slot->built()) continue;
    const cudaError_t error = cudaLibraryUnload(slot->kernel != nullptr ? slot->kernel->library
                                                                        : slot->strided->library);
    // At process exit the runtime may already be gone, taking the libraries with it.
    if (error != cudaErrorCudartUnloading)
      LogIfFailed(error, "cudaLibraryUnload of an elementwise kernel");
  }
}

absl::StatusOr<const ElementwiseKernels::Slot*> ElementwiseKernels::FindOrBuild(
    const KeyView& key, absl::FunctionRef<absl::Status(Slot&)> build, double* compile_seconds) {
  if (compile_seconds != nullptr) *compile_seconds = 0;
  std::shared_ptr<Slot> slot;
  bool builds = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      // Set under the lock once built, and never taken back: the common case ends here.
      if (it->second->built()) return it->second.get();
    } else {
      it = slots_
               .emplace(Key{std::string(key.canonical), key.out_dtype, key.arch,
                            std::string(key.specialization)},
                        std::make_shared<Slot>())
               .first;
      builds = true;
    }
    slot = it->second;
  }
  const auto start = std::chrono::steady_clock::now();
  if (!builds) {
    const bool hit = slot->done.HasBeenNotified();
    slot->done.WaitForNotification();
    if (!hit && compile_seconds != nullptr) *compile_seconds = SecondsSince(start);
    RETURN_IF_ERROR(slot->status);
    return slot.get();
  }

  // This call builds, into a Slot of its own that is published under the lock;
  // concurrent callers of the same key wait on `slot->done`.
  Slot built;
  const absl::Status status = build(built);
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      slot->kernel = std::move(built.kernel);
      slot->strided = std::move(built.strided);
    } else {
      slot->status = status;
      slots_.erase(key);  // not remembered: a later call tries again
    }
  }
  slot->done.Notify();
  if (compile_seconds != nullptr) *compile_seconds = SecondsSince(start);
  RETURN_IF_ERROR(status);
  return slot.get();
}

absl::Status ElementwiseKernels::Load(const std::string& source, int arch,
                                      cudaLibrary_t* library) {
  ASSIGN_OR_RETURN(const std::string cubin, compiler_.Compile(source, arch));
  // The runtime copies the image (cudaLibraryBinaryIsPreserved is not set), so the
  // CUBIN need not outlive the call.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(
      cudaLibraryLoadData(library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  return absl::OkStatus();
}

absl::StatusOr<const CompiledElementwise*> ElementwiseKernels::Get(
    const expr::Program& program, DType out_dtype, int arch, double* compile_seconds,
    const std::vector<bool>& constant_arrays) {
  auto build = [&](Slot& slot) -> absl::Status {
    auto kernel = std::make_unique<CompiledElementwise>();
    ElementwiseSource generated = GenerateElementwise(program, out_dtype, constant_arrays);
    RETURN_IF_ERROR(CheckArgumentBytes(generated.signature, generated.signature.argument_bytes));
    RETURN_IF_ERROR(Load(generated.source, arch, &kernel->library));
    kernel->canonical = program.canonical();
    kernel->out_dtype = out_dtype;
    kernel->arch = arch;
    kernel->signature = std::move(generated.signature);
    absl::Status found = [&]() -> absl::Status {
      ElementwiseKernelPair& pair = kernel->kernels;
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryGetKernel(&pair.vector_kernel, kernel->library,
                                                           generated.vector_kernel.c_str()));
      GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryGetKernel(&pair.scalar_kernel, kernel->library,
                                                           generated.scalar_kernel.c_str()));
      const int threads = kernel->signature.threads_per_block;
      pair.vector_blocks_per_sm = ElementwiseBlocksPerSm(pair.vector_kernel, threads);
      pair.scalar_blocks_per_sm = ElementwiseBlocksPerSm(pair.scalar_kernel, threads);
      return absl::OkStatus();
    }();
    if (!found.ok()) {
      cudaLibraryUnload(kernel->library);
      return found;
    }
    slot.kernel = std::move(kernel);
    return absl::OkStatus();
  };
  // Kernels without constant arrays keep the empty name (no allocation per launch).
  std::string name;
  if (std::find(constant_arrays.begin(), constant_arrays.end(), true) != constant_arrays.end()) {
    name = "constant:";
    for (bool constant : constant_arrays) name += constant ? '1' : '0';
  }
  ASSIGN_OR_RETURN(const Slot* slot, FindOrBuild({program.canonical(), out_dtype, arch, name},
                                                 build, compile_seconds));
  return slot->kernel.get();
}

absl::StatusOr<const CompiledStridedElementwise*> ElementwiseKernels::GetStrided(
    const expr::Program& program, DType out_dtype, const StridedSpecialization& specialization,
    int arch, double* compile_seconds) {
  const StridedSpecialization& spec = specialization;
  if (spec.dims < 1 || spec.dims > kElementwiseMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat("strided kernels have 1 to ",
                                                   kElementwiseMaxDims, " axes, not ", spec.dims));
  }
  auto build = [&](Slot& slot) -> absl::Status {
    auto kernel = std::make_unique<CompiledStridedElementwise>();
    StridedElementwiseSource generated = GenerateElementwiseStrided(program, out_dtype, spec);
    if (generated.specialization.in_steps.size() != generated.signature.array_inputs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the specialisation gives ", spec.in_steps.size(), " row steps for ",
          generated.signature.array_inputs.size(), " array inputs"));
    }
    RETURN_IF_ERROR(
        CheckArgumentBytes(generated.signature, StridedArgumentBytes(generated.signature, spec)));
    RETURN_IF_ERROR(Load(generated.source, arch, &kernel->library));
    kernel->canonical = program.canonical();
    kernel->out_dtype = out_dtype;
    kernel->arch = arch;
    kernel->signature = std::move(generated.signature);
    kernel->specialization = spec;
    const cudaError_t got =
        cudaLibraryGetKernel(&kernel->kernel, kernel->library, generated.kernel.c_str());
    if (got != cudaSuccess) {
      cudaLibraryUnload(kernel->library);
      return CudaStatus(got, "cudaLibraryGetKernel", __FILE__, __LINE__);
    }
    kernel->blocks_per_sm =
        ElementwiseBlocksPerSm(kernel->kernel, kernel->signature.threads_per_block);
    slot.strided = std::move(kernel);
    return absl::OkStatus();
  };
  // The name is short; built per call, like the key's view of it.
  const std::string name = spec.Name();
  ASSIGN_OR_RETURN(const Slot* slot,
                   FindOrBuild({program.canonical(), out_dtype, arch, name}, build,
                               compile_seconds));
  return slot->strided.get();
}

absl::Status LaunchElementwise(const CompiledElementwise& kernel, const expr::Program& program,
                               std::span<const void* const> inputs, void* out, int64_t n,
                               int sm_count, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckProgram(kernel.canonical, program, inputs.size()));
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
    if (arrays[a] == nullptr) return NullArrayError(program, sig.array_inputs[a]);
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> parameters,
                   KernelParameters(program, sig.parameter_dtypes));

  // Every element is read and written by the same thread, reads first, so out == input
  // with equal element sizes is safe. Any other overlap (a different element size, or an
  // offset, or a constant array, which every thread reads) would let one thread overwrite
  // what another has yet to read: compute into a temporary and copy, in stream order.
  const uint64_t out_size = DTypeSize(sig.out_dtype);
  const uint64_t out_bytes = static_cast<uint64_t>(n) * out_size;
  bool needs_temp = false;
  for (size_t a = 0; a < arrays.size(); ++a) {
    const uint64_t size = DTypeSize(sig.array_dtypes[a]);
    const bool constant = a < sig.array_constant.size() && sig.array_constant[a];
    const uint64_t elements = constant ? 1 : static_cast<uint64_t>(n);
    if (Overlaps(arrays[a], elements * size, out, out_bytes) &&
        !(arrays[a] == out && size == out_size && (!constant || n == 1))) {
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

StridedSpecialization SpecializationOf(const expr::Program& program,
                                       std::span<const StridedArray> inputs,
                                       const StridedArray& out, std::span<const int64_t> shape,
                                       DType out_dtype) {
  StridedSpecialization spec;
  const int dims = static_cast<int>(shape.size());
  spec.dims = dims;
  int tiled = 0;
  std::vector<DType> dtypes;
  std::vector<StridedArray> arrays;
  for (size_t k = 0; k < inputs.size() && k < program.input_types().size(); ++k) {
    const auto* array = std::get_if<expr::ArrayInput>(&program.input_types()[k]);
    if (array == nullptr) continue;
    RowStep step = ClassifyRowStep(inputs[k].strides, dims, /*is_output=*/false);
    if (step == RowStep::kTransposed && ++tiled > kMaxTiledInputs) step = RowStep::kGather;
    spec.in_steps.push_back(step);
    dtypes.push_back(array->dtype);
    arrays.push_back(inputs[k]);
  }
  spec.out_step = ClassifyRowStep(out.strides, dims, /*is_output=*/true);
  spec.rows = RowsLayoutsFit(spec, shape.data(), dtypes, arrays.data(), out_dtype, out);
  return spec;
}

absl::Status LaunchElementwiseStrided(const CompiledStridedElementwise& kernel,
                                      const expr::Program& program,
                                      std::span<const StridedArray> inputs,
                                      const StridedArray& out, std::span<const int64_t> shape,
                                      int sm_count, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckProgram(kernel.canonical, program, inputs.size()));
  const StridedSpecialization& spec = kernel.specialization;
  if (static_cast<int>(shape.size()) != spec.dims) {
    return absl::InvalidArgumentError(absl::StrCat("the strided kernel is for ", spec.dims,
                                                   " axes, not ", shape.size()));
  }
  for (int64_t extent : shape) {
    if (extent < 0) return absl::InvalidArgumentError(absl::StrCat("negative extent ", extent));
    if (extent == 0) return absl::OkStatus();
  }
  if (sm_count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sm_count must be positive, got ", sm_count));
  }
  if (out.data == nullptr) return absl::InvalidArgumentError("the output pointer is null");
  // A layout of another specialisation would be read wrongly (a broadcast row read as
  // unit stride, say): the caller must ask for the kernel of these very layouts. Layouts
  // that fit the rows kernel also run on the strided kernel of their row steps, not the
  // other way round.
  const StridedSpecialization given =
      SpecializationOf(program, inputs, out, shape, kernel.out_dtype);
  if (given.in_steps != spec.in_steps || given.out_step != spec.out_step ||
      (spec.rows && !given.rows)) {
    return absl::InvalidArgumentError(absl::StrCat("the layouts are of the strided specialisation ",
                                                   given.Name(), ", the kernel of ", spec.Name()));
  }
  const ElementwiseSignature& sig = kernel.signature;
  std::vector<StridedArray> arrays(sig.array_inputs.size());
  for (size_t a = 0; a < arrays.size(); ++a) {
    arrays[a] = inputs[sig.array_inputs[a]];
    if (arrays[a].data == nullptr) return NullArrayError(program, sig.array_inputs[a]);
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> parameters,
                   KernelParameters(program, sig.parameter_dtypes));
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(ElementwiseStridedAsync(
      sig, spec, kernel.kernel, kernel.blocks_per_sm, shape.data(), arrays.data(), out,
      parameters.data(), sm_count, stream));
  return absl::OkStatus();
}

}  // namespace gpucompute::cuda

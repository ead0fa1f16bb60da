// ReduceExpressionKernelSource and ReduceExpressionAsync: the generated reductions of
// expressions. Host code (plain C++); the device code is kernels/cuda/elementwise/
// reduce.cuh.in around the embedded kernels/reduce_ops.h and kernels/cuda/detail/
// reduce_strided_kernels.cuh, the very text nvcc compiles for the plain reductions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"

namespace gpucompute::cuda {
namespace {

constexpr char kPrelude[] =
#include "kernels/cuda/elementwise/prelude.cuh.inc"
    ;
constexpr char kReduceTemplate[] =
#include "kernels/cuda/elementwise/reduce.cuh.inc"
    ;
// The headers the kernels are built from, in dependency order. NVRTC compiles device
// code only, and has no include path: DeviceView keeps of them what device code can see.
constexpr const char* kHeaders[] = {
#include "kernels/cuda/elementwise/host_device.h.inc"
    ,
#include "kernels/cuda/elementwise/dtype.h.inc"
    ,
#include "kernels/cuda/elementwise/ops.h.inc"
    ,
#include "kernels/cuda/elementwise/reduce_ops.h.inc"
    ,
#include "kernels/cuda/elementwise/reduce_strided_kernels.cuh.inc"
};

bool StartsWith(std::string_view line, std::string_view prefix) {
  return line.substr(0, prefix.size()) == prefix;
}

// `text` (a header in Google style) without its #include lines and without its host-only
// functions: those at namespace level that are not GPUCOMPUTE_HD or __device__, whose
// definition starts at column 0 with `constexpr`, `decltype(auto)` or `inline` followed by
// a call's parenthesis, after an optional `template <...>` line, and ends at the first
// line that is `}` (or on its own line). Types, constants and the operators stay.
std::string DeviceView(std::string_view text) {
  std::string out;
  std::string_view held;  // a template line, kept only if a kept declaration follows
  bool skipping = false;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line =
        text.substr(0, end == std::string_view::npos ? text.size() : end + 1);
    text.remove_prefix(line.size());
    const std::string_view bare = line.substr(0, line.find_last_not_of('\n') + 1);
    if (skipping) {
      skipping = bare != "}";
      continue;
    }
    if (StartsWith(line, "#include")) continue;
    const bool host_function = (StartsWith(line, "constexpr ") || StartsWith(line, "decltype(auto) ") ||
                                (StartsWith(line, "inline ") && !StartsWith(line, "inline constexpr "))) &&
                               bare.find('(') != std::string_view::npos;
    if (host_function) {
      held = {};
      skipping = bare.empty() || bare.back() != '}';
      continue;
    }
    if (!held.empty()) out.append(held);
    held = {};
    if (StartsWith(line, "template <") && bare.back() == '>') {
      held = line;
      continue;
    }
    out.append(line);
  }
  out.append(held);
  return out;
}

// `text` with every @name@ of `values` replaced by its value.
std::string Fill(std::string_view text, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string out(text);
  for (const auto& [name, value] : values) {
    const std::string key = "@" + name + "@";
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size())) {
      out.replace(at, key.size(), value);
    }
  }
  return out;
}

// Appends `part` to a comma-separated list.
void Append(std::string* list, const std::string& part) {
  if (!list->empty()) *list += ", ";
  *list += part;
}

// The C++ type of an element in memory and of a parameter: bool is one byte.
const char* StorageType(DType t) { return t == DType::kBool ? "gc::u8" : ElementwiseValueType(t); }

}  // namespace

std::string ReduceExpressionKernelSource(const ReduceExpressionSignature& signature,
                                         std::string_view header, std::string_view element_body) {
  const ReduceExpressionSignature& sig = signature;
  std::string parameters;
  std::string arguments;
  for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
    const std::string k = std::to_string(sig.array_inputs[a]);
    Append(&parameters, std::string(ElementwiseValueType(sig.array_dtypes[a])) + " x" + k);
    std::string element = "static_cast<const " + std::string(StorageType(sig.array_dtypes[a])) +
                          "*>(x.arrays[" + std::to_string(a) + "])[off[" + std::to_string(a) +
                          "]]";
    Append(&arguments, sig.array_dtypes[a] == DType::kBool ? "(" + element + " != 0)" : element);
  }
  for (size_t p = 0; p < sig.parameter_dtypes.size(); ++p) {
    const DType t = sig.parameter_dtypes[p];
    Append(&parameters, std::string(ElementwiseValueType(t)) + " p" + std::to_string(p));
    const std::string bits = "FromBits<" + std::string(StorageType(t)) + ">(x.parameters[" +
                             std::to_string(p) + "])";
    Append(&arguments, t == DType::kBool ? "(" + bits + " != 0)" : bits);
  }
  std::string headers;
  for (const char* h : kHeaders) headers += DeviceView(h);
  std::string source(header);
  source += kPrelude;
  source += '\n';
  source += Fill(
      kReduceTemplate,
      {
          {"headers", headers},
          {"value_type", ElementwiseValueType(sig.value_dtype)},
          {"element_parameters", parameters},
          {"element_body", std::string(element_body)},
          {"kind", std::to_string(static_cast<int>(sig.kind))},
          {"arrays", std::to_string(sig.array_slots())},
          {"parameter_slots", std::to_string(std::max<size_t>(1, sig.parameter_dtypes.size()))},
          {"element_arguments", arguments},
          {"threads_per_block", "256"},
          {"rows_kernel", kReduceRowsKernel},
          {"columns_kernel", kReduceColumnsKernel},
      });
  return source;
}

namespace {

struct ExpressionLaunch {
  const ReduceExpressionKernels* kernels;
  StridedReducePath path;
  std::vector<uint64_t> geometry;  // StridedReduceGeometry<array slots>
  std::vector<uint64_t> operands;  // Operands: array pointers, then parameter slots
  void* out;
  cudaStream_t stream;
};

cudaError_t Launch(const void* context, void* partial, unsigned grid) {
  const auto& c = *static_cast<const ExpressionLaunch*>(context);
  void* out = c.out;
  void* args[] = {const_cast<uint64_t*>(c.geometry.data()),
                  const_cast<uint64_t*>(c.operands.data()), &partial, &out};
  const cudaKernel_t kernel =
      c.path == StridedReducePath::kRows ? c.kernels->rows : c.kernels->columns;
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(256), args, 0,
                          c.stream);
}

}  // namespace

cudaError_t ReduceExpressionAsync(const ReduceExpressionSignature& signature,
                                  const ReduceExpressionKernels& kernels,
                                  const StridedReducePlan& plan, const void* const* arrays,
                                  const uint64_t* parameters, void* out, cudaMemPool_t pool,
                                  cudaStream_t stream) {
  if (plan.path == StridedReducePath::kDense) return cudaErrorInvalidValue;
  ExpressionLaunch launch{&kernels, plan.path, StridedReduceGeometryBytes(plan, signature.array_slots()),
                          {}, out, stream};
  for (int a = 0; a < signature.array_slots(); ++a) {
    launch.operands.push_back(a < static_cast<int>(signature.array_inputs.size())
                                  ? reinterpret_cast<uintptr_t>(arrays[a])
                                  : 0);
  }
  const size_t slots = std::max<size_t>(1, signature.parameter_dtypes.size());
  for (size_t p = 0; p < slots; ++p) {
    launch.operands.push_back(p < signature.parameter_dtypes.size() ? parameters[p] : 0);
  }
  return RunStridedReduce(signature.kind, signature.value_dtype, plan, &Launch, &launch, out, pool,
                          stream);
}

}  // namespace gpucompute::cuda

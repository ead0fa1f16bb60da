// ElementwiseKernelSource and PlanElementwiseKernel: the generated kernels' source and the
// shape baked into it. Host code (plain C++); the device code is in prelude.cuh and the
// templates (*.cuh.in) beside this file, embedded at build time (embed.cmake).
#include <algorithm>
#include <cstddef>
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

constexpr char kContiguousTemplate[] =
#include "kernels/cuda/elementwise/contiguous.cuh.inc"
    ;

constexpr char kStridedTemplate[] =
#include "kernels/cuda/elementwise/strided.cuh.inc"
    ;

constexpr char kRowsTemplate[] =
#include "kernels/cuda/elementwise/rows.cuh.inc"
    ;

// The template's lines between one of the first three markers and kEnd repeat once per
// array input: every one, those of n elements (in_constant false or absent), or the
// constant ones (in_constant true).
constexpr std::string_view kForEachArray = "//@for each array";
constexpr std::string_view kForEachLoadedArray = "//@for each loaded array";
constexpr std::string_view kForEachConstantArray = "//@for each constant array";
constexpr std::string_view kEnd = "//@end";

using Values = std::vector<std::pair<std::string_view, std::string>>;

// `line` with every @name@ of `values` replaced by its value, then a newline. An unknown
// name is left as it is, so that NVRTC reports it (the codegen test checks that none is
// left).
void AppendFilled(std::string_view line, const Values& values, std::string* out) {
  while (!line.empty()) {
    const size_t at = line.find('@');
    const size_t close = at == std::string_view::npos ? at : line.find('@', at + 1);
    if (close == std::string_view::npos) break;
    const std::string_view name = line.substr(at + 1, close - at - 1);
    const auto value =
        std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    if (value == values.end()) {
      out->append(line.substr(0, close));  // the second @ may open the next name
      line.remove_prefix(close);
      continue;
    }
    out->append(line.substr(0, at));
    out->append(value->second);
    line.remove_prefix(close + 1);
  }
  out->append(line);
  out->push_back('\n');
}

// Appends `text` (a template of whole lines) filled in with `values`, and its per-array
// blocks once for each of `arrays` (a block sees `values` and the array's own).
void AppendTemplate(std::string_view text, const Values& values, const std::vector<Values>& arrays,
                    std::string* out) {
  auto is_constant = [](const Values& array) {
    return std::find(array.begin(), array.end(),
                     std::pair<std::string_view, std::string>("in_constant", "true")) !=
           array.end();
  };
  std::vector<std::string_view> block;
  bool in_block = false;
  std::string_view marker;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line == kForEachArray || line == kForEachLoadedArray || line == kForEachConstantArray) {
      in_block = true;
      marker = line;
    } else if (line == kEnd) {
      in_block = false;
      for (const Values& array : arrays) {
        if ((marker == kForEachLoadedArray && is_constant(array)) ||
            (marker == kForEachConstantArray && !is_constant(array))) {
          continue;
        }
        Values both = values;
        both.insert(both.end(), array.begin(), array.end());
        for (std::string_view l : block) AppendFilled(l, both, out);
      }
      block.clear();
    } else if (in_block) {
      block.push_back(line);
    } else {
      AppendFilled(line, values, out);
    }
  }
}

// The C++ type of an element in memory, and of a parameter argument: bool is one byte.
const char* StorageType(DType t) { return t == DType::kBool ? "gc::u8" : ElementwiseValueType(t); }

int64_t AlignUp(int64_t x, int64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) joined += ", ";
    joined += parts[i];
  }
  return joined;
}

}  // namespace

const char* ElementwiseValueType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "bool";
    case DType::kInt32:
      return "gc::i32";
    case DType::kInt64:
      return "gc::i64";
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
  }
  return "?";
}

namespace {

// Elements of a pack of the arrays of these dtypes, constant ones aside.
int ElementsPerPack(const std::vector<DType>& array_dtypes, const std::vector<bool>& array_constant,
                    DType out_dtype) {
  // A pack is 16 bytes of the narrowest array, so every array moves in whole 16-byte words.
  // Constant arrays are not loaded in packs.
  size_t min_size = DTypeSize(out_dtype);
  for (size_t a = 0; a < array_dtypes.size(); ++a) {
    if (a < array_constant.size() && array_constant[a]) continue;
    min_size = std::min(min_size, DTypeSize(array_dtypes[a]));
  }
  return static_cast<int>(16 / min_size);
}

}  // namespace

void PlanElementwiseKernel(bool calls_math_library, ElementwiseSignature* signature) {
  ElementwiseSignature& sig = *signature;
  std::vector<bool> constant = sig.array_constant;
  constant.resize(sig.array_dtypes.size(), false);
  const int v = ElementsPerPack(sig.array_dtypes, constant, sig.out_dtype);
  sig.elements_per_pack = v;
  // Two packs in flight per thread give each thread more independent loads (latency
  // hiding when registers limit occupancy), but wide mixes (float64 arrays with a bool
  // output: 128 bytes per array per pack) would only add register pressure. So would
  // math-library calls, which make an expression compute-bound: a pack already holds
  // enough independent work, and the second pack's registers cost occupancy.
  int64_t load_bytes = 0;
  for (size_t a = 0; a < sig.array_dtypes.size(); ++a) {
    if (!constant[a])
      load_bytes += int64_t{v} * static_cast<int64_t>(DTypeSize(sig.array_dtypes[a]));
  }
  if (calls_math_library) {
    sig.packs_per_thread = 1;
  } else if (load_bytes == 0) {
    sig.packs_per_thread = kElementwisePacksPerThread;
  } else {
    sig.packs_per_thread = static_cast<int>(std::clamp<int64_t>(
        kElementwiseMaxLoadBytesPerIteration / load_bytes, 1, kElementwisePacksPerThread));
  }
  sig.threads_per_block = kElementwiseThreadsPerBlock;

  int64_t arg_bytes = 8 * (static_cast<int64_t>(sig.array_inputs.size()) + 2);  // pointers, out, n
  for (DType t : sig.parameter_dtypes) {
    const auto size = static_cast<int64_t>(DTypeSize(t));
    arg_bytes = AlignUp(arg_bytes, size) + size;
  }
  sig.argument_bytes = arg_bytes;
}

namespace {

// What both templates fill in the same way: the per-element function's parameters, the
// kernels' pointer and parameter arguments, and the call of Element() for one output
// element.
struct ElementCall {
  const ElementwiseSignature& sig;

  static std::string ParamName(size_t p) { return "p" + std::to_string(p); }
  std::string Words(DType t) const {
    return std::to_string(static_cast<size_t>(sig.elements_per_pack) * DTypeSize(t) / 16);
  }
  std::string ElementParameters() const {
    std::vector<std::string> parameters;
    for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
      parameters.push_back(std::string(ElementwiseValueType(sig.array_dtypes[a])) + " x" +
                           std::to_string(sig.array_inputs[a]));
    }
    for (size_t p = 0; p < sig.parameter_dtypes.size(); ++p) {
      parameters.push_back(std::string(ElementwiseValueType(sig.parameter_dtypes[p])) + " " +
                           ParamName(p));
    }
    return Join(parameters);
  }
  // The pointers, then `middle` (more arguments, or none), then the parameters.
  std::string KernelParameters(const std::vector<std::string>& middle) const {
    std::vector<std::string> parameters;
    for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
      parameters.push_back("const " + std::string(StorageType(sig.array_dtypes[a])) + "* in" +
                           std::to_string(sig.array_inputs[a]));
    }
    parameters.push_back(std::string(StorageType(sig.out_dtype)) + "* out");
    parameters.insert(parameters.end(), middle.begin(), middle.end());
    for (size_t p = 0; p < sig.parameter_dtypes.size(); ++p) {
      parameters.push_back(std::string(StorageType(sig.parameter_dtypes[p])) + " " + ParamName(p));
    }
    return Join(parameters);
  }
  // The call of Element() for one output element, where `element(a)` is array a's
  // element as stored: bools are stored as bytes and computed as bool.
  template <typename F>
  std::string operator()(F element) const {
    std::vector<std::string> args;
    for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
      std::string e = element(a);
      args.push_back(sig.array_dtypes[a] == DType::kBool ? "(" + e + " != 0)" : e);
    }
    for (size_t p = 0; p < sig.parameter_dtypes.size(); ++p) {
      args.push_back(sig.parameter_dtypes[p] == DType::kBool ? "(" + ParamName(p) + " != 0)"
                                                             : ParamName(p));
    }
    std::string call = "Element(" + Join(args) + ")";
    return sig.out_dtype == DType::kBool ? "static_cast<gc::u8>(" + call + ")" : call;
  }
  // The placeholders both templates share; `kernel_parameters` as KernelParameters gives.
  Values Common(std::string_view element_body, std::string kernel_parameters) const {
    return {
        {"out_value_type", ElementwiseValueType(sig.out_dtype)},
        {"element_parameters", ElementParameters()},
        {"element_body", std::string(element_body)},
        {"threads_per_block", std::to_string(sig.threads_per_block)},
        {"kernel_parameters", std::move(kernel_parameters)},
        {"elements_per_pack", std::to_string(sig.elements_per_pack)},
        {"out_type", StorageType(sig.out_dtype)},
        {"out_words", Words(sig.out_dtype)},
    };
  }
  bool Constant(size_t a) const { return a < sig.array_constant.size() && sig.array_constant[a]; }
  std::vector<Values> Arrays() const {
    std::vector<Values> arrays;
    for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
      arrays.push_back({{"in", std::to_string(sig.array_inputs[a])},
                        {"in_type", StorageType(sig.array_dtypes[a])},
                        {"in_words", Words(sig.array_dtypes[a])},
                        {"in_constant", Constant(a) ? "true" : "false"}});
    }
    return arrays;
  }
};

const char* RowStepName(RowStep step) {
  switch (step) {
    case RowStep::kUnit:
      return "kUnit";
    case RowStep::kBroadcast:
      return "kBroadcast";
    case RowStep::kGather:
      return "kGather";
    case RowStep::kConstant:
      return "kConstant";
    case RowStep::kTransposed:
      return "kTransposed";
  }
  return "?";
}

// Int64 words of the strided kernel's Args: shape, magic and shift per axis, rows, then
// strides per axis and the offset of each array and of the output; of the rows kernel's:
// rows and packs, then a row stride and an offset per array and for the output.
int64_t ArgsWords(size_t num_arrays, const StridedSpecialization& spec) {
  const auto layouts = static_cast<int64_t>(num_arrays + 1);
  if (spec.rows) return 2 + 2 * layouts;
  return 3 * int64_t{spec.dims} + 1 + layouts * (spec.dims + 1);
}

}  // namespace

std::string ElementwiseKernelSource(const ElementwiseSignature& signature, std::string_view header,
                                    std::string_view element_body) {
  const ElementwiseSignature& sig = signature;
  const ElementCall call{sig};
  Values values = call.Common(element_body, call.KernelParameters({"gc::i64 n"}));
  // A constant array's value is c<k>, read once per thread; the others' come from their
  // pack (`packed`) or from memory.
  auto value = [&](size_t a, bool packed) {
    const std::string k = std::to_string(sig.array_inputs[a]);
    if (call.Constant(a)) return "c" + k;
    return packed ? "a" + k + "[j].e[e]" : "in" + k + "[i]";
  };
  values.insert(values.end(), {
                                  {"vector_kernel", kElementwiseVectorKernel},
                                  {"scalar_kernel", kElementwiseScalarKernel},
                                  {"packs_per_thread", std::to_string(sig.packs_per_thread)},
                                  {"pack_element", call([&](size_t a) { return value(a, true); })},
                                  {"element", call([&](size_t a) { return value(a, false); })},
                              });
  std::string source(header);
  source += kPrelude;
  source += '\n';
  AppendTemplate(kContiguousTemplate, values, call.Arrays(), &source);
  return source;
}

std::string StridedSpecialization::Name() const {
  // One letter per array, the output's after '>': u(nit), b(roadcast), g(ather),
  // c(onstant), t(ransposed).
  constexpr char kLetters[] = "ubgct";
  std::string name = rows ? std::string("rows:") : std::to_string(dims) + "d:";
  for (RowStep step : in_steps) name += kLetters[static_cast<int>(step)];
  name += '>';
  name += kLetters[static_cast<int>(out_step)];
  return name;
}

RowStep ClassifyRowStep(const int64_t* strides, int dims, bool is_output) {
  const int64_t inner = dims > 0 ? strides[dims - 1] : 0;
  if (inner == 1) return RowStep::kUnit;
  if (is_output) return RowStep::kGather;
  if (std::all_of(strides, strides + dims, [](int64_t s) { return s == 0; })) {
    return RowStep::kConstant;
  }
  if (inner == 0) return RowStep::kBroadcast;
  return dims >= 2 && strides[dims - 2] == 1 ? RowStep::kTransposed : RowStep::kGather;
}

int64_t StridedArgumentBytes(const ElementwiseSignature& signature,
                             const StridedSpecialization& specialization) {
  int64_t bytes = 8 * (static_cast<int64_t>(signature.array_inputs.size()) + 1);  // pointers
  bytes += 8 * ArgsWords(signature.array_inputs.size(), specialization);
  for (DType t : signature.parameter_dtypes) {
    const auto size = static_cast<int64_t>(DTypeSize(t));
    bytes = AlignUp(bytes, size) + size;
  }
  return bytes;
}

std::string ElementwiseStridedKernelSource(const ElementwiseSignature& signature,
                                           const StridedSpecialization& specialization,
                                           std::string_view header,
                                           std::string_view element_body) {
  const ElementwiseSignature& sig = signature;
  const StridedSpecialization& spec = specialization;
  const ElementCall call{sig};
  // Unit and gathered arrays come from their pack (or, in a row's tail, from memory);
  // broadcast and constant ones from their value of the row or of the thread.
  auto from_value = [&](size_t a) {
    return spec.in_steps[a] == RowStep::kBroadcast || spec.in_steps[a] == RowStep::kConstant;
  };
  const bool tiled = std::find(spec.in_steps.begin(), spec.in_steps.end(),
                               RowStep::kTransposed) != spec.in_steps.end();
  Values values = call.Common(element_body, call.KernelParameters({"const Args args"}));
  values.insert(values.end(),
                {
                    {"strided_kernel", kElementwiseStridedKernel},
                    {"rows_kernel", kElementwiseRowsKernel},
                    {"dims", std::to_string(spec.dims)},
                    {"packs_per_thread", std::to_string(sig.packs_per_thread)},
                    {"tiled", tiled ? "true" : "false"},
                    {"tiled_element",
                     call([&](size_t a) { return "v" + std::to_string(sig.array_inputs[a]); })},
                    {"out_step", RowStepName(spec.out_step)},
                    {"args_words", std::to_string(ArgsWords(sig.array_inputs.size(), spec))},
                    {"pack_element", call([&](size_t a) {
                       const std::string k = std::to_string(sig.array_inputs[a]);
                       return from_value(a) ? "v" + k : "a" + k + "[j].e[e]";
                     })},
                    {"element", call([&](size_t a) {
                       const std::string k = std::to_string(sig.array_inputs[a]);
                       return from_value(a) ? "v" + k : "r" + k + "[c * s" + k + "]";
                     })},
                });
  std::vector<Values> arrays = call.Arrays();
  for (size_t a = 0; a < arrays.size(); ++a) {
    arrays[a].emplace_back("in_step", RowStepName(spec.in_steps[a]));
  }
  std::string source(header);
  source += kPrelude;
  source += '\n';
  AppendTemplate(spec.rows ? kRowsTemplate : kStridedTemplate, values, arrays, &source);
  return source;
}

bool RowsLayoutsFit(const StridedSpecialization& specialization, const int64_t* shape,
                    const std::vector<DType>& array_dtypes, const StridedArray* arrays,
                    DType out_dtype, const StridedArray& out) {
  const StridedSpecialization& spec = specialization;
  if (spec.dims != 2 || spec.out_step != RowStep::kUnit ||
      spec.in_steps.size() != array_dtypes.size()) {
    return false;
  }
  const int v = ElementsPerPack(array_dtypes, {}, out_dtype);
  if (shape[1] % v != 0) return false;
  // A row start is 16-byte aligned when the first one is and the row stride is a multiple
  // of 16 bytes.
  auto aligned_rows = [](const StridedArray& array, DType dtype) {
    const auto size = static_cast<int64_t>(DTypeSize(dtype));
    const auto first =
        reinterpret_cast<uintptr_t>(array.data) + static_cast<uintptr_t>(array.offset * size);
    return first % 16 == 0 && (array.strides[0] * size) % 16 == 0;
  };
  for (size_t a = 0; a < array_dtypes.size(); ++a) {
    const RowStep step = spec.in_steps[a];
    if (step == RowStep::kUnit ? !aligned_rows(arrays[a], array_dtypes[a])
                               : step != RowStep::kBroadcast && step != RowStep::kConstant) {
      return false;
    }
  }
  return aligned_rows(out, out_dtype);
}

}  // namespace gpucompute::cuda

#include "server/cuda/elementwise_codegen.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/expression/ir.h"

namespace gpucompute::cuda {
namespace {

using expr::Node;
using expr::OpKind;

constexpr char kVectorKernelName[] = "gpucompute_elementwise_vector";
constexpr char kScalarKernelName[] = "gpucompute_elementwise_scalar";
// The canonical text is repeated in a comment for whoever reads a dumped source; long
// expressions are cut short there (the cache key holds the whole source anyway).
constexpr size_t kMaxCommentChars = 400;

// Helpers shared by every generated kernel. Each mirrors one function of
// server/expression/scalar_ops.h; NVRTC provides the math functions and uint4 without any
// #include, and the fixed-width types are ours so that nothing depends on system headers.
constexpr char kPrelude[] = R"(namespace gc {
typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
static_assert(sizeof(i32) == 4 && sizeof(i64) == 8 && sizeof(uint4) == 16, "type sizes");

// Integer negation, abs, + - * wrap around modulo 2^bits: computed in the unsigned type.
__device__ __forceinline__ i32 Neg(i32 a) { return (i32)(0u - (u32)a); }
__device__ __forceinline__ i64 Neg(i64 a) { return (i64)(0ull - (u64)a); }
__device__ __forceinline__ i32 Abs(i32 a) { return a < 0 ? Neg(a) : a; }
__device__ __forceinline__ i64 Abs(i64 a) { return a < 0 ? Neg(a) : a; }
__device__ __forceinline__ i32 Add(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
__device__ __forceinline__ i64 Add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i32 Sub(i32 a, i32 b) { return (i32)((u32)a - (u32)b); }
__device__ __forceinline__ i64 Sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i32 Mul(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
__device__ __forceinline__ i64 Mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

// Integer power, wrapping; a negative exponent gives the real result truncated toward
// zero (ops::Pow).
template <typename T, typename U>
__device__ __forceinline__ T IntPow(T a, T b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b & 1) ? -1 : 1;
    return 0;
  }
  U result = 1;
  U base = (U)a;
  for (U e = (U)b; e != 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return (T)result;
}
__device__ __forceinline__ i32 Pow(i32 a, i32 b) { return IntPow<i32, u32>(a, b); }
__device__ __forceinline__ i64 Pow(i64 a, i64 b) { return IntPow<i64, u64>(a, b); }

// np.minimum / np.maximum: a NaN in either operand gives NaN (ops::Min, ops::Max).
template <typename T>
__device__ __forceinline__ T FloatMin(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T>
__device__ __forceinline__ T FloatMax(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T>
__device__ __forceinline__ T IntMin(T a, T b) { return a < b ? a : b; }
template <typename T>
__device__ __forceinline__ T IntMax(T a, T b) { return a > b ? a : b; }

// Float to integer (ops::Convert): NaN gives 0, values outside the range saturate.
// -2^(bits-1) is exact in both float types; 2^(bits-1) is the first value too large.
__device__ __forceinline__ i32 ToI32(float v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+31f) return -2147483647 - 1;
  if (v >= 0x1p+31f) return 2147483647;
  return (i32)v;
}
__device__ __forceinline__ i32 ToI32(double v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+31) return -2147483647 - 1;
  if (v >= 0x1p+31) return 2147483647;
  return (i32)v;
}
__device__ __forceinline__ i64 ToI64(float v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+63f) return -9223372036854775807ll - 1;
  if (v >= 0x1p+63f) return 9223372036854775807ll;
  return (i64)v;
}
__device__ __forceinline__ i64 ToI64(double v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+63) return -9223372036854775807ll - 1;
  if (v >= 0x1p+63) return 9223372036854775807ll;
  return (i64)v;
}

// kWords 16-byte words of an array, seen as its elements. The union is how CUDA code
// reinterprets registers; fully unrolled indexing keeps it out of local memory.
template <typename T, int kWords>
union Pack {
  uint4 q[kWords];
  T e[kWords * 16 / sizeof(T)];
};
}  // namespace gc
)";

// The C++ type of a value inside the kernel.
const char* ValueType(DType t) {
  switch (t) {
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

// The C++ type of an element in memory, and of a parameter argument: bool is one byte.
const char* StorageType(DType t) { return t == DType::kBool ? "gc::u8" : ValueType(t); }

// A literal that the compiler reads back as exactly `v` of dtype `t`: floats in hexadecimal
// (no decimal rounding), non-finite floats by their bits, the most negative integers as an
// expression (their magnitude is not a literal of the type).
std::string Literal(DType t, const expr::ConstantValue& v) {
  switch (t) {
    case DType::kBool:
      return v.i != 0 ? "true" : "false";
    case DType::kInt32:
      if (v.i == std::numeric_limits<int32_t>::min()) return "(-2147483647 - 1)";
      return absl::StrCat("(", static_cast<int32_t>(v.i), ")");
    case DType::kInt64:
      if (v.i == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807ll - 1)";
      return absl::StrCat("(", v.i, "ll)");
    case DType::kFloat32: {
      const float f = static_cast<float>(v.f);
      if (!std::isfinite(f)) {
        return absl::StrFormat("__int_as_float((int)0x%08xu)", std::bit_cast<uint32_t>(f));
      }
      return absl::StrFormat("(%af)", static_cast<double>(f));
    }
    case DType::kFloat64:
      if (!std::isfinite(v.f)) {
        return absl::StrFormat("__longlong_as_double((long long)0x%016xull)",
                               std::bit_cast<uint64_t>(v.f));
      }
      return absl::StrFormat("(%a)", v.f);
  }
  return "?";
}

// `x` of dtype `from` converted to `to` with ops::Convert semantics.
std::string Convert(DType from, DType to, const std::string& x) {
  if (from == to) return x;
  if (to == DType::kBool) return absl::StrCat("(", x, " != 0)");
  if (IsFloat(from) && IsInteger(to)) {
    return absl::StrCat(to == DType::kInt32 ? "gc::ToI32(" : "gc::ToI64(", x, ")");
  }
  return absl::StrCat("static_cast<", ValueType(to), ">(", x, ")");
}

// The float function of a unary op, in the operand's precision.
const char* FloatFunction(OpKind op, bool single) {
  switch (op) {
    case OpKind::kAbs:
      return single ? "fabsf" : "fabs";
    case OpKind::kSin:
      return single ? "sinf" : "sin";
    case OpKind::kCos:
      return single ? "cosf" : "cos";
    case OpKind::kTan:
      return single ? "tanf" : "tan";
    case OpKind::kExp:
      return single ? "expf" : "exp";
    case OpKind::kLog:
      return single ? "logf" : "log";
    case OpKind::kLog1p:
      return single ? "log1pf" : "log1p";
    case OpKind::kExpm1:
      return single ? "expm1f" : "expm1";
    case OpKind::kSqrt:  // IEEE, correctly rounded: never an approximation
      return single ? "__fsqrt_rn" : "__dsqrt_rn";
    case OpKind::kTanh:
      return single ? "tanhf" : "tanh";
    case OpKind::kSinh:
      return single ? "sinhf" : "sinh";
    case OpKind::kCosh:
      return single ? "coshf" : "cosh";
    case OpKind::kAsin:
      return single ? "asinf" : "asin";
    case OpKind::kAcos:
      return single ? "acosf" : "acos";
    case OpKind::kAtan:
      return single ? "atanf" : "atan";
    case OpKind::kFloor:
      return single ? "floorf" : "floor";
    case OpKind::kCeil:
      return single ? "ceilf" : "ceil";
    case OpKind::kPow:
      return single ? "powf" : "pow";
    case OpKind::kAtan2:
      return single ? "atan2f" : "atan2";
    default:
      return "?";
  }
}

const char* ComparisonOperator(OpKind op) {
  switch (op) {
    case OpKind::kLess:
      return "<";
    case OpKind::kLessEqual:
      return "<=";
    case OpKind::kGreater:
      return ">";
    case OpKind::kGreaterEqual:
      return ">=";
    case OpKind::kEqual:
      return "==";
    case OpKind::kNotEqual:
      return "!=";
    default:
      return "?";
  }
}

// `function(a, b)`, for an explicitly rounded float intrinsic.
std::string Rounded(const char* function, const std::string& a, const std::string& b) {
  return absl::StrCat(function, a, ", ", b, ")");
}

// The right-hand side computing `node` from its operands' names.
std::string Operation(const Node& node, const std::vector<Node>& nodes,
                      const std::vector<std::string>& names) {
  auto arg = [&](int a) -> const std::string& { return names[node.args[a]]; };
  const DType operand = node.num_args > 0 ? nodes[node.args[0]].dtype : node.dtype;
  const bool is_float = IsFloat(operand);
  const bool single = operand == DType::kFloat32;
  switch (node.op) {
    case OpKind::kCast:
      return Convert(operand, node.dtype, arg(0));
    case OpKind::kNeg:
      return is_float ? absl::StrCat("(-", arg(0), ")") : absl::StrCat("gc::Neg(", arg(0), ")");
    case OpKind::kAbs:
      if (!is_float) return absl::StrCat("gc::Abs(", arg(0), ")");
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ")");
    case OpKind::kSin:
    case OpKind::kCos:
    case OpKind::kTan:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kLog1p:
    case OpKind::kExpm1:
    case OpKind::kSqrt:
    case OpKind::kTanh:
    case OpKind::kSinh:
    case OpKind::kCosh:
    case OpKind::kAsin:
    case OpKind::kAcos:
    case OpKind::kAtan:
    case OpKind::kFloor:
    case OpKind::kCeil:
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ")");
    // Float + - * / as explicitly rounded intrinsics: the compiler never contracts them
    // into a fused multiply-add (which --fmad=true, kept for the math library's sake,
    // would do to plain operators), so a*x + y rounds twice, as on the CPU.
    case OpKind::kAdd:
      if (is_float) return Rounded(single ? "__fadd_rn(" : "__dadd_rn(", arg(0), arg(1));
      return absl::StrCat("gc::Add(", arg(0), ", ", arg(1), ")");
    case OpKind::kSub:
      if (is_float) return Rounded(single ? "__fsub_rn(" : "__dsub_rn(", arg(0), arg(1));
      return absl::StrCat("gc::Sub(", arg(0), ", ", arg(1), ")");
    case OpKind::kMul:
      if (is_float) return Rounded(single ? "__fmul_rn(" : "__dmul_rn(", arg(0), arg(1));
      return absl::StrCat("gc::Mul(", arg(0), ", ", arg(1), ")");
    case OpKind::kDiv:  // float only (ops::Div); IEEE whatever -prec-div says
      return Rounded(single ? "__fdiv_rn(" : "__ddiv_rn(", arg(0), arg(1));
    case OpKind::kPow:
      if (!is_float) return absl::StrCat("gc::Pow(", arg(0), ", ", arg(1), ")");
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ", ", arg(1), ")");
    case OpKind::kAtan2:  // float only
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ", ", arg(1), ")");
    case OpKind::kMin:
      return absl::StrCat(is_float ? "gc::FloatMin(" : "gc::IntMin(", arg(0), ", ", arg(1), ")");
    case OpKind::kMax:
      return absl::StrCat(is_float ? "gc::FloatMax(" : "gc::IntMax(", arg(0), ", ", arg(1), ")");
    case OpKind::kLess:
    case OpKind::kLessEqual:
    case OpKind::kGreater:
    case OpKind::kGreaterEqual:
    case OpKind::kEqual:
    case OpKind::kNotEqual:
      return absl::StrCat("(", arg(0), " ", ComparisonOperator(node.op), " ", arg(1), ")");
    case OpKind::kWhere:
      return absl::StrCat("(", arg(0), " ? ", arg(1), " : ", arg(2), ")");
    case OpKind::kInput:
    case OpKind::kConstant:
      break;
  }
  return "?";
}

// The nodes reachable from the root in depth-first post-order (arguments left to right).
// This order is a function of the expression tree, which canonical() renders, and not of
// how the compiler happened to number the nodes; iterative because a chain like x+x+...+x
// can be tens of thousands of nodes deep.
std::vector<int32_t> PostOrder(const expr::Ir& ir) {
  std::vector<int32_t> order;
  std::vector<char> seen(ir.nodes.size(), 0);
  std::vector<std::pair<int32_t, int>> stack = {{ir.root, 0}};
  seen[ir.root] = 1;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    const Node& n = ir.nodes[node];
    if (next < n.num_args) {
      const int32_t child = n.args[next++];
      if (!seen[child]) {
        seen[child] = 1;
        stack.push_back({child, 0});  // invalidates `node` and `next`
      }
      continue;
    }
    order.push_back(node);
    stack.pop_back();
  }
  return order;
}

// Whether `op` is computed by a CUDA math-library routine of tens of instructions or more
// (a loop, for integer pow), rather than a few instructions.
bool CallsMathLibrary(OpKind op) {
  switch (op) {
    case OpKind::kSin:
    case OpKind::kCos:
    case OpKind::kTan:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kLog1p:
    case OpKind::kExpm1:
    case OpKind::kTanh:
    case OpKind::kSinh:
    case OpKind::kCosh:
    case OpKind::kAsin:
    case OpKind::kAcos:
    case OpKind::kAtan:
    case OpKind::kPow:
    case OpKind::kAtan2:
      return true;
    default:
      return false;
  }
}

int64_t AlignUp(int64_t x, int64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

}  // namespace

ElementwiseSource GenerateElementwise(const expr::Program& program, DType out_dtype) {
  const expr::Ir& ir = program.ir();
  const auto& input_types = program.input_types();
  ElementwiseSource result;
  result.vector_kernel = std::string(kVectorKernelName);
  result.scalar_kernel = std::string(kScalarKernelName);
  ElementwiseSignature& sig = result.signature;
  sig.out_dtype = out_dtype;

  // Arrays become pointer arguments in input order; scalar inputs reach the kernel only
  // through the parameter constants derived from them.
  for (size_t k = 0; k < input_types.size(); ++k) {
    if (const auto* array = std::get_if<expr::ArrayInput>(&input_types[k])) {
      sig.array_inputs.push_back(static_cast<int32_t>(k));
      sig.array_dtypes.push_back(array->dtype);
    }
  }
  for (const Node& node : ir.nodes) {
    if (node.op != OpKind::kConstant || node.parameter < 0) continue;
    if (sig.parameter_dtypes.size() <= static_cast<size_t>(node.parameter)) {
      sig.parameter_dtypes.resize(node.parameter + 1, DType::kFloat64);
    }
    sig.parameter_dtypes[node.parameter] = node.dtype;
  }
  const int num_arrays = static_cast<int>(sig.array_inputs.size());
  const int num_parameters = static_cast<int>(sig.parameter_dtypes.size());

  // A pack is 16 bytes of the narrowest array, so every array moves in whole 16-byte words.
  size_t min_size = DTypeSize(out_dtype);
  for (DType t : sig.array_dtypes) min_size = std::min(min_size, DTypeSize(t));
  const int v = static_cast<int>(16 / min_size);
  sig.elements_per_pack = v;
  auto words = [&](DType t) { return static_cast<int>(v * DTypeSize(t) / 16); };
  // Two packs in flight per thread give each thread more independent loads (latency
  // hiding when registers limit occupancy), but wide mixes (float64 arrays with a bool
  // output: 128 bytes per array per pack) would only add register pressure. So would
  // math-library calls, which make an expression compute-bound: a pack already holds
  // enough independent work, and the second pack's registers cost occupancy (the
  // reference expression in float32: 40 registers with two packs, 30 with one).
  int64_t load_bytes = 0;
  for (DType t : sig.array_dtypes) load_bytes += int64_t{v} * static_cast<int64_t>(DTypeSize(t));
  const std::vector<int32_t> order = PostOrder(ir);
  const bool calls_math_library = std::any_of(
      order.begin(), order.end(), [&](int32_t i) { return CallsMathLibrary(ir.nodes[i].op); });
  if (calls_math_library) {
    sig.packs_per_thread = 1;
  } else if (load_bytes == 0) {
    sig.packs_per_thread = kElementwisePacksPerThread;
  } else {
    sig.packs_per_thread = static_cast<int>(std::clamp<int64_t>(
        kElementwiseMaxLoadBytesPerIteration / load_bytes, 1, kElementwisePacksPerThread));
  }
  sig.threads_per_block = kElementwiseThreadsPerBlock;

  int64_t arg_bytes = 8 * (num_arrays + 2);  // pointers, out, n
  for (DType t : sig.parameter_dtypes) {
    const auto size = static_cast<int64_t>(DTypeSize(t));
    arg_bytes = AlignUp(arg_bytes, size) + size;
  }
  sig.argument_bytes = arg_bytes;

  // ---- the per-element function ----
  std::string& src = result.source;
  std::string canonical = program.canonical();
  if (canonical.size() > kMaxCommentChars) {
    canonical.resize(kMaxCommentChars);
    canonical += " ...";
  }
  absl::StrAppend(&src,
                  "// Generated by gpucompute (server/cuda/elementwise_codegen.cc) for\n//   ",
                  canonical, " -> ", DTypeName(out_dtype), "\n", kPrelude, "\n");

  auto array_name = [](int k) { return absl::StrCat("x", k); };
  auto param_name = [](int p) { return absl::StrCat("p", p); };
  absl::StrAppend(&src, "namespace {\n__device__ __forceinline__ ", ValueType(out_dtype),
                  " Element(");
  {
    std::vector<std::string> params;
    for (int a = 0; a < num_arrays; ++a) {
      params.push_back(
          absl::StrCat(ValueType(sig.array_dtypes[a]), " ", array_name(sig.array_inputs[a])));
    }
    for (int p = 0; p < num_parameters; ++p) {
      params.push_back(absl::StrCat(ValueType(sig.parameter_dtypes[p]), " ", param_name(p)));
    }
    absl::StrAppend(&src, absl::StrJoin(params, ", "), ") {\n");
  }
  std::vector<std::string> names(ir.nodes.size());
  int next_value = 0;
  for (int32_t i : order) {
    const Node& node = ir.nodes[i];
    if (node.op == OpKind::kInput) {
      names[i] = array_name(node.input);
      continue;
    }
    if (node.op == OpKind::kConstant && node.parameter >= 0) {
      names[i] = param_name(node.parameter);
      continue;
    }
    const std::string rhs = node.op == OpKind::kConstant ? Literal(node.dtype, node.value)
                                                         : Operation(node, ir.nodes, names);
    names[i] = absl::StrCat("v", next_value++);
    absl::StrAppend(&src, "  const ", ValueType(node.dtype), " ", names[i], " = ", rhs, ";\n");
  }
  absl::StrAppend(&src, "  return ", Convert(ir.nodes[ir.root].dtype, out_dtype, names[ir.root]),
                  ";\n}\n}  // namespace\n\n");

  // ---- the kernels ----
  // Kernel arguments. No __restrict__: `out` may be one of the inputs (in place), and
  // restrict would promise the compiler otherwise. Nothing is lost by it: each grid-stride
  // iteration already issues all its loads before its stores in program order, which is
  // the reordering restrict would have allowed.
  std::string kernel_params;
  {
    std::vector<std::string> params;
    for (int a = 0; a < num_arrays; ++a) {
      params.push_back(
          absl::StrCat("const ", StorageType(sig.array_dtypes[a]), "* in", sig.array_inputs[a]));
    }
    params.push_back(absl::StrCat(StorageType(out_dtype), "* out"));
    params.push_back("gc::i64 n");
    for (int p = 0; p < num_parameters; ++p) {
      params.push_back(absl::StrCat(StorageType(sig.parameter_dtypes[p]), " ", param_name(p)));
    }
    kernel_params = absl::StrJoin(params, ", ");
  }
  // Arguments of Element(): `element(a)` is array a's element as stored.
  auto element_call = [&](auto element) {
    std::vector<std::string> args;
    for (int a = 0; a < num_arrays; ++a) {
      std::string e = element(a);
      args.push_back(sig.array_dtypes[a] == DType::kBool ? absl::StrCat("(", e, " != 0)") : e);
    }
    for (int p = 0; p < num_parameters; ++p) {
      args.push_back(sig.parameter_dtypes[p] == DType::kBool
                         ? absl::StrCat("(", param_name(p), " != 0)")
                         : param_name(p));
    }
    std::string call = absl::StrCat("Element(", absl::StrJoin(args, ", "), ")");
    return out_dtype == DType::kBool ? absl::StrCat("static_cast<gc::u8>(", call, ")") : call;
  };
  const std::string scalar_element =
      element_call([&](int a) { return absl::StrCat("in", sig.array_inputs[a], "[i]"); });
  const std::string launch_bounds = absl::StrCat("__launch_bounds__(", sig.threads_per_block, ")");

  // The vectorised kernel. Pack j of an iteration is pack base + j * stride, so that at
  // each j consecutive threads touch consecutive 16-byte words (coalesced).
  absl::StrAppend(&src, "extern \"C\" __global__ void ", launch_bounds, "\n", kVectorKernelName,
                  "(", kernel_params, ") {\n");
  absl::StrAppend(&src, "  constexpr int kV = ", v,
                  ";  // elements per pack: 16 bytes of the narrowest array\n",
                  "  constexpr int kPacks = ", sig.packs_per_thread,
                  ";  // packs per thread per iteration\n", "  const gc::i64 packs = n / kV;\n",
                  "  const gc::i64 first = (gc::i64)blockIdx.x * blockDim.x + threadIdx.x;\n",
                  "  const gc::i64 stride = (gc::i64)gridDim.x * blockDim.x;\n",
                  "  for (gc::i64 base = first; base < packs; base += stride * kPacks) {\n");
  for (int a = 0; a < num_arrays; ++a) {
    absl::StrAppend(&src, "    gc::Pack<", StorageType(sig.array_dtypes[a]), ", ",
                    words(sig.array_dtypes[a]), "> a", sig.array_inputs[a], "[kPacks] = {};\n");
  }
  absl::StrAppend(&src, "    gc::Pack<", StorageType(out_dtype), ", ", words(out_dtype),
                  "> r[kPacks];\n");
  absl::StrAppend(&src,
                  "#pragma unroll\n"
                  "    for (int j = 0; j < kPacks; ++j) {\n"
                  "      const gc::i64 pack = base + j * stride;\n"
                  "      if (pack < packs) {\n");
  for (int a = 0; a < num_arrays; ++a) {
    const int k = sig.array_inputs[a];
    const int w = words(sig.array_dtypes[a]);
    absl::StrAppend(&src, "#pragma unroll\n        for (int w = 0; w < ", w, "; ++w) a", k,
                    "[j].q[w] = reinterpret_cast<const uint4*>(in", k, ")[pack * ", w, " + w];\n");
  }
  absl::StrAppend(
      &src,
      "      }\n"
      "    }\n"
      "#pragma unroll\n"
      "    for (int j = 0; j < kPacks; ++j) {\n"
      "#pragma unroll\n"
      "      for (int e = 0; e < kV; ++e) r[j].e[e] = ",
      element_call([&](int a) { return absl::StrCat("a", sig.array_inputs[a], "[j].e[e]"); }),
      ";\n    }\n");
  const int out_words = words(out_dtype);
  absl::StrAppend(&src,
                  "#pragma unroll\n"
                  "    for (int j = 0; j < kPacks; ++j) {\n"
                  "      const gc::i64 pack = base + j * stride;\n"
                  "      if (pack < packs) {\n"
                  "#pragma unroll\n"
                  "        for (int w = 0; w < ",
                  out_words, "; ++w) reinterpret_cast<uint4*>(out)[pack * ", out_words,
                  " + w] = r[j].q[w];\n"
                  "      }\n"
                  "    }\n"
                  "  }\n");
  absl::StrAppend(&src,
                  "  // The last n % kV elements, one per thread.\n"
                  "  if (first < n - packs * kV) {\n"
                  "    const gc::i64 i = packs * kV + first;\n"
                  "    out[i] = ",
                  scalar_element, ";\n  }\n}\n\n");

  // The scalar kernel, for arrays not all 16-byte aligned.
  absl::StrAppend(&src, "extern \"C\" __global__ void ", launch_bounds, "\n", kScalarKernelName,
                  "(", kernel_params, ") {\n",
                  "  const gc::i64 stride = (gc::i64)gridDim.x * blockDim.x;\n",
                  "  for (gc::i64 i = (gc::i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                  "i += stride) {\n",
                  "    out[i] = ", scalar_element, ";\n  }\n}\n");
  return result;
}

}  // namespace gpucompute::cuda

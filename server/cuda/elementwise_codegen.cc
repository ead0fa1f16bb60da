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

// The canonical text is repeated in a comment for whoever reads a dumped source; long
// expressions are cut short there (the cache key holds the whole source anyway).
constexpr size_t kMaxCommentChars = 400;

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
  return absl::StrCat("static_cast<", ElementwiseValueType(to), ">(", x, ")");
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

}  // namespace

ElementFunction GenerateElementFunction(const expr::Program& program, DType out_dtype) {
  const expr::Ir& ir = program.ir();
  const auto& input_types = program.input_types();
  ElementFunction result;

  // Arrays become pointer arguments in input order; scalar inputs reach the kernel only
  // through the parameter constants derived from them.
  for (size_t k = 0; k < input_types.size(); ++k) {
    if (const auto* array = std::get_if<expr::ArrayInput>(&input_types[k])) {
      result.array_inputs.push_back(static_cast<int32_t>(k));
      result.array_dtypes.push_back(array->dtype);
    }
  }
  for (const Node& node : ir.nodes) {
    if (node.op != OpKind::kConstant || node.parameter < 0) continue;
    if (result.parameter_dtypes.size() <= static_cast<size_t>(node.parameter)) {
      result.parameter_dtypes.resize(node.parameter + 1, DType::kFloat64);
    }
    result.parameter_dtypes[node.parameter] = node.dtype;
  }
  const std::vector<int32_t> order = PostOrder(ir);
  result.calls_math_library = std::any_of(
      order.begin(), order.end(), [&](int32_t i) { return CallsMathLibrary(ir.nodes[i].op); });

  std::string canonical = program.canonical();
  if (canonical.size() > kMaxCommentChars) {
    canonical.resize(kMaxCommentChars);
    canonical += " ...";
  }
  result.header =
      absl::StrCat("// Generated by gpucompute (server/cuda/elementwise_codegen.cc) for\n//   ",
                   canonical, " -> ", DTypeName(out_dtype), "\n");

  // The per-element function's body: one statement per computed node, in post-order, over
  // the arguments x<k> (array input k) and p<i> (parameter i).
  std::vector<std::string> body;
  std::vector<std::string> names(ir.nodes.size());
  int next_value = 0;
  for (int32_t i : order) {
    const Node& node = ir.nodes[i];
    if (node.op == OpKind::kInput) {
      names[i] = absl::StrCat("x", node.input);
      continue;
    }
    if (node.op == OpKind::kConstant && node.parameter >= 0) {
      names[i] = absl::StrCat("p", node.parameter);
      continue;
    }
    const std::string rhs = node.op == OpKind::kConstant ? Literal(node.dtype, node.value)
                                                         : Operation(node, ir.nodes, names);
    names[i] = absl::StrCat("v", next_value++);
    body.push_back(
        absl::StrCat("  const ", ElementwiseValueType(node.dtype), " ", names[i], " = ", rhs, ";"));
  }
  body.push_back(
      absl::StrCat("  return ", Convert(ir.nodes[ir.root].dtype, out_dtype, names[ir.root]), ";"));
  result.body = absl::StrJoin(body, "\n");
  return result;
}

ElementwiseSource GenerateElementwise(const expr::Program& program, DType out_dtype) {
  ElementFunction element = GenerateElementFunction(program, out_dtype);
  ElementwiseSource result;
  result.vector_kernel = std::string(kElementwiseVectorKernel);
  result.scalar_kernel = std::string(kElementwiseScalarKernel);
  ElementwiseSignature& sig = result.signature;
  sig.out_dtype = out_dtype;
  sig.array_inputs = std::move(element.array_inputs);
  sig.array_dtypes = std::move(element.array_dtypes);
  sig.parameter_dtypes = std::move(element.parameter_dtypes);
  PlanElementwiseKernel(element.calls_math_library, &sig);
  result.source = ElementwiseKernelSource(sig, element.header, element.body);
  return result;
}

}  // namespace gpucompute::cuda

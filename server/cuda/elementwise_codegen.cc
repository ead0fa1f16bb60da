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
#include "absl/strings/string_view.h"
#include "server/expression/ir.h"
#include "server/expression/scalar_ops.h"

namespace gpucompute::cuda {
namespace {

using expr::Node;
using expr::OpKind;
namespace ops = expr::ops;

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

// The CUDA math function of a float op, in the operand's precision (the float32 one ends
// in 'f'). rint, trunc, floor, ceil, copysign and fmod are exact, as on the CPU; sqrt is
// the IEEE, correctly rounded intrinsic, never an approximation.
std::string FloatFunction(OpKind op, bool single) {
  if (op == OpKind::kSqrt) return single ? "__fsqrt_rn" : "__dsqrt_rn";
  constexpr std::pair<OpKind, const char*> kFunctions[] = {
      {OpKind::kAbs, "fabs"},    {OpKind::kSin, "sin"},           {OpKind::kCos, "cos"},
      {OpKind::kTan, "tan"},     {OpKind::kExp, "exp"},           {OpKind::kLog, "log"},
      {OpKind::kLog1p, "log1p"}, {OpKind::kExpm1, "expm1"},       {OpKind::kTanh, "tanh"},
      {OpKind::kSinh, "sinh"},   {OpKind::kCosh, "cosh"},         {OpKind::kAsin, "asin"},
      {OpKind::kAcos, "acos"},   {OpKind::kAtan, "atan"},         {OpKind::kFloor, "floor"},
      {OpKind::kCeil, "ceil"},   {OpKind::kRint, "rint"},         {OpKind::kTrunc, "trunc"},
      {OpKind::kExp2, "exp2"},   {OpKind::kLog2, "log2"},         {OpKind::kLog10, "log10"},
      {OpKind::kCbrt, "cbrt"},   {OpKind::kAsinh, "asinh"},       {OpKind::kAcosh, "acosh"},
      {OpKind::kAtanh, "atanh"}, {OpKind::kPow, "pow"},           {OpKind::kAtan2, "atan2"},
      {OpKind::kHypot, "hypot"}, {OpKind::kCopysign, "copysign"}, {OpKind::kFmod, "fmod"},
  };
  for (const auto& [kind, name] : kFunctions) {
    if (kind == op) return absl::StrCat(name, single ? "f" : "");
  }
  return "?";
}

// The C operator of a comparison, a bitwise or a logical op.
const char* InfixOperator(OpKind op) {
  switch (op) {
    case OpKind::kBitAnd:
      return "&";
    case OpKind::kBitOr:
      return "|";
    case OpKind::kBitXor:
      return "^";
    case OpKind::kLogicalAnd:
      return "&&";
    case OpKind::kLogicalOr:
      return "||";
    case OpKind::kLogicalXor:
      return "!=";
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
  if (node.op >= OpKind::kSin && node.op <= OpKind::kAtanh) {  // a float math function
    return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ")");
  }
  switch (node.op) {
    case OpKind::kCast:
      return Convert(operand, node.dtype, arg(0));
    case OpKind::kNeg:
      return is_float ? absl::StrCat("(-", arg(0), ")") : absl::StrCat("gc::Neg(", arg(0), ")");
    case OpKind::kAbs:
      if (!is_float) return absl::StrCat("gc::Abs(", arg(0), ")");
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ")");
    case OpKind::kDegrees:  // one correctly rounded multiply by ops' factor: exact match
      return Rounded(single ? "__fmul_rn(" : "__dmul_rn(", arg(0),
                     single ? Literal(operand, {0, ops::kDegreesPerRadian<float>})
                            : Literal(operand, {0, ops::kDegreesPerRadian<double>}));
    case OpKind::kRadians:
      return Rounded(single ? "__fmul_rn(" : "__dmul_rn(", arg(0),
                     single ? Literal(operand, {0, ops::kRadiansPerDegree<float>})
                            : Literal(operand, {0, ops::kRadiansPerDegree<double>}));
    case OpKind::kSign:
      return absl::StrCat(is_float ? "gc::FloatSign(" : "gc::Sign(", arg(0), ")");
    case OpKind::kSquare:
      if (is_float) return Rounded(single ? "__fmul_rn(" : "__dmul_rn(", arg(0), arg(0));
      return absl::StrCat("gc::Mul(", arg(0), ", ", arg(0), ")");
    case OpKind::kReciprocal:
      if (is_float)
        return Rounded(single ? "__fdiv_rn(" : "__ddiv_rn(", single ? "1.0f" : "1.0", arg(0));
      return absl::StrCat("gc::Reciprocal(", arg(0), ")");
    case OpKind::kInvert:
      return absl::StrCat(operand == DType::kBool ? "(!" : "(~", arg(0), ")");
    case OpKind::kLogicalNot:
      return absl::StrCat("(!", arg(0), ")");
    // The float tests are constants for integers and bools (ops::IsNan, ...).
    case OpKind::kIsNan:
      return is_float ? absl::StrCat("(", arg(0), " != ", arg(0), ")") : "false";
    case OpKind::kIsInf:
      return is_float ? absl::StrCat("gc::IsInf(", arg(0), ")") : "false";
    case OpKind::kIsFinite:
      return is_float ? absl::StrCat("gc::IsFinite(", arg(0), ")") : "true";
    case OpKind::kSignbit:
      if (is_float) return absl::StrCat("gc::Signbit(", arg(0), ")");
      return operand == DType::kBool ? "false" : absl::StrCat("(", arg(0), " < 0)");
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
    case OpKind::kHypot:  // float only; see gc::Hypot
      return absl::StrCat("gc::Hypot(", arg(0), ", ", arg(1), ")");
    case OpKind::kAtan2:  // float only
    case OpKind::kCopysign:
      return absl::StrCat(FloatFunction(node.op, single), "(", arg(0), ", ", arg(1), ")");
    case OpKind::kMin:
      return absl::StrCat(is_float ? "gc::FloatMin(" : "gc::IntMin(", arg(0), ", ", arg(1), ")");
    case OpKind::kMax:
      return absl::StrCat(is_float ? "gc::FloatMax(" : "gc::IntMax(", arg(0), ", ", arg(1), ")");
    case OpKind::kFmin:
      return absl::StrCat(is_float ? "gc::FloatFmin(" : "gc::IntMin(", arg(0), ", ", arg(1), ")");
    case OpKind::kFmax:
      return absl::StrCat(is_float ? "gc::FloatFmax(" : "gc::IntMax(", arg(0), ", ", arg(1), ")");
    case OpKind::kFloorDiv:
      return absl::StrCat("gc::FloorDiv(", arg(0), ", ", arg(1), ")");
    case OpKind::kMod:
      return absl::StrCat("gc::Mod(", arg(0), ", ", arg(1), ")");
    case OpKind::kFmod:
      return absl::StrCat("gc::Fmod(", arg(0), ", ", arg(1), ")");
    case OpKind::kLeftShift:
      return absl::StrCat("gc::LeftShift(", arg(0), ", ", arg(1), ")");
    case OpKind::kRightShift:
      return absl::StrCat("gc::RightShift(", arg(0), ", ", arg(1), ")");
    case OpKind::kBitAnd:
    case OpKind::kBitOr:
    case OpKind::kBitXor:
    case OpKind::kLogicalAnd:
    case OpKind::kLogicalOr:
    case OpKind::kLogicalXor:
    case OpKind::kLess:
    case OpKind::kLessEqual:
    case OpKind::kGreater:
    case OpKind::kGreaterEqual:
    case OpKind::kEqual:
    case OpKind::kNotEqual:
      return absl::StrCat("(", arg(0), " ", InfixOperator(node.op), " ", arg(1), ")");
    case OpKind::kWhere:
      return absl::StrCat("(", arg(0), " ? ", arg(1), " : ", arg(2), ")");
    default:  // leaves, and the math functions handled above
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
    case OpKind::kExp2:
    case OpKind::kLog2:
    case OpKind::kLog10:
    case OpKind::kCbrt:
    case OpKind::kAsinh:
    case OpKind::kAcosh:
    case OpKind::kAtanh:
    case OpKind::kPow:
    case OpKind::kAtan2:
    case OpKind::kHypot:
    case OpKind::kFloorDiv:  // float fmod is a loop
    case OpKind::kMod:
    case OpKind::kFmod:
      return true;
    default:
      return false;
  }
}

}  // namespace

ElementFunction GenerateElementFunction(const expr::Program& program, DType out_dtype,
                                        absl::string_view kernel) {
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
                   canonical, " -> ", DTypeName(out_dtype), kernel, "\n");

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

namespace {

// The signature of a kernel of `element` writing `out_dtype`, planned as
// PlanElementwiseKernel plans it.
ElementwiseSignature PlannedSignature(ElementFunction& element, DType out_dtype,
                                      std::vector<bool> constant_arrays = {}) {
  ElementwiseSignature sig;
  sig.out_dtype = out_dtype;
  sig.array_inputs = std::move(element.array_inputs);
  sig.array_dtypes = std::move(element.array_dtypes);
  if (std::find(constant_arrays.begin(), constant_arrays.end(), true) != constant_arrays.end()) {
    sig.array_constant = std::move(constant_arrays);
  }
  sig.parameter_dtypes = std::move(element.parameter_dtypes);
  PlanElementwiseKernel(element.calls_math_library, &sig);
  return sig;
}

}  // namespace

ElementwiseSource GenerateElementwise(const expr::Program& program, DType out_dtype,
                                      const std::vector<bool>& constant_arrays) {
  ElementFunction element = GenerateElementFunction(program, out_dtype);
  ElementwiseSource result;
  result.vector_kernel = std::string(kElementwiseVectorKernel);
  result.scalar_kernel = std::string(kElementwiseScalarKernel);
  result.signature = PlannedSignature(element, out_dtype, constant_arrays);
  result.source = ElementwiseKernelSource(result.signature, element.header, element.body);
  return result;
}

StridedElementwiseSource GenerateElementwiseStrided(const expr::Program& program,
                                                    DType out_dtype,
                                                    const StridedSpecialization& specialization) {
  ElementFunction element = GenerateElementFunction(
      program, out_dtype, absl::StrCat(", strided ", specialization.Name()));
  StridedElementwiseSource result;
  result.kernel =
      std::string(specialization.rows ? kElementwiseRowsKernel : kElementwiseStridedKernel);
  result.signature = PlannedSignature(element, out_dtype);
  result.source = ElementwiseStridedKernelSource(result.signature, specialization,
                                                 element.header, element.body);
  result.specialization = specialization;
  return result;
}

}  // namespace gpucompute::cuda

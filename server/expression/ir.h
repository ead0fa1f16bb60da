// The typed intermediate representation of a compiled elementwise expression. Every
// backend evaluates this and only this: the CPU backend turns it into a register program
// (server/cpu/elementwise.cc), a CUDA backend can emit one fused kernel from it. Plain C++.
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_IR_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_IR_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace gpucompute::expr {

enum class OpKind : uint8_t {
  // Leaves.
  kInput,     // reads array input `Node::input` (an index into Program::inputs())
  kConstant,  // `Node::value`, already converted to `Node::dtype`
  // index(k): the element's coordinate along axis k of the result, int64. k is
  // `Node::value.i` as written (negative counts from the end); the planner checks it
  // against the result's rank, and a backend resolves it against that rank.
  kIndex,
  // Conversion with ops::Convert semantics (bool reads as != 0; float to integer
  // saturates, NaN gives 0). The type checker inserts these wherever NumPy promotion
  // changes an operand's dtype, and for the casts bool(x), int32(x), ... of the language.
  kCast,
  // Unary, operand dtype == node dtype.
  kNeg,  // int (wrapping) or float
  kAbs,  // int (wrapping: abs(INT_MIN) == INT_MIN) or float
  kSin,  // kSin..kRadians: float32 or float64 only
  kCos,
  kTan,
  kExp,
  kLog,
  kLog1p,
  kExpm1,
  kSqrt,
  kTanh,
  kSinh,
  kCosh,
  kAsin,
  kAcos,
  kAtan,
  kFloor,
  kCeil,
  kRint,  // round half to even
  kTrunc,
  kExp2,
  kLog2,
  kLog10,
  kCbrt,
  kAsinh,
  kAcosh,
  kAtanh,
  kDegrees,
  kRadians,
  kSign,        // int or float (NaN stays NaN)
  kSquare,      // int (wrapping) or float
  kReciprocal,  // int (see scalar_ops.h) or float
  kInvert,      // int (~) or bool (logical not)
  kLogicalNot,  // bool only
  // Float tests: the operand has any dtype, the node's dtype is kBool.
  kIsNan,
  kIsInf,
  kIsFinite,
  kSignbit,
  // Binary, both operand dtypes == node dtype.
  kAdd,         // int (wrapping) or float
  kSub,         // int (wrapping) or float
  kMul,         // int (wrapping) or float
  kDiv,         // float only (integer true division is cast to float64 first)
  kPow,         // int (see scalar_ops.h for negative exponents) or float
  kMin,         // any dtype; NaN-propagating for floats (np.minimum)
  kMax,         // any dtype; NaN-propagating for floats (np.maximum)
  kAtan2,       // float only; args are (y, x)
  kFloorDiv,    // int (floor; / 0 gives 0) or float (npy_divmod)
  kMod,         // int (sign of the divisor; % 0 gives 0) or float (npy_divmod)
  kFmod,        // int (sign of the dividend; % 0 gives 0) or float (C fmod)
  kHypot,       // float only
  kCopysign,    // float only
  kFmax,        // any dtype; a NaN operand yields the other (np.fmax)
  kFmin,        // any dtype; a NaN operand yields the other (np.fmin)
  kBitAnd,      // int or bool
  kBitOr,       // int or bool
  kBitXor,      // int or bool
  kLeftShift,   // int only; shifts outside [0, bits) give 0
  kRightShift,  // int only, arithmetic; shifts outside [0, bits) give 0 or -1
  kLogicalAnd,  // bool only
  kLogicalOr,   // bool only
  kLogicalXor,  // bool only
  // Comparisons: both operands have the same dtype (any), the node's dtype is kBool.
  kLess,
  kLessEqual,
  kGreater,
  kGreaterEqual,
  kEqual,
  kNotEqual,
  // args[0] is kBool; args[1] and args[2] have the node's dtype.
  kWhere,
};

inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kWhere) + 1;

constexpr int OpArity(OpKind op) {
  if (op == OpKind::kInput || op == OpKind::kConstant || op == OpKind::kIndex) return 0;
  if (op == OpKind::kWhere) return 3;
  if (op >= OpKind::kAdd) return 2;
  return 1;
}

constexpr bool IsComparison(OpKind op) { return op >= OpKind::kLess && op <= OpKind::kNotEqual; }

// The unary ops whose result is kBool whatever their operand's dtype.
constexpr bool IsFloatTest(OpKind op) { return op >= OpKind::kIsNan && op <= OpKind::kSignbit; }

// The lower-case name used in Program::canonical(): the source name of the older
// functions, NumPy's ufunc name of the others.
constexpr std::string_view OpName(OpKind op) {
  constexpr std::string_view kNames[] = {
      "input",       "const",        "index",       "cast",        "neg",         "abs",         "sin",
      "cos",         "tan",          "exp",         "log",         "log1p",       "expm1",
      "sqrt",        "tanh",         "sinh",        "cosh",        "asin",        "acos",
      "atan",        "floor",        "ceil",        "rint",        "trunc",       "exp2",
      "log2",        "log10",        "cbrt",        "arcsinh",     "arccosh",     "arctanh",
      "degrees",     "radians",      "sign",        "square",      "reciprocal",  "invert",
      "logical_not", "isnan",        "isinf",       "isfinite",    "signbit",     "add",
      "sub",         "mul",          "div",         "pow",         "min",         "max",
      "atan2",       "floor_divide", "remainder",   "fmod",        "hypot",       "copysign",
      "fmax",        "fmin",         "bitwise_and", "bitwise_or",  "bitwise_xor", "left_shift",
      "right_shift", "logical_and",  "logical_or",  "logical_xor", "lt",          "le",
      "gt",          "ge",           "eq",          "ne",          "where"};
  static_assert(std::size(kNames) == kNumOpKinds);
  return kNames[static_cast<int>(op)];
}

// A constant's value: bool (0 or 1) and integer dtypes use `i`, float dtypes use `f`
// (a float32 constant holds a value exactly representable as float).
struct ConstantValue {
  int64_t i = 0;
  double f = 0;
};

struct Node {
  OpKind op = OpKind::kConstant;
  DType dtype = DType::kFloat64;               // the dtype this node produces
  uint8_t num_args = 0;                        // OpArity(op)
  std::array<int32_t, 3> args = {-1, -1, -1};  // indices of earlier nodes
  int32_t input = -1;                          // kInput: index into Program::inputs()
  ConstantValue value;                         // kConstant; kIndex: k in value.i
  // kConstant only: -1 for a value fixed by the expression text (a literal, or arithmetic
  // on literals); otherwise this constant derives from a scalar input and is parameter
  // number `parameter` (numbered 0, 1, ... in node order). Program::canonical() shows a
  // parameter by number, not value, so a cached compiled kernel must take parameters as
  // launch arguments (read from `value`) and may bake only the literals into its code.
  int32_t parameter = -1;
};

// Nodes are in topological order (arguments before their users), every node is reachable
// from `root`, and no two nodes are identical (common subexpressions are shared; parameter
// constants are never merged). Operand dtypes always satisfy the comments on OpKind: all
// NumPy promotion has been made explicit with kCast nodes and converted constants.
struct Ir {
  std::vector<Node> nodes;
  int32_t root = -1;
};

// The axes that index(k) nodes of `ir` read, as written (negative counting from the end).
inline std::vector<int64_t> IndexAxes(const Ir& ir) {
  std::vector<int64_t> axes;
  for (const Node& node : ir.nodes) {
    if (node.op == OpKind::kIndex) axes.push_back(node.value.i);
  }
  return axes;
}

// Axis k (IndexAxes) of a result of rank `ndim`, as a number in [0, ndim).
constexpr int ResolveIndexAxis(int64_t k, int ndim) {
  return static_cast<int>(k < 0 ? k + ndim : k);
}

}  // namespace gpucompute::expr

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_IR_H_

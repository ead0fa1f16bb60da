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
  // Conversion with C++ static_cast semantics (bool reads as != 0). The type checker
  // inserts these wherever NumPy promotion changes an operand's dtype.
  kCast,
  // Unary, operand dtype == node dtype.
  kNeg,  // int (wrapping) or float
  kAbs,  // int (wrapping: abs(INT_MIN) == INT_MIN) or float
  kSin,  // kSin..kCeil: float32 or float64 only
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
  // Binary, both operand dtypes == node dtype.
  kAdd,    // int (wrapping) or float
  kSub,    // int (wrapping) or float
  kMul,    // int (wrapping) or float
  kDiv,    // float only (integer true division is cast to float64 first)
  kPow,    // int (see scalar_ops.h for negative exponents) or float
  kMin,    // any dtype; NaN-propagating for floats (np.minimum)
  kMax,    // any dtype; NaN-propagating for floats (np.maximum)
  kAtan2,  // float only; args are (y, x)
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
  if (op == OpKind::kInput || op == OpKind::kConstant) return 0;
  if (op == OpKind::kWhere) return 3;
  if (op >= OpKind::kAdd) return 2;
  return 1;
}

constexpr bool IsComparison(OpKind op) { return op >= OpKind::kLess && op <= OpKind::kNotEqual; }

// The lower-case name used in Program::canonical() (and the source name of functions).
constexpr std::string_view OpName(OpKind op) {
  constexpr std::string_view kNames[] = {
      "input", "const", "cast",  "neg",  "abs",  "sin",  "cos",  "tan",  "exp",
      "log",   "log1p", "expm1", "sqrt", "tanh", "sinh", "cosh", "asin", "acos",
      "atan",  "floor", "ceil",  "add",  "sub",  "mul",  "div",  "pow",  "min",
      "max",   "atan2", "lt",    "le",   "gt",   "ge",   "eq",   "ne",   "where"};
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
  ConstantValue value;                         // kConstant
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

}  // namespace gpucompute::expr

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_IR_H_

// The functions of the expression language: each name, its argument count, and how the
// compiler builds its call. Internal to the compiler (expression.cc).
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_FUNCTIONS_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_FUNCTIONS_H_

#include <cstdint>
#include <string_view>

#include "kernels/dtype.h"
#include "server/expression/ir.h"

namespace gpucompute::expr::internal {

// How a function's call is compiled: most are one IR operation (kOp); the others are
// built from several, or from none.
enum class Form : uint8_t { kOp, kWhere, kClip, kRound, kPositive, kCast, kIndex };

struct FunctionInfo {
  std::string_view name;
  OpKind op;
  int8_t min_args;
  int8_t max_args;
  Form form = Form::kOp;
  DType cast = DType::kFloat64;  // Form::kCast: the target
};

constexpr FunctionInfo Fn(std::string_view name, OpKind op, int8_t args) {
  return {name, op, args, args};
}

// NumPy's names, and the short names of the first version of the language.
inline constexpr FunctionInfo kFunctions[] = {
    Fn("sin", OpKind::kSin, 1),
    Fn("cos", OpKind::kCos, 1),
    Fn("tan", OpKind::kTan, 1),
    Fn("exp", OpKind::kExp, 1),
    Fn("log", OpKind::kLog, 1),
    Fn("log1p", OpKind::kLog1p, 1),
    Fn("expm1", OpKind::kExpm1, 1),
    Fn("sqrt", OpKind::kSqrt, 1),
    Fn("abs", OpKind::kAbs, 1),
    Fn("absolute", OpKind::kAbs, 1),
    Fn("negative", OpKind::kNeg, 1),
    Fn("tanh", OpKind::kTanh, 1),
    Fn("sinh", OpKind::kSinh, 1),
    Fn("cosh", OpKind::kCosh, 1),
    Fn("asin", OpKind::kAsin, 1),
    Fn("arcsin", OpKind::kAsin, 1),
    Fn("acos", OpKind::kAcos, 1),
    Fn("arccos", OpKind::kAcos, 1),
    Fn("atan", OpKind::kAtan, 1),
    Fn("arctan", OpKind::kAtan, 1),
    Fn("arcsinh", OpKind::kAsinh, 1),
    Fn("arccosh", OpKind::kAcosh, 1),
    Fn("arctanh", OpKind::kAtanh, 1),
    Fn("floor", OpKind::kFloor, 1),
    Fn("ceil", OpKind::kCeil, 1),
    Fn("rint", OpKind::kRint, 1),
    Fn("trunc", OpKind::kTrunc, 1),
    Fn("exp2", OpKind::kExp2, 1),
    Fn("log2", OpKind::kLog2, 1),
    Fn("log10", OpKind::kLog10, 1),
    Fn("cbrt", OpKind::kCbrt, 1),
    Fn("degrees", OpKind::kDegrees, 1),
    Fn("rad2deg", OpKind::kDegrees, 1),
    Fn("radians", OpKind::kRadians, 1),
    Fn("deg2rad", OpKind::kRadians, 1),
    Fn("sign", OpKind::kSign, 1),
    Fn("square", OpKind::kSquare, 1),
    Fn("reciprocal", OpKind::kReciprocal, 1),
    Fn("invert", OpKind::kInvert, 1),
    Fn("bitwise_not", OpKind::kInvert, 1),
    Fn("logical_not", OpKind::kLogicalNot, 1),
    Fn("isnan", OpKind::kIsNan, 1),
    Fn("isinf", OpKind::kIsInf, 1),
    Fn("isfinite", OpKind::kIsFinite, 1),
    Fn("signbit", OpKind::kSignbit, 1),
    Fn("add", OpKind::kAdd, 2),
    Fn("subtract", OpKind::kSub, 2),
    Fn("multiply", OpKind::kMul, 2),
    Fn("divide", OpKind::kDiv, 2),
    Fn("true_divide", OpKind::kDiv, 2),
    Fn("floor_divide", OpKind::kFloorDiv, 2),
    Fn("mod", OpKind::kMod, 2),
    Fn("remainder", OpKind::kMod, 2),
    Fn("fmod", OpKind::kFmod, 2),
    Fn("pow", OpKind::kPow, 2),
    Fn("power", OpKind::kPow, 2),
    Fn("atan2", OpKind::kAtan2, 2),
    Fn("arctan2", OpKind::kAtan2, 2),
    Fn("hypot", OpKind::kHypot, 2),
    Fn("copysign", OpKind::kCopysign, 2),
    Fn("min", OpKind::kMin, 2),
    Fn("minimum", OpKind::kMin, 2),
    Fn("max", OpKind::kMax, 2),
    Fn("maximum", OpKind::kMax, 2),
    Fn("fmin", OpKind::kFmin, 2),
    Fn("fmax", OpKind::kFmax, 2),
    Fn("bitwise_and", OpKind::kBitAnd, 2),
    Fn("bitwise_or", OpKind::kBitOr, 2),
    Fn("bitwise_xor", OpKind::kBitXor, 2),
    Fn("left_shift", OpKind::kLeftShift, 2),
    Fn("right_shift", OpKind::kRightShift, 2),
    Fn("logical_and", OpKind::kLogicalAnd, 2),
    Fn("logical_or", OpKind::kLogicalOr, 2),
    Fn("logical_xor", OpKind::kLogicalXor, 2),
    Fn("less", OpKind::kLess, 2),
    Fn("less_equal", OpKind::kLessEqual, 2),
    Fn("greater", OpKind::kGreater, 2),
    Fn("greater_equal", OpKind::kGreaterEqual, 2),
    Fn("equal", OpKind::kEqual, 2),
    Fn("not_equal", OpKind::kNotEqual, 2),
    {"where", OpKind::kWhere, 3, 3, Form::kWhere},
    {"clip", OpKind::kMin, 3, 3, Form::kClip},
    {"round", OpKind::kRint, 1, 2, Form::kRound},
    {"positive", OpKind::kNeg, 1, 1, Form::kPositive},
    {"bool", OpKind::kCast, 1, 1, Form::kCast, DType::kBool},
    {"int32", OpKind::kCast, 1, 1, Form::kCast, DType::kInt32},
    {"int64", OpKind::kCast, 1, 1, Form::kCast, DType::kInt64},
    {"float32", OpKind::kCast, 1, 1, Form::kCast, DType::kFloat32},
    {"float64", OpKind::kCast, 1, 1, Form::kCast, DType::kFloat64},
    {"index", OpKind::kIndex, 1, 1, Form::kIndex, DType::kInt64},
};

inline const FunctionInfo* FindFunction(std::string_view name) {
  for (const FunctionInfo& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace gpucompute::expr::internal

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_FUNCTIONS_H_

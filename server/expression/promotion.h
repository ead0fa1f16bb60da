// The expression compiler's typing: NumPy's promotion of the values it combines (NEP 50,
// where Python-like scalars are weak), and the arithmetic on constants that folding
// needs, done as the kernels would do it in the promoted dtype. Internal to the compiler
// (expression.cc); plain C++, as the compiler is.
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_PROMOTION_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_PROMOTION_H_

#include <cstdint>
#include <string>

#include "server/expression/ir.h"

namespace gpucompute::expr::internal {

// A subexpression's result while compiling. Weak values (Python-like scalars) are always
// known at compile time, so they are carried as constants and become IR nodes only once
// they meet an array operand and NumPy promotion has fixed their dtype.
struct Value {
  DType dtype = DType::kFloat64;  // for weak values: kBool, kInt64 or kFloat64
  bool weak = false;
  bool parameter = false;  // weak, and derived from a scalar input
  ConstantValue constant;  // weak only
  int32_t node = -1;       // strong only
  int32_t pos = 0;         // where its text starts, for messages
};

// np.result_type of two array dtypes.
DType PromoteStrong(DType a, DType b);

struct Promoted {
  DType dtype;
  bool weak;
};

// NEP 50 promotion; weak operands only contribute their kind.
Promoted Promote(const Value& a, const Value& b);

// `v`, a constant of dtype `from`, converted to `to` as the kernels convert.
ConstantValue ConvertConstant(const ConstantValue& v, DType from, DType to);
// The unary or binary `op` applied to constants of `dtype`, as the kernels apply it.
ConstantValue FoldUnary(OpKind op, DType dtype, const ConstantValue& a);
ConstantValue FoldBinary(OpKind op, DType dtype, const ConstantValue& a, const ConstantValue& b);
// The shortest text that reads back as the constant: "true"/"false", an integer, or a
// float of the dtype's precision.
std::string FormatConstant(DType dtype, const ConstantValue& v);

}  // namespace gpucompute::expr::internal

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_PROMOTION_H_

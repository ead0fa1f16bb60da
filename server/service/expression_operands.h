// The operands of an elementwise expression, as ElementwiseOp and ReduceOp bind them:
// buffers (or views of them) and scalars by name, the expression compiled over them, and
// the buffers' shapes broadcast under NumPy's rules.
#ifndef GPUCOMPUTE_SERVER_SERVICE_EXPRESSION_OPERANDS_H_
#define GPUCOMPUTE_SERVER_SERVICE_EXPRESSION_OPERANDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/arrays/strided_layout.h"
#include "server/expression/expression.h"
#include "server/service/array_refs.h"
#include "server/service/operation_planner.h"

namespace gpucompute {

// An array operand: the view it names, and that view broadcast to the operands' shape.
struct ArrayOperand {
  ArrayRef array;
  StridedLayout broadcast;
};

struct ExpressionOperands {
  expr::Program program;
  // By name; the names of program.inputs() that are not here are scalars.
  std::map<std::string, ArrayOperand, std::less<>> arrays;
  // The broadcast shape of the array operands (() with none).
  std::vector<int64_t> shape;
  // Each distinct view read once, at its own size (a broadcast operand is not re-read
  // per use): the operation's bytes read.
  uint64_t distinct_bytes = 0;
};

// Resolves `inputs` (each operand named in errors as "input '<name>'", in the order of the
// names), broadcasts the buffers' shapes (NumPy's message when they do not broadcast),
// and then, when `result_shape` is given (ElementwiseOp.shape), to it, and compiles
// `expression` under the server's limits. Every error is the request's: INVALID_ARGUMENT, or a
// lookup's NOT_FOUND.
absl::StatusOr<ExpressionOperands> CompileOperands(
    ServiceContext& ctx, BufferResolver resolve, const std::string& expression,
    const google::protobuf::Map<std::string, v1::Operand>& inputs,
    const v1::SignedShape* result_shape = nullptr);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_EXPRESSION_OPERANDS_H_

#include "server/service/expression_operands.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/tenancy/request_limits.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

absl::StatusOr<expr::ScalarInput> ScalarFromProto(const std::string& name, const v1::Scalar& s) {
  expr::ScalarInput in;
  switch (s.value_case()) {
    case v1::Scalar::kFloatValue:
      in.dtype = DType::kFloat64;
      in.f = s.float_value();
      return in;
    case v1::Scalar::kIntValue:
      in.dtype = DType::kInt64;
      in.i = s.int_value();
      return in;
    case v1::Scalar::kBoolValue:
      in.dtype = DType::kBool;
      in.i = s.bool_value();
      return in;
    case v1::Scalar::VALUE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("input '", name, "' is a scalar with no value"));
}

// ElementwiseOp.shape, checked as a new buffer's shape, which the operands' broadcast
// shape `operands` must broadcast to.
absl::StatusOr<std::vector<int64_t>> RequestedShape(const RequestLimits& limits,
                                                    const v1::SignedShape& requested,
                                                    const std::vector<int64_t>& operands) {
  const std::vector<int64_t> shape(requested.extents().begin(), requested.extents().end());
  std::vector<uint64_t> extents;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", NumpyShape(shape),
                                                     " has a negative extent at axis ", d));
    }
    extents.push_back(static_cast<uint64_t>(shape[d]));
  }
  RETURN_IF_ERROR(CheckShape(limits, extents));
  // numpy.broadcast_to: aligned at the right, each operand extent equal or 1.
  bool fits = operands.size() <= shape.size();
  for (size_t k = 0; fits && k < operands.size(); ++k) {
    const int64_t from = operands[operands.size() - 1 - k];
    fits = from == 1 || from == shape[shape.size() - 1 - k];
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the operands' broadcast shape ", NumpyShape(operands),
        " does not broadcast to the requested shape ", NumpyShape(shape)));
  }
  return shape;
}

}  // namespace

absl::StatusOr<ExpressionOperands> CompileOperands(
    ServiceContext& ctx, BufferResolver resolve, const std::string& expression,
    const google::protobuf::Map<std::string, v1::Operand>& inputs,
    const v1::SignedShape* result_shape) {
  if (expression.size() > ctx.limits.max_expression_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expression is ", expression.size(), " bytes; the server allows at most ",
        ctx.limits.max_expression_bytes, " (--max-expression-bytes)"));
  }
  std::map<std::string, expr::InputType, std::less<>> types;
  std::map<std::string, ArrayOperand, std::less<>> arrays;
  std::vector<std::vector<int64_t>> shapes;
  // In the order of the names, not the map's (which protobuf leaves unspecified), so
  // that messages naming several operands name them alike every time.
  std::map<std::string, const v1::Operand*> sorted;
  for (const auto& [name, operand] : inputs) sorted.emplace(name, &operand);
  for (const auto& [name, pointer] : sorted) {
    const v1::Operand& operand = *pointer;
    switch (operand.value_case()) {
      case v1::Operand::kBuffer: {
        ASSIGN_OR_RETURN(ArrayRef array, ResolveArray(resolve, absl::StrCat("input '", name, "'"),
                                                      operand.buffer(), operand.view()));
        types.emplace(name, expr::ArrayInput{array.dtype()});
        shapes.push_back(array.layout.shape);
        arrays.emplace(name, ArrayOperand{std::move(array), {}});
        break;
      }
      case v1::Operand::kScalar: {
        if (!operand.view().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("input '", name, "' is a scalar; a view applies to a buffer"));
        }
        ASSIGN_OR_RETURN(expr::ScalarInput in, ScalarFromProto(name, operand.scalar()));
        types.emplace(name, in);
        break;
      }
      case v1::Operand::VALUE_NOT_SET:
        return absl::InvalidArgumentError(absl::StrCat("input '", name, "' is bound to nothing"));
    }
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, BroadcastShapes(shapes));
  if (result_shape != nullptr) {
    ASSIGN_OR_RETURN(shape, RequestedShape(ctx.limits, *result_shape, shape));
  }
  uint64_t distinct_bytes = 0;
  std::vector<const ArrayRef*> counted;
  for (auto& [name, operand] : arrays) {
    ASSIGN_OR_RETURN(operand.broadcast, BroadcastToView(operand.array.layout, shape,
                                                        static_cast<int>(kMaxDimensions)));
    const ArrayRef& a = operand.array;
    if (std::none_of(counted.begin(), counted.end(), [&](const ArrayRef* c) {
          return c->buffer == a.buffer && c->layout == a.layout;
        })) {
      counted.push_back(&a);
      distinct_bytes += static_cast<uint64_t>(a.layout.num_elements()) * DTypeSize(a.dtype());
    }
  }
  ASSIGN_OR_RETURN(expr::Program program,
                   ctx.programs->Compile(expression, types,
                                         static_cast<int>(ctx.limits.max_expression_depth)));
  return ExpressionOperands{std::move(program), std::move(arrays), std::move(shape),
                            distinct_bytes};
}

}  // namespace gpucompute

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

}  // namespace

absl::StatusOr<ExpressionOperands> CompileOperands(
    ServiceContext& ctx, BufferResolver resolve, const std::string& expression,
    const google::protobuf::Map<std::string, v1::Operand>& inputs) {
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

#include "server/service/plan_reduce.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpucompute/v1/limits.h"
#include "server/arrays/strided_layout.h"
#include "server/arrays/view_steps.h"
#include "server/expression/expression.h"
#include "server/service/array_refs.h"
#include "server/service/expression_operands.h"
#include "server/tenancy/request_limits.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// The values a reduction reads: one array, or an expression over arrays (broadcast to
// `shape`) and scalars.
struct ReduceSource {
  std::optional<expr::Program> program;
  // One array, or one per program->inputs(), a null buffer standing for a scalar.
  std::vector<ArrayRef> arrays;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  uint64_t bytes_read = 0;  // each distinct view once, before broadcasting
};

uint64_t ViewBytes(const ArrayRef& a) {
  return static_cast<uint64_t>(a.layout.num_elements()) * DTypeSize(a.dtype());
}

absl::StatusOr<ReduceSource> ResolveExpression(ServiceContext& ctx, BufferResolver resolve,
                                               const v1::ReduceOp& op) {
  ASSIGN_OR_RETURN(ExpressionOperands operands,
                   CompileOperands(ctx, resolve, op.expression(), op.inputs()));
  if (!expr::IndexAxes(operands.program.ir()).empty()) {
    return absl::InvalidArgumentError(
        "index() is not supported in a reduction's expression: compute the expression into "
        "a buffer with ElementwiseOp (and its shape) and reduce that");
  }
  ReduceSource source;
  source.shape = std::move(operands.shape);
  source.dtype = operands.program.result_dtype();
  source.bytes_read = operands.distinct_bytes;
  for (const std::string& name : operands.program.inputs()) {
    auto it = operands.arrays.find(name);
    source.arrays.push_back(it == operands.arrays.end()
                                ? ArrayRef{}
                                : ArrayRef{it->second.array.buffer, it->second.broadcast});
  }
  source.program = std::move(operands.program);
  return source;
}

absl::StatusOr<ReduceSource> ResolveSource(ServiceContext& ctx, BufferResolver resolve,
                                           const v1::ReduceOp& op) {
  const bool has_expression = !op.expression().empty() || !op.inputs().empty();
  if (!op.input().empty() && has_expression) {
    return absl::InvalidArgumentError(
        "reduce takes either an input or an expression with its inputs, not both");
  }
  if (has_expression) {
    if (!op.input_view().empty()) {
      return absl::InvalidArgumentError(
          "input_view applies to input; a view of an expression's input goes in its Operand.view");
    }
    if (op.expression().empty()) {
      return absl::InvalidArgumentError("reduce inputs are given but the expression is empty");
    }
    return ResolveExpression(ctx, resolve, op);
  }
  // The buffer's lookup fails as it always has, without ResolveArray's prefix.
  if (op.input().empty()) return absl::InvalidArgumentError("reduce input is required");
  ASSIGN_OR_RETURN(BufferHandle buffer, resolve(op.input()));
  ArrayRef a{buffer, BufferLayout(*buffer)};
  if (!op.input_view().empty()) {
    absl::StatusOr<StridedLayout> view =
        ApplyViewSteps(a.layout, op.input_view(), static_cast<int>(kMaxDimensions));
    if (!view.ok()) {
      return absl::Status(view.status().code(), absl::StrCat("reduce input ", DescribeArray(a),
                                                             ": ", view.status().message()));
    }
    a.layout = *std::move(view);
  }
  ReduceSource source;
  source.shape = a.layout.shape;
  source.dtype = a.dtype();
  source.bytes_read = ViewBytes(a);
  source.arrays.push_back(std::move(a));
  return source;
}

// The reduced axes, sorted and non-negative, in NumPy's words when they are not valid.
absl::StatusOr<std::vector<int32_t>> ReducedAxes(const v1::ReduceOp& op, ReduceKind kind,
                                                 int ndim) {
  if (op.has_axis() && op.has_axes()) {
    return absl::InvalidArgumentError("reduce takes axis or axes, not both");
  }
  std::vector<int32_t> axes;
  if (op.has_axis()) {
    axes.push_back(op.axis());
  } else if (op.has_axes()) {
    axes.assign(op.axes().axes().begin(), op.axes().axes().end());
  } else {
    for (int d = 0; d < ndim; ++d) axes.push_back(d);
    return axes;
  }
  if ((kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax) && axes.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(ReduceKindName(kind), " takes one axis, or none for the whole array; got ",
                     axes.size()));
  }
  for (int32_t& a : axes) {
    if (a < -ndim || a >= ndim) {
      return absl::InvalidArgumentError(
          absl::StrCat("axis ", a, " is out of bounds for array of dimension ", ndim));
    }
    if (a < 0) a += ndim;
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    return absl::InvalidArgumentError("duplicate value in 'axis'");
  }
  return axes;
}

// The ReduceShape of reducing `axes` of a whole buffer, when its memory order makes the
// reduction [kept][reduced][kept] (after dropping axes of extent 1 and merging neighbours
// alike) with the outputs in C order; nullopt otherwise.
std::optional<ReduceShape> ShapeReduce(const BufferMeta& b, ReduceKind kind,
                                       const std::vector<int32_t>& axes) {
  const int ndim = static_cast<int>(b.shape.size());
  const bool fortran = b.layout == Layout::kF && ndim >= 2;
  std::vector<bool> reduced(ndim, false);
  for (int32_t a : axes) reduced[a] = true;
  // Runs in memory order, outermost first: {extent product, reduced}.
  std::vector<std::pair<int64_t, bool>> runs;
  int kept_axes = 0;
  int reduced_axes = 0;
  for (int i = 0; i < ndim; ++i) {
    const int d = fortran ? ndim - 1 - i : i;
    const auto extent = static_cast<int64_t>(b.shape[d]);
    if (extent == 1) continue;
    ++(reduced[d] ? reduced_axes : kept_axes);
    if (!runs.empty() && runs.back().second == reduced[d]) {
      runs.back().first *= extent;
    } else {
      runs.emplace_back(extent, reduced[d]);
    }
  }
  const bool arg = kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax;
  // In F order the kept axes run backwards: one at most keeps the outputs in C order.
  // Positions of an argmin merged from several F axes are F-order ones; only the 2-D
  // whole array has its C-order search (ReduceShape::f_order_rows).
  if (fortran && kept_axes > 1) return std::nullopt;
  ReduceShape shape;
  if (fortran && static_cast<int>(axes.size()) == ndim) {
    if (ndim == 2) {
      shape.f_order_rows = static_cast<int64_t>(b.shape[0]);
    } else if (arg && reduced_axes > 1) {
      return std::nullopt;
    }
  }
  size_t i = 0;
  if (i < runs.size() && !runs[i].second) shape.outer = runs[i++].first;
  if (i < runs.size() && runs[i].second) shape.extent = runs[i++].first;
  if (i < runs.size() && !runs[i].second) shape.inner = runs[i++].first;
  if (i != runs.size()) return std::nullopt;
  return shape;
}

}  // namespace

absl::StatusOr<ReduceKind> ReduceKindFromProto(v1::ReduceKind kind) {
  switch (kind) {
    case v1::REDUCE_KIND_SUM:
      return ReduceKind::kSum;
    case v1::REDUCE_KIND_PROD:
      return ReduceKind::kProd;
    case v1::REDUCE_KIND_MIN:
      return ReduceKind::kMin;
    case v1::REDUCE_KIND_MAX:
      return ReduceKind::kMax;
    case v1::REDUCE_KIND_MEAN:
      return ReduceKind::kMean;
    case v1::REDUCE_KIND_NORM2:
      return ReduceKind::kNorm2;
    case v1::REDUCE_KIND_ARGMIN:
      return ReduceKind::kArgmin;
    case v1::REDUCE_KIND_ARGMAX:
      return ReduceKind::kArgmax;
    case v1::REDUCE_KIND_VAR:
      return ReduceKind::kVar;
    case v1::REDUCE_KIND_STD:
      return ReduceKind::kStd;
    case v1::REDUCE_KIND_ANY:
      return ReduceKind::kAny;
    case v1::REDUCE_KIND_ALL:
      return ReduceKind::kAll;
    case v1::REDUCE_KIND_UNSPECIFIED:
      return absl::InvalidArgumentError("reduce kind is required");
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown reduce kind ", static_cast<int>(kind)));
}

absl::StatusOr<Plan> PlanReduce(ServiceContext& ctx, absl::string_view client,
                                BufferResolver resolve, const v1::ReduceOp& op) {
  ASSIGN_OR_RETURN(ReduceKind kind, ReduceKindFromProto(op.kind()));
  if (kind == ReduceKind::kVar || kind == ReduceKind::kStd) {
    if (!std::isfinite(op.ddof())) {
      return absl::InvalidArgumentError(absl::StrCat("ddof must be finite, not ", op.ddof()));
    }
  } else if (op.ddof() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ddof applies to var and std only, not ", ReduceKindName(kind)));
  }
  ASSIGN_OR_RETURN(ReduceSource source, ResolveSource(ctx, resolve, op));
  // A view or a broadcast reads no more memory for more elements: the elements a
  // reduction visits are bounded as a new buffer's are, so that no request asks for
  // hours of work.
  const StridedLayout space{source.shape, std::vector<int64_t>(source.shape.size(), 0), 0};
  if (static_cast<uint64_t>(space.num_elements()) > ctx.limits.max_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the reduction visits ", space.num_elements(), " elements (shape ",
        NumpyShape(source.shape), "); the server allows at most ", ctx.limits.max_elements,
        " (--max-elements)"));
  }
  const int ndim = static_cast<int>(source.shape.size());
  ASSIGN_OR_RETURN(std::vector<int32_t> axes, ReducedAxes(op, kind, ndim));

  std::vector<bool> is_reduced(ndim, false);
  for (int32_t a : axes) is_reduced[a] = true;
  int64_t reduced_count = 1;
  std::vector<uint64_t> out_shape;
  for (int d = 0; d < ndim; ++d) {
    const auto extent = static_cast<uint64_t>(source.shape[d]);
    if (is_reduced[d]) {
      reduced_count *= source.shape[d];
      if (op.keepdims()) out_shape.push_back(1);
    } else {
      out_shape.push_back(extent);
    }
  }
  const bool needs_element = kind == ReduceKind::kMin || kind == ReduceKind::kMax ||
                             kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax;
  if (needs_element && reduced_count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot take ", v1::ReduceKind_Name(op.kind()),
                     " of zero elements: the reduction has no identity"));
  }

  // A whole buffer whose axes map onto a ReduceShape keeps the kernel it always ran.
  std::optional<ReduceShape> fast;
  BufferHandle plain;  // the input without an expression
  if (!source.program.has_value()) plain = source.arrays.front().buffer;
  if (plain != nullptr && source.arrays.front().IsWholeBuffer() && IsShapeReduceKind(kind)) {
    fast = ShapeReduce(*plain, kind, axes);
  }
  int device = ctx.executor.default_device();
  for (const ArrayRef& a : source.arrays) {
    if (a.buffer != nullptr) {
      device = a.buffer->device;
      break;
    }
  }
  const DType result_dtype = ReduceResultDType(kind, source.dtype);
  Plan plan;
  bool created = false;
  ASSIGN_OR_RETURN(BufferHandle out,
                   ResolveOutput(ctx, client, resolve, op.output(), result_dtype, out_shape,
                                 Layout::kC, device, CastRule::kExact, &created));
  for (const ArrayRef& a : source.arrays) {
    if (a.buffer == out) {
      return absl::InvalidArgumentError(source.program.has_value()
                                            ? "reduce output must not be one of its inputs"
                                            : "reduce output must not be its input");
    }
  }
  if (created) plan.created = out;

  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kReduce;
  std::vector<BufferHandle> read;
  for (const ArrayRef& a : source.arrays) {
    if (a.buffer == nullptr || std::find(read.begin(), read.end(), a.buffer) != read.end()) continue;
    read.push_back(a.buffer);
    spec.accesses.push_back({a.buffer, false});
  }
  spec.accesses.push_back({out, true});
  spec.bytes_read = source.bytes_read;
  spec.bytes_written = out->size_bytes();
  const auto elements = static_cast<uint64_t>(std::max<int64_t>(0, reduced_count)) *
                        out->num_elements();
  spec.flops = elements * (kind == ReduceKind::kNorm2 ? 2 : 1);
  if (source.program.has_value()) {
    spec.flops += static_cast<uint64_t>(source.program->ops_per_element()) * elements;
  }
  spec.outputs.push_back(*out);
  const bool inline_values = out->num_elements() <= kMaxInlineValues;
  auto copy_values = [&backend = ctx.backend, out, inline_values](Stream& stream,
                                                                  OpResult& result) {
    if (!inline_values) return absl::OkStatus();
    result.values_dtype = out->dtype;
    result.values.resize(out->size_bytes());
    return backend.CopyToHost(stream, out->memory, 0, result.values.data(), result.values.size());
  };
  if (fast.has_value()) {
    spec.launch = [&backend = ctx.backend, kind, in = plain, out, shape = *fast,
                   copy_values](Stream& stream, OpResult& result) -> absl::StatusOr<LaunchInfo> {
      absl::Status s = backend.Reduce(stream, kind, in->dtype, in->memory, shape, out->memory);
      if (s.ok()) s = copy_values(stream, result);
      if (!s.ok()) return s;
      return LaunchInfo{};
    };
    return plan;
  }
  spec.launch = [&backend = ctx.backend, kind, source = std::move(source), axes = std::move(axes),
                 ddof = op.ddof(), out, copy_values](
                    Stream& stream, OpResult& result) -> absl::StatusOr<LaunchInfo> {
    StridedReduce reduce;
    reduce.kind = kind;
    reduce.dtype = source.dtype;
    reduce.program = source.program.has_value() ? &*source.program : nullptr;
    for (const ArrayRef& a : source.arrays) {
      reduce.inputs.push_back(
          {a.buffer == nullptr ? nullptr : &a.buffer->memory, a.layout});
    }
    reduce.shape = source.shape;
    reduce.axes = axes;
    reduce.ddof = ddof;
    absl::StatusOr<LaunchInfo> launched = backend.ReduceStrided(stream, reduce, out->memory);
    if (!launched.ok()) return launched;
    absl::Status s = copy_values(stream, result);
    if (!s.ok()) return s;
    return launched;
  };
  return plan;
}

}  // namespace gpucompute

#include "server/service/operation_planner.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/philox.h"
#include "server/expression/expression.h"
#include "server/service/array_refs.h"
#include "server/service/plan_elementwise.h"
#include "server/service/plan_matmul.h"
#include "server/service/plan_reduce.h"
#include "server/service/proto_conversions.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Describe(const BufferMeta& b) {
  return absl::StrCat(b.name.empty() ? b.id : absl::StrCat("'", b.name, "'"), " (",
                      DTypeName(b.dtype), ShapeString(b.shape), ")");
}

}  // namespace

absl::StatusOr<BufferHandle> ResolveOutput(ServiceContext& ctx, absl::string_view client,
                                           BufferResolver resolve, const v1::Output& output,
                                           DType natural,
                                           const std::vector<uint64_t>& shape, Layout layout,
                                           int device, CastRule rule, bool* created,
                                           StridedLayout* out_layout) {
  std::optional<DType> requested;
  if (output.dtype() != v1::DTYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(DType d, FromProto(output.dtype()));
    requested = d;
  }
  auto check_cast = [&](DType to) -> absl::Status {
    const bool ok = rule == CastRule::kExact ? natural == to : expr::CanCastSameKind(natural, to);
    if (ok) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the result is ", DTypeName(natural), " and cannot be written as ", DTypeName(to),
        rule == CastRule::kExact ? " (the dtypes must match)"
                                 : " (only same-kind casts are allowed)"));
  };
  ASSIGN_OR_RETURN(int64_t ttl, TtlNanos(output.ttl_seconds()));
  if (!output.buffer().empty()) {
    if (ttl != 0) {
      return absl::InvalidArgumentError(
          "output.ttl_seconds applies to a new buffer; renew an existing one with RenewLease");
    }
    if (out_layout == nullptr && !output.view().empty()) {
      return absl::InvalidArgumentError(
          "output.view applies to elementwise operations only; write the whole buffer");
    }
    ArrayRef target;
    if (output.view().empty()) {
      ASSIGN_OR_RETURN(target.buffer, resolve(output.buffer()));
      target.layout = BufferLayout(*target.buffer);
    } else {
      ASSIGN_OR_RETURN(target, ResolveArray(resolve, "output", output.buffer(), output.view()));
    }
    BufferHandle out = target.buffer;
    const BufferEntry& b = *out;
    if (!output.view().empty()) {
      const std::vector<int64_t> result(shape.begin(), shape.end());
      if (target.layout.shape != result) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output ", DescribeArray(target), " has shape ", NumpyShape(target.layout.shape),
            " but the result has shape ", NumpyShape(result)));
      }
    } else if (b.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("output ", Describe(b), " has shape ", ShapeString(b.shape),
                       " but the result has shape ", ShapeString(shape)));
    }
    if (requested.has_value() && *requested != b.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("output dtype ", DTypeName(*requested),
                                                     " differs from the existing output ",
                                                     Describe(b)));
    }
    // An operation that writes through strides (out_layout) takes any layout.
    if (out_layout == nullptr && b.shape.size() >= 2 && b.layout != layout) {
      return absl::InvalidArgumentError(
          absl::StrCat("output ", Describe(b), " has a different layout than the result"));
    }
    RETURN_IF_ERROR(check_cast(b.dtype));
    *created = false;
    if (out_layout != nullptr) *out_layout = std::move(target.layout);
    return out;
  }
  if (!output.view().empty()) {
    return absl::InvalidArgumentError(
        "output.view applies to an existing output.buffer; a new buffer is written whole");
  }
  const DType dtype = requested.value_or(natural);
  RETURN_IF_ERROR(check_cast(dtype));
  // The shape comes from the inputs, which a restart may have restored from disk under
  // other limits: the new buffer is held to today's.
  RETURN_IF_ERROR(CheckShape(ctx.limits, shape));
  *created = true;
  ASSIGN_OR_RETURN(BufferHandle out,
                   ctx.registry.Allocate(client, output.name(), dtype, shape, layout, device));
  // An unnamed result nobody downloads would otherwise live until the server stops.
  if (ttl == 0 && output.name().empty()) ttl = ctx.default_result_ttl_nanos;
  out->lease.Set(ttl, SteadyNanos());
  if (out_layout != nullptr) *out_layout = BufferLayout(*out);
  return out;
}

namespace {

absl::StatusOr<Plan> PlanGemv(ServiceContext& ctx, absl::string_view client,
                              BufferResolver resolve, const v1::GemvOp& op) {
  ASSIGN_OR_RETURN(ArrayRef a, ResolveArray(resolve, "gemv matrix 'a'", op.a(), op.a_view()));
  ASSIGN_OR_RETURN(ArrayRef x, ResolveArray(resolve, "gemv vector 'x'", op.x(), op.x_view()));
  // Whole buffers read as they did before views.
  const auto describe = [](const ArrayRef& array, bool viewed) {
    return viewed ? DescribeArray(array) : Describe(*array.buffer);
  };
  const std::string A = describe(a, !op.a_view().empty());
  const std::string X = describe(x, !op.x_view().empty());
  if (a.layout.ndim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("gemv matrix ", A, " must be 2-D"));
  }
  if (!IsFloat(a.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv matrix ", A, " must be float32 or float64"));
  }
  GemvShape shape;
  shape.rows = a.layout.shape[0];
  shape.cols = a.layout.shape[1];
  shape.transpose = op.transpose();
  const int64_t x_len = shape.transpose ? shape.rows : shape.cols;
  const int64_t y_len = shape.transpose ? shape.cols : shape.rows;
  if (x.dtype() != a.dtype() || x.layout.shape != std::vector<int64_t>{x_len}) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv vector x ", X, " must be ", DTypeName(a.dtype()), "[", x_len,
                     "] to match ", op.transpose() ? "transposed " : "", "matrix ", A));
  }
  // BLAS's operands: A with a unit stride on one axis (lda the other's), x at any stride
  // but 0, as MatmulOp reads its operands.
  // An empty A is not read.
  MatrixLayout matrix;
  if (shape.rows > 0 && shape.cols > 0) {
    ASSIGN_OR_RETURN(matrix, BlasMatrix(a, "gemv matrix 'a'"));
  }
  const bool row_major =
      (shape.cols <= 1 || matrix.col_stride == 1) &&
      (shape.rows <= 1 || matrix.row_stride >= std::max<int64_t>(shape.cols, 1));
  shape.col_major = !row_major;
  shape.lda = std::max<int64_t>({row_major ? matrix.row_stride : matrix.col_stride,
                                 row_major ? shape.cols : shape.rows, 1});
  shape.a_offset = matrix.offset;
  shape.x_offset = x.layout.offset;
  shape.incx = x_len <= 1 ? 1 : x.layout.strides[0];
  if (shape.incx == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gemv vector x ", X,
        " repeats one element (a broadcast view, stride 0), which BLAS cannot read: copy it "
        "first (an elementwise 'x' into a new buffer)"));
  }
  if (a.buffer->device != x.buffer->device) {
    return absl::InvalidArgumentError(absl::StrCat("gemv operands are on devices ",
                                                   a.buffer->device, " and ", x.buffer->device));
  }
  const double alpha = op.has_alpha() ? op.alpha() : 1.0;
  Plan plan;
  bool created = false;
  ASSIGN_OR_RETURN(BufferHandle y,
                   ResolveOutput(ctx, client, resolve, op.y(), a.dtype(),
                                 {static_cast<uint64_t>(y_len)}, Layout::kC, a.buffer->device,
                                 CastRule::kExact, &created));
  if (y == a.buffer || y == x.buffer) {
    return absl::InvalidArgumentError("gemv output y must not be the same buffer as a or x");
  }
  const double beta = created ? 0.0 : op.beta();
  if (created) plan.created = y;

  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kGemv;
  spec.accesses.push_back({a.buffer, false});
  if (x.buffer != a.buffer) spec.accesses.push_back({x.buffer, false});
  spec.accesses.push_back({y, true});
  const uint64_t element = DTypeSize(a.dtype());
  const auto a_elements = static_cast<uint64_t>(shape.rows) * static_cast<uint64_t>(shape.cols);
  spec.bytes_read = (a_elements + static_cast<uint64_t>(x_len)) * element +
                    (beta != 0 ? y->size_bytes() : 0);
  spec.bytes_written = y->size_bytes();
  spec.flops = 2 * a_elements;
  spec.outputs.push_back(*y);
  spec.launch = [&backend = ctx.backend, a = a.buffer, x = x.buffer, y = y, shape, alpha, beta](
                    Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    absl::Status s =
        backend.Gemv(stream, a->dtype, shape, alpha, a->memory, x->memory, beta, y->memory);
    if (!s.ok()) return s;
    return LaunchInfo{};
  };
  return plan;
}

absl::StatusOr<Distribution> DistributionFromProto(v1::Distribution d) {
  switch (d) {
    case v1::DISTRIBUTION_UNIFORM:
      return Distribution::kUniform;
    case v1::DISTRIBUTION_NORMAL:
      return Distribution::kNormal;
    case v1::DISTRIBUTION_INTEGERS:
      return Distribution::kIntegers;
    case v1::DISTRIBUTION_UNSPECIFIED:
      return absl::InvalidArgumentError("random distribution is required");
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown distribution ", static_cast<int>(d)));
}

absl::StatusOr<Plan> PlanRandom(ServiceContext& ctx, absl::string_view client,
                                BufferResolver resolve, const v1::RandomOp& op) {
  ASSIGN_OR_RETURN(Distribution dist, DistributionFromProto(op.distribution()));
  RandomParams params;
  params.distribution = dist;
  params.seed = op.seed();
  params.offset = op.offset();
  params.mean = op.mean();
  params.stddev = op.has_stddev() ? op.stddev() : 1.0;
  params.low = op.low();
  params.high = op.high();
  // Checked for every distribution, so that a typo fails rather than being ignored.
  switch (op.normal_transform()) {
    case v1::NORMAL_TRANSFORM_UNSPECIFIED:
    case v1::NORMAL_TRANSFORM_V1:
      params.normal_transform = NormalTransform::kBoxMullerV1;
      break;
    case v1::NORMAL_TRANSFORM_V2:
      params.normal_transform = NormalTransform::kBoxMullerV2;
      break;
    case v1::NORMAL_TRANSFORM_V3:
      params.normal_transform = NormalTransform::kInverseCdfV3;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown normal_transform ", static_cast<int>(op.normal_transform()),
          "; there are NORMAL_TRANSFORM_V1 (1, also the default 0), NORMAL_TRANSFORM_V2 (2) "
          "and NORMAL_TRANSFORM_V3 (3)"));
  }

  // The target: an existing buffer decides shape and dtype; a new one takes them from the request.
  std::vector<uint64_t> shape(op.shape().begin(), op.shape().end());
  Layout layout = Layout::kC;
  DType dtype;
  if (!op.output().buffer().empty()) {
    ASSIGN_OR_RETURN(BufferHandle b, resolve(op.output().buffer()));
    if (!shape.empty() && shape != b->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " differs from the output ", Describe(*b)));
    }
    shape = b->shape;
    layout = b->layout;
    dtype = b->dtype;
  } else {
    // Checked before the counters the fill would use are counted.
    RETURN_IF_ERROR(CheckShape(ctx.limits, shape));
    ASSIGN_OR_RETURN(Layout l, FromProto(op.layout()));
    layout = l;
    if (op.output().dtype() == v1::DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError("a new random buffer needs output.dtype");
    }
    ASSIGN_OR_RETURN(DType d, FromProto(op.output().dtype()));
    dtype = d;
  }
  if (dist == Distribution::kIntegers) {
    if (!IsInteger(dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("random integers need an int32 or int64 output, not ", DTypeName(dtype)));
    }
    if (params.low >= params.high) {
      return absl::InvalidArgumentError(absl::StrCat("random integers need low < high; got [",
                                                     params.low, ", ", params.high, ")"));
    }
    if (dtype == DType::kInt32 && (params.low < std::numeric_limits<int32_t>::min() ||
                                   params.high - 1 > std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", params.low, ", ", params.high, ") does not fit an int32 output"));
    }
  } else {
    if (!IsFloat(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uniform and normal values need a float32 or float64 output, not ", DTypeName(dtype)));
    }
    if (dist == Distribution::kNormal &&
        (!std::isfinite(params.mean) || !std::isfinite(params.stddev) || params.stddev < 0)) {
      return absl::InvalidArgumentError(
          "normal needs a finite mean and a finite, non-negative stddev");
    }
  }
  ASSIGN_OR_RETURN(uint64_t n, CheckedElementCount(shape, DTypeSize(dtype)));
  const uint64_t counters = CountersUsed(dist, dtype, static_cast<int64_t>(n));
  if (counters > std::numeric_limits<uint64_t>::max() - params.offset) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", params.offset, " plus the ", counters,
                                                   " counters this fill uses overflows 64 bits"));
  }
  Plan plan;
  bool created = false;
  v1::Output output = op.output();
  output.set_dtype(v1::DTYPE_UNSPECIFIED);  // already folded into dtype
  ASSIGN_OR_RETURN(BufferHandle out,
                   ResolveOutput(ctx, client, resolve, output, dtype, shape, layout,
                                 ctx.executor.default_device(), CastRule::kExact, &created));
  if (created) plan.created = out;

  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kRandom;
  spec.accesses = {{out, true}};
  spec.bytes_written = out->size_bytes();
  spec.outputs.push_back(*out);
  const uint64_t next_offset = params.offset + counters;
  spec.capturable = true;  // one kernel
  spec.launch = [&backend = ctx.backend, out = out, params, next_offset](
                    Stream& stream, OpResult& result) -> absl::StatusOr<LaunchInfo> {
    result.next_offset = next_offset;
    absl::Status s = backend.Random(stream, params, out->dtype, out->memory,
                                    static_cast<int64_t>(out->num_elements()));
    if (!s.ok()) return s;
    return LaunchInfo{};
  };
  return plan;
}

}  // namespace

absl::StatusOr<Plan> PlanOperation(ServiceContext& ctx, absl::string_view client,
                                   const v1::SubmitRequest& request) {
  return PlanOperation(ctx, client, request, [&](absl::string_view ref) {
    return ctx.registry.Lookup(client, ref);
  });
}

namespace {

absl::StatusOr<Plan> PlanRequest(ServiceContext& ctx, absl::string_view client,
                                 BufferResolver resolve, const v1::SubmitRequest& request) {
  switch (request.op_case()) {
    case v1::SubmitRequest::kElementwise:
      return PlanElementwise(ctx, client, resolve, request.elementwise());
    case v1::SubmitRequest::kGemv:
      return PlanGemv(ctx, client, resolve, request.gemv());
    case v1::SubmitRequest::kReduce:
      return PlanReduce(ctx, client, resolve, request.reduce());  // plan_reduce.h
    case v1::SubmitRequest::kRandom:
      return PlanRandom(ctx, client, resolve, request.random());
    case v1::SubmitRequest::kMatmul:
      return PlanMatmul(ctx, client, resolve, request.matmul());
    case v1::SubmitRequest::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the request names no operation");
}

// A new output is visible from the moment its operation is queued. Should the launch fail
// after it, nothing has written the output: it is zeroed then, in its stream's order, so
// that neither the client nor the work queued after it reads what its memory held before.
void ZeroOutputIfLaunchFails(Backend& backend, Plan& plan) {
  plan.spec.launch = [&backend, out = plan.created, launch = std::move(plan.spec.launch)](
                         Stream& stream, OpResult& result) mutable -> absl::StatusOr<LaunchInfo> {
    absl::StatusOr<LaunchInfo> launched = launch(stream, result);
    if (!launched.ok()) {
      (void)backend.Fill(stream, out->memory, out->dtype, 0,
                         static_cast<int64_t>(out->num_elements()));
    }
    return launched;
  };
}

}  // namespace

absl::StatusOr<Plan> PlanOperation(ServiceContext& ctx, absl::string_view client,
                                   const v1::SubmitRequest& request, BufferResolver resolve) {
  ASSIGN_OR_RETURN(Plan plan, PlanRequest(ctx, client, resolve, request));
  if (plan.created != nullptr) ZeroOutputIfLaunchFails(ctx.backend, plan);
  return plan;
}

absl::StatusOr<BufferHandle> AllocateFromRequest(ServiceContext& ctx, absl::string_view client,
                                                 const v1::CreateBufferRequest& request,
                                                 bool exportable) {
  ASSIGN_OR_RETURN(DType dtype, FromProto(request.dtype()));
  ASSIGN_OR_RETURN(Layout layout, FromProto(request.layout()));
  ASSIGN_OR_RETURN(int64_t ttl, TtlNanos(request.ttl_seconds()));
  const int device = request.has_device() ? request.device() : ctx.executor.default_device();
  std::vector<uint64_t> shape(request.shape().begin(), request.shape().end());
  RETURN_IF_ERROR(CheckShape(ctx.limits, shape));
  ASSIGN_OR_RETURN(BufferHandle buffer, ctx.registry.Allocate(client, request.name(), dtype,
                                                              std::move(shape), layout, device,
                                                              exportable));
  buffer->lease.Set(ttl, SteadyNanos());
  return buffer;
}

absl::StatusOr<std::shared_ptr<Operation>> SubmitCreated(ServiceContext& ctx,
                                                         absl::string_view client,
                                                         const BufferHandle& buffer,
                                                         const v1::CreateBufferRequest& request) {
  // Zero: 0.0, 0 and false are all-zero bytes in every dtype.
  uint64_t bits = 0;
  if (request.has_fill()) {
    absl::StatusOr<uint64_t> value = ScalarBits(request.fill(), buffer->dtype);
    if (!value.ok())
      return absl::InvalidArgumentError(absl::StrCat("fill value: ", value.status().message()));
    bits = *value;
  }
  Plan plan;
  plan.created = buffer;
  Executor::OpSpec& spec = plan.spec;
  spec.kind = OperationKind::kFill;
  spec.accesses = {{buffer, true}};
  spec.bytes_written = buffer->size_bytes();
  spec.outputs.push_back(*buffer);
  spec.capturable = true;  // one kernel or memset
  spec.launch = [&backend = ctx.backend, buffer, bits](Stream& stream,
                                                       OpResult&) -> absl::StatusOr<LaunchInfo> {
    absl::Status s = backend.Fill(stream, buffer->memory, buffer->dtype, bits,
                                  static_cast<int64_t>(buffer->num_elements()));
    if (!s.ok()) return s;
    return LaunchInfo{};
  };
  return SubmitPlan(ctx, client, "", std::move(plan));
}

BufferHandle WrittenBuffer(const Plan& plan) {
  for (const Executor::Access& a : plan.spec.accesses) {
    if (a.write) return a.buffer;
  }
  return nullptr;
}

absl::Status ReserveCreated(ServiceContext& ctx, const Plan& plan) {
  if (plan.created == nullptr) return absl::OkStatus();
  return ctx.registry.Reserve(plan.created);
}

absl::StatusOr<std::shared_ptr<Operation>> SubmitReserved(ServiceContext& ctx,
                                                          absl::string_view client,
                                                          absl::string_view stream_id, Plan plan) {
  BufferHandle created = std::move(plan.created);
  absl::StatusOr<std::shared_ptr<Operation>> op =
      ctx.executor.Submit(client, stream_id, std::move(plan.spec));
  if (created != nullptr) {
    // Published only once its writer is queued, so that no other request can queue
    // work on it ahead of the operation that fills it.
    if (op.ok()) {
      ctx.registry.Publish(created);
    } else {
      ctx.registry.Unreserve(created);
    }
  }
  return op;
}

absl::StatusOr<std::shared_ptr<Operation>> SubmitPlan(ServiceContext& ctx, absl::string_view client,
                                                      absl::string_view stream_id, Plan plan) {
  // The name is taken before anything is queued: a request that loses the race for
  // it is rejected without running.
  RETURN_IF_ERROR(ReserveCreated(ctx, plan));
  return SubmitReserved(ctx, client, stream_id, std::move(plan));
}

}  // namespace gpucompute

// Planning of MatmulOp: NumPy's matmul over buffers and views, checked before anything is
// queued, run by Backend::Matmul.
#ifndef GPUCOMPUTE_SERVER_SERVICE_PLAN_MATMUL_H_
#define GPUCOMPUTE_SERVER_SERVICE_PLAN_MATMUL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/backend.h"
#include "server/service/array_refs.h"
#include "server/service/operation_planner.h"
#include "server/service/service_context.h"

namespace gpucompute {

// C = alpha * op(A) @ op(B) + beta * C with numpy.matmul's shapes: 2-D operands, 3-D
// batches (a batch of 1 or a 2-D operand used for every matrix), 1-D operands promoted
// and their axis dropped from the result. INVALID_ARGUMENT, naming the operands, for
// shapes that do not match (NumPy's message), dtypes other than one float32 or float64,
// allow_tf32 with float64, an operand whose matrices have no unit stride (or repeat
// elements), more than 3 dimensions, and an output that is not of the result's shape
// and dtype or is one of the operands' buffers.
absl::StatusOr<Plan> PlanMatmul(ServiceContext& ctx, absl::string_view client,
                                BufferResolver resolve, const v1::MatmulOp& op);

// A 2-D array's matrix as BLAS reads it (GemvOp's matrix too): its offset and strides, or
// INVALID_ARGUMENT naming it as `what` and asking for a copy where BLAS cannot read it
// (a broadcast axis, no unit stride, or a leading dimension below the other extent).
absl::StatusOr<MatrixLayout> BlasMatrix(const ArrayRef& array, absl::string_view what);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_PLAN_MATMUL_H_

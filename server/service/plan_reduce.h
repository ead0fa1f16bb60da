// Plans ReduceOp: a reduction of a buffer, a view of one, or an elementwise expression,
// over any set of axes (NumPy's axis tuples, negative axes, keepdims, ddof).
#ifndef GPUCOMPUTE_SERVER_SERVICE_PLAN_REDUCE_H_
#define GPUCOMPUTE_SERVER_SERVICE_PLAN_REDUCE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "kernels/ops.h"
#include "server/service/operation_planner.h"
#include "server/service/service_context.h"

namespace gpucompute {

absl::StatusOr<ReduceKind> ReduceKindFromProto(v1::ReduceKind kind);

// Checks `op` and plans it. A whole buffer reduced over axes that map onto a ReduceShape
// (kernels/ops.h) runs Backend::Reduce, with the results the API has always given; every
// other reduction (views, other axis sets, var/std/any/all, expressions) runs
// Backend::ReduceStrided. Both fix their combination order by the shape and the axes, so
// a request gives the same bits on every run.
absl::StatusOr<Plan> PlanReduce(ServiceContext& ctx, absl::string_view client,
                                BufferResolver resolve, const v1::ReduceOp& op);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_PLAN_REDUCE_H_

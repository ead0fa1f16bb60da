// Planning of ElementwiseOp: operands that are buffers, views of them or scalars, NumPy's
// broadcasting of their shapes, and an output that is a new buffer, an existing one or a
// view of one.
#ifndef GPUCOMPUTE_SERVER_SERVICE_PLAN_ELEMENTWISE_H_
#define GPUCOMPUTE_SERVER_SERVICE_PLAN_ELEMENTWISE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/service/operation_planner.h"

namespace gpucompute {

// Operands that are whole buffers of the output's shape and layout, written to a whole
// buffer, run Backend::Elementwise as one flat pass; anything else (views, broadcasting,
// mixed layouts, an output view) runs Backend::ElementwiseStrided over the coalesced
// layouts. Either way nothing is expanded or copied in memory.
absl::StatusOr<Plan> PlanElementwise(ServiceContext& ctx, absl::string_view client,
                                     BufferResolver resolve, const v1::ElementwiseOp& op);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_PLAN_ELEMENTWISE_H_

// Turns a validated API request into an executor OpSpec. Every check of the request
// happens here, before anything is queued, so a rejected request changes nothing.
#ifndef GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_
#define GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/service/service_context.h"

namespace gpucompute {

struct Plan {
  Executor::OpSpec spec;
  // A buffer the operation creates: registered once the operation is queued.
  BufferHandle created;
};

absl::StatusOr<Plan> PlanOperation(ServiceContext& ctx, absl::string_view client,
                                   const v1::SubmitRequest& request);

// Checks a CreateBuffer request (or an upload's header) and allocates its buffer, not yet
// visible to lookups (BufferRegistry::Allocate), exportable as a CUDA IPC handle if asked.
absl::StatusOr<BufferHandle> AllocateFromRequest(ServiceContext& ctx, absl::string_view client,
                                                 const v1::CreateBufferRequest& request,
                                                 bool exportable = false);

// Fills every element of `buffer` with `value` (CreateBuffer's fill).
absl::StatusOr<Plan> PlanFill(ServiceContext& ctx, const BufferHandle& buffer,
                              const v1::Scalar& value);

// Queues a plan on `stream_id` and registers the buffer it creates.
absl::StatusOr<std::shared_ptr<Operation>> SubmitPlan(ServiceContext& ctx, absl::string_view client,
                                                      absl::string_view stream_id, Plan plan);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_

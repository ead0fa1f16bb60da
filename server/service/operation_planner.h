// Turns a validated API request into an executor OpSpec. Every check of the request
// happens here, before anything is queued, so a rejected request changes nothing.
#ifndef GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_
#define GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// Resolves one buffer reference of a request (an id or a name, or whatever the caller
// lets it be) to its buffer.
using BufferResolver = absl::FunctionRef<absl::StatusOr<BufferHandle>(absl::string_view ref)>;

// As above, with every buffer reference of the request resolved by `resolve` instead of
// the client's buffers (sessions and chains resolve "tag:<t>" themselves).
absl::StatusOr<Plan> PlanOperation(ServiceContext& ctx, absl::string_view client,
                                   const v1::SubmitRequest& request, BufferResolver resolve);

// For the planners of each operation (operation_planner.cc, plan_*.cc).
// How a result may be written to an output of another dtype.
enum class CastRule { kExact, kSameKind };
// The buffer an operation writes: an existing one, checked against the result's shape
// and dtype, or a new, not yet registered one (allocated on `device`).
absl::StatusOr<BufferHandle> ResolveOutput(ServiceContext& ctx, absl::string_view client,
                                           BufferResolver resolve, const v1::Output& output,
                                           DType natural, const std::vector<uint64_t>& shape,
                                           Layout layout, int device, CastRule rule,
                                           bool* created);

// The buffer the planned operation writes (every operation writes one).
BufferHandle WrittenBuffer(const Plan& plan);

// Checks a CreateBuffer request (or an upload's header) and allocates its buffer, not yet
// visible to lookups (BufferRegistry::Allocate), exportable as a CUDA IPC handle if asked.
absl::StatusOr<BufferHandle> AllocateFromRequest(ServiceContext& ctx, absl::string_view client,
                                                 const v1::CreateBufferRequest& request,
                                                 bool exportable = false);

// Queues the contents of a buffer `request` created (CreateBuffer, ExportBuffer's
// create) on the client's default stream and then makes the buffer visible: every
// element set to the request's fill, or to zero without one. A new buffer's memory may be
// a recycled block that held another buffer's bytes, another tenant's included; the fill
// of zeros, ordered before any later use, keeps them unreadable at the cost of one memset
// of the buffer's bytes (bandwidth, not a wait). Returns the fill's operation.
absl::StatusOr<std::shared_ptr<Operation>> SubmitCreated(ServiceContext& ctx,
                                                         absl::string_view client,
                                                         const BufferHandle& buffer,
                                                         const v1::CreateBufferRequest& request);

// Queues a plan on `stream_id` and registers the buffer it creates. The name of that
// buffer is taken first, so a plan whose name is taken meanwhile queues nothing.
absl::StatusOr<std::shared_ptr<Operation>> SubmitPlan(ServiceContext& ctx, absl::string_view client,
                                                      absl::string_view stream_id, Plan plan);

// SubmitPlan in two steps, for requests that check many plans before queuing any:
// ReserveCreated takes the name of the buffer the plan creates (BufferRegistry::Reserve);
// SubmitReserved queues the plan and then makes that buffer visible, or gives its name
// back if the plan cannot be queued. Every successful ReserveCreated must be followed
// by SubmitReserved or by BufferRegistry::Unreserve of plan.created.
absl::Status ReserveCreated(ServiceContext& ctx, const Plan& plan);
absl::StatusOr<std::shared_ptr<Operation>> SubmitReserved(ServiceContext& ctx,
                                                          absl::string_view client,
                                                          absl::string_view stream_id, Plan plan);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_OPERATION_PLANNER_H_

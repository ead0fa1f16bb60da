// OperationService: Submit, GetOperation, WaitOperation.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/request_id.h"
#include "server/status_macros.h"
#include "server/service/operation_planner.h"
#include "server/service/services.h"

namespace gpucompute {

grpc::ServerUnaryReactor* OperationServiceImpl::ReplyWhenDone(const std::shared_ptr<Operation>& op,
                                                              double timeout_seconds,
                                                              std::shared_ptr<const void> admission,
                                                              v1::Operation* response) {
  auto* reactor = new DeferredReactor(std::move(admission));
  absl::Status armed = FirstOfEventOrTimeout(
      ctx_, timeout_seconds,
      [&](absl::AnyInvocable<void() &&> on_done) {
        ctx_.executor.OnDone(op, std::move(on_done));
        return absl::OkStatus();
      },
      [this, op, response, state = reactor->state()](bool) {
        // Done or not, the reply is the operation as it stands.
        DeferredReactor::FinishOnce(state, [&] {
          ToProto(ctx_.executor.GetStatus(*op), response);
          return grpc::Status::OK;
        });
      });
  (void)armed;  // OnDone cannot fail
  return reactor;
}

absl::StatusOr<std::shared_ptr<Operation>> OperationServiceImpl::Start(
    const grpc::CallbackServerContext& context, const v1::SubmitRequest& request,
    absl::StatusOr<Caller>& caller) {
  caller = IdentifyCaller(ctx_, context);
  if (!caller.ok()) return caller.status();
  RETURN_IF_ERROR(CheckBackendHealthy(ctx_.backend));
  RETURN_IF_ERROR(CheckTimeout(request.wait_timeout_seconds()));
  ASSIGN_OR_RETURN(Plan plan, PlanOperation(ctx_, caller->scope, request));
  return SubmitPlan(ctx_, caller->scope, request.stream_id(), std::move(plan));
}

grpc::ServerUnaryReactor* OperationServiceImpl::Submit(grpc::CallbackServerContext* context,
                                                       const v1::SubmitRequest* request,
                                                       v1::Operation* response) {
  absl::StatusOr<Caller> caller;
  absl::StatusOr<std::shared_ptr<Operation>> op;
  ctx_.lane->Run([&] { op = Start(*context, *request, caller); });
  if (!op.ok()) return FinishNow(context, op.status());
  if (request->wait()) {
    // 100 us: more than a small operation's whole device time.
    if (AwaitBriefly(ctx_, *op, std::chrono::microseconds(100))) {
      ToProto(ctx_.executor.GetStatus(**op), response);
      return FinishNow(context, absl::OkStatus());
    }
    return ReplyWhenDone(*op, request->wait_timeout_seconds(), caller->admission, response);
  }
  ToProto(ctx_.executor.GetStatus(**op), response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperationServiceImpl::GetOperation(grpc::CallbackServerContext* context,
                                                             const v1::GetOperationRequest* request,
                                                             v1::Operation* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  absl::StatusOr<std::shared_ptr<Operation>> op =
      ctx_.executor.FindOperation(caller->scope, request->operation_id());
  if (!op.ok()) return FinishNow(context, op.status());
  ToProto(ctx_.executor.GetStatus(**op), response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperationServiceImpl::WaitOperation(
    grpc::CallbackServerContext* context, const v1::WaitOperationRequest* request,
    v1::Operation* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckTimeout(request->timeout_seconds()); !s.ok())
    return FinishNow(context, s);
  absl::StatusOr<std::shared_ptr<Operation>> op =
      ctx_.executor.FindOperation(caller->scope, request->operation_id());
  if (!op.ok()) return FinishNow(context, op.status());
  return ReplyWhenDone(*op, request->timeout_seconds(), caller->admission, response);
}

}  // namespace gpucompute

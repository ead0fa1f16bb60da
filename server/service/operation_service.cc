// OperationService: Submit, GetOperation, WaitOperation.
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/util/request_id.h"
#include "server/util/status_macros.h"
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
    grpc::CallbackServerContext& context, const v1::SubmitRequest& request,
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
    if (AwaitBriefly(*op)) {
      ToProto(Executor::FinalStatus(**op), response);
      return FinishNow(context, absl::OkStatus());
    }
    return ReplyWhenDone(*op, request->wait_timeout_seconds(), caller->admission, response);
  }
  ToProto(ctx_.executor.GetStatus(**op), response);
  return FinishNow(context, absl::OkStatus());
}

bool OperationServiceImpl::AwaitBriefly(const std::shared_ptr<Operation>& op) {
  // A small operation is done within microseconds of its launch. Answering it from this
  // thread saves the hand-off of the reply to the thread that sees it complete, and the
  // wake-up of a gRPC thread to send it: on the order of 100 us, more than a small
  // operation's whole device time. Large operations (more than kBriefBytes of traffic)
  // skip the spin, so no gRPC thread spins for long.
  constexpr uint64_t kBriefBytes = 64 << 20;
  constexpr auto kBriefWait = std::chrono::microseconds(100);
  if (op->traffic_bytes() > kBriefBytes) return false;
  auto done = std::make_shared<std::atomic<bool>>(false);
  ctx_.executor.OnDone(op, [done] { done->store(true, std::memory_order_release); });
  const auto deadline = std::chrono::steady_clock::now() + kBriefWait;
  while (!done->load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
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

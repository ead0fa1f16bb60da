// The reactors every service shares: DeferredReactor and FinishNow (services.h).
#include "server/service/services.h"

namespace gpucompute {

void DeferredReactor::FinishOnce(const std::shared_ptr<State>& state,
                                 absl::FunctionRef<grpc::Status()> produce) {
  absl::MutexLock lock(&state->mu);
  if (state->finished) return;
  state->finished = true;
  state->reactor->Finish(produce());
}

void DeferredReactor::OnCancel() {
  FinishOnce(state_, [] { return ToGrpcStatus(absl::CancelledError("the call was cancelled")); });
  if (on_cancel_) std::move(on_cancel_)();
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace gpucompute

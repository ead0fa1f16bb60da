// StreamService: CreateStream, DeleteStream, SynchronizeStream, ListStreams.
#include "absl/strings/str_cat.h"
#include "server/service/services.h"

namespace gpucompute {
namespace {

void ToProto(const StreamInfo& s, v1::StreamInfo* out) {
  out->set_id(s.id);
  out->set_device(s.device);
  out->set_is_default(s.is_default);
  out->set_pending_operations(s.pending_operations);
}

}  // namespace

grpc::ServerUnaryReactor* StreamServiceImpl::CreateStream(grpc::CallbackServerContext* context,
                                                          const v1::CreateStreamRequest* request,
                                                          v1::StreamInfo* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  const int device = request->has_device() ? request->device() : ctx_.executor.default_device();
  absl::StatusOr<StreamInfo> info = ctx_.executor.CreateStream(caller->scope, device);
  if (info.ok()) ToProto(*info, response);
  return FinishNow(context, info.status());
}

grpc::ServerUnaryReactor* StreamServiceImpl::DeleteStream(grpc::CallbackServerContext* context,
                                                          const v1::DeleteStreamRequest* request,
                                                          v1::DeleteStreamResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  auto* reactor = new DeferredReactor(caller->admission);
  absl::Status s =
      ctx_.executor.DeleteStream(caller->scope, request->stream_id(), [state = reactor->state()] {
        DeferredReactor::FinishOnce(state, [] { return grpc::Status::OK; });
      });
  if (!s.ok()) DeferredReactor::FinishOnce(reactor->state(), [&] { return ToGrpcStatus(s); });
  return reactor;
}

grpc::ServerUnaryReactor* StreamServiceImpl::SynchronizeStream(
    grpc::CallbackServerContext* context, const v1::SynchronizeStreamRequest* request,
    v1::SynchronizeStreamResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  const double timeout = request->timeout_seconds();
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return FinishNow(context, s);
  std::string stream_id = request->stream_id();
  if (stream_id.empty()) {
    absl::StatusOr<StreamInfo> info =
        ctx_.executor.DefaultStream(caller->scope, ctx_.executor.default_device());
    if (!info.ok()) return FinishNow(context, info.status());
    stream_id = info->id;
  }
  auto* reactor = new DeferredReactor(caller->admission);
  std::shared_ptr<DeferredReactor::State> state = reactor->state();
  absl::Status s = FirstOfEventOrTimeout(
      ctx_, timeout,
      [&](absl::AnyInvocable<void() &&> on_idle) {
        return ctx_.executor.Synchronize(caller->scope, stream_id, std::move(on_idle));
      },
      [state, response](bool timed_out) {
        DeferredReactor::FinishOnce(state, [&] {
          response->set_idle(!timed_out);
          return grpc::Status::OK;
        });
      });
  if (!s.ok()) DeferredReactor::FinishOnce(state, [&] { return ToGrpcStatus(s); });
  return reactor;
}

grpc::ServerUnaryReactor* StreamServiceImpl::ListStreams(grpc::CallbackServerContext* context,
                                                         const v1::ListStreamsRequest* request,
                                                         v1::ListStreamsResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  // The default stream exists from the client's first call on.
  absl::StatusOr<StreamInfo> def =
      ctx_.executor.DefaultStream(caller->scope, ctx_.executor.default_device());
  if (!def.ok()) return FinishNow(context, def.status());
  for (const StreamInfo& s : ctx_.executor.ListStreams(caller->scope))
    ToProto(s, response->add_streams());
  return FinishNow(context, absl::OkStatus());
}

}  // namespace gpucompute

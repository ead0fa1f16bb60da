// The gRPC services of gpucompute.v1, one class per RPC family, all on the callback
// API. Handlers validate, hand work to the executor and return; none blocks on compute.
#ifndef GPUCOMPUTE_SERVER_SERVICE_SERVICES_H_
#define GPUCOMPUTE_SERVER_SERVICE_SERVICES_H_

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "server/service/proto_conversions.h"
#include "server/service/service_context.h"
#include "server/service/upload_transfer.h"

namespace gpucompute {

// A unary call finished later from a callback that may race with cancellation.
// FinishOnce finishes it at most once, however many times and from wherever it is
// called, and is safe after the call is over.
class DeferredReactor final : public grpc::ServerUnaryReactor {
 public:
  struct State {
    absl::Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    DeferredReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // valid until finished
  };

  // `admission` (Caller::admission) is held until the call is done.
  explicit DeferredReactor(std::shared_ptr<const void> admission)
      : state_(std::make_shared<State>()), admission_(std::move(admission)) {
    state_->reactor = this;
  }
  const std::shared_ptr<State>& state() const { return state_; }
  // Runs `on_cancel` too if the call is cancelled, e.g. to give up the work it stood
  // for. Set it before the handler returns the reactor.
  void CallOnCancel(absl::AnyInvocable<void() &&> on_cancel) { on_cancel_ = std::move(on_cancel); }

  // `produce` writes the response and returns the call's status; it runs only if the
  // call is not finished yet.
  static void FinishOnce(const std::shared_ptr<State>& state,
                         absl::FunctionRef<grpc::Status()> produce);

  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<const void> admission_;
  absl::AnyInvocable<void() &&> on_cancel_;
};

// A reactor finished at once with `status`.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status);

// A streaming reactor that answers `status` at once: a streaming call refused before
// its reactor would start.
template <typename Reactor>
class Refusal final : public Reactor {
 public:
  explicit Refusal(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// Parses `bytes` into `message` as gRPC would, without copying them (a ByteBuffer's copy
// refs its slices). INVALID_ARGUMENT "a malformed gpucompute.v1.X message", the words of
// every RPC served raw, for bytes that do not parse.
inline absl::Status ParseRequest(const grpc::ByteBuffer& bytes,
                                 google::protobuf::MessageLite* message) {
  grpc::ByteBuffer view = bytes;
  if (grpc::SerializationTraits<google::protobuf::MessageLite>::Deserialize(&view, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("a malformed ", message->GetTypeName(), " message"));
}

// `message` serialized as gRPC would serialize it (into slices of its own, no copy after).
inline grpc::ByteBuffer SerializeResponse(const google::protobuf::MessageLite& message) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  // Fails only past protobuf's 2 GiB, which no response of this API comes near.
  (void)grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(message, &bytes,
                                                                            &own_buffer);
  return bytes;
}

// Upload and Download are served in their raw form (grpc::ByteBuffer messages), so that
// their reactors read and write chunk bytes without protobuf's copies; the wire format is
// the generated messages' all the same.
class BufferServiceImpl final
    : public v1::BufferService::WithRawCallbackMethod_Upload<
          v1::BufferService::WithRawCallbackMethod_Download<v1::BufferService::CallbackService>> {
 public:
  explicit BufferServiceImpl(ServiceContext& ctx)
      : ctx_(ctx), uploads_(std::make_shared<UploadTransferTable>()) {}

  // The multi-range uploads in progress, whose ranges SharedMemoryService's copies may
  // carry too.
  const std::shared_ptr<UploadTransferTable>& uploads() const { return uploads_; }

  grpc::ServerUnaryReactor* CreateBuffer(grpc::CallbackServerContext* context,
                                         const v1::CreateBufferRequest* request,
                                         v1::CreateBufferResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* BeginUpload(grpc::CallbackServerContext* context,
                                        const v1::BeginUploadRequest* request,
                                        v1::BeginUploadResponse* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetBuffer(grpc::CallbackServerContext* context,
                                      const v1::GetBufferRequest* request,
                                      v1::BufferInfo* response) override;
  grpc::ServerUnaryReactor* ListBuffers(grpc::CallbackServerContext* context,
                                        const v1::ListBuffersRequest* request,
                                        v1::ListBuffersResponse* response) override;
  grpc::ServerUnaryReactor* DeleteBuffer(grpc::CallbackServerContext* context,
                                         const v1::DeleteBufferRequest* request,
                                         v1::DeleteBufferResponse* response) override;
  grpc::ServerUnaryReactor* RenewLease(grpc::CallbackServerContext* context,
                                       const v1::RenewLeaseRequest* request,
                                       v1::RenewLeaseResponse* response) override;

  // Multi-range uploads in progress.
  size_t uploads_in_progress() { return uploads_->size(); }

 private:
  ServiceContext& ctx_;
  const std::shared_ptr<UploadTransferTable> uploads_;
};

class StreamServiceImpl final : public v1::StreamService::CallbackService {
 public:
  explicit StreamServiceImpl(ServiceContext& ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* CreateStream(grpc::CallbackServerContext* context,
                                         const v1::CreateStreamRequest* request,
                                         v1::StreamInfo* response) override;
  grpc::ServerUnaryReactor* DeleteStream(grpc::CallbackServerContext* context,
                                         const v1::DeleteStreamRequest* request,
                                         v1::DeleteStreamResponse* response) override;
  grpc::ServerUnaryReactor* SynchronizeStream(grpc::CallbackServerContext* context,
                                              const v1::SynchronizeStreamRequest* request,
                                              v1::SynchronizeStreamResponse* response) override;
  grpc::ServerUnaryReactor* ListStreams(grpc::CallbackServerContext* context,
                                        const v1::ListStreamsRequest* request,
                                        v1::ListStreamsResponse* response) override;

 private:
  ServiceContext& ctx_;
};

class OperationServiceImpl final : public v1::OperationService::CallbackService {
 public:
  explicit OperationServiceImpl(ServiceContext& ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const v1::SubmitRequest* request,
                                   v1::Operation* response) override;
  grpc::ServerUnaryReactor* GetOperation(grpc::CallbackServerContext* context,
                                         const v1::GetOperationRequest* request,
                                         v1::Operation* response) override;
  grpc::ServerUnaryReactor* WaitOperation(grpc::CallbackServerContext* context,
                                          const v1::WaitOperationRequest* request,
                                          v1::Operation* response) override;

 private:
  // Identifies the caller (into `caller`), plans `request` and queues its operation: the
  // part of Submit that runs on the warm lane.
  absl::StatusOr<std::shared_ptr<Operation>> Start(const grpc::CallbackServerContext& context,
                                                   const v1::SubmitRequest& request,
                                                   absl::StatusOr<Caller>& caller);
  // Answers with `op` once it is done or `timeout_seconds` passes, holding the call's
  // `admission` (Caller::admission) meanwhile.
  grpc::ServerUnaryReactor* ReplyWhenDone(const std::shared_ptr<Operation>& op,
                                          double timeout_seconds,
                                          std::shared_ptr<const void> admission,
                                          v1::Operation* response);
  // Whether a small `op` finishes within a brief spin on this thread (see the .cc).
  bool AwaitBriefly(const std::shared_ptr<Operation>& op);

  ServiceContext& ctx_;
};

class ServerServiceImpl final : public v1::ServerService::CallbackService {
 public:
  explicit ServerServiceImpl(ServiceContext& ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::Stats* response) override;
  grpc::ServerUnaryReactor* TrimMemoryPool(grpc::CallbackServerContext* context,
                                           const v1::TrimMemoryPoolRequest* request,
                                           v1::TrimMemoryPoolResponse* response) override;
  grpc::ServerUnaryReactor* StartProfiler(grpc::CallbackServerContext* context,
                                          const v1::StartProfilerRequest* request,
                                          v1::StartProfilerResponse* response) override;
  grpc::ServerUnaryReactor* StopProfiler(grpc::CallbackServerContext* context,
                                         const v1::StopProfilerRequest* request,
                                         v1::StopProfilerResponse* response) override;

 private:
  ServiceContext& ctx_;
};

// SharedMemoryService: regions of shared memory and CUDA IPC, and copies between them and
// buffers (shared_memory_service.cc).
class SharedMemoryServiceImpl final : public v1::SharedMemoryService::CallbackService {
 public:
  // `uploads`: BufferService's multi-range uploads, whose ranges CopyFromRegion may carry.
  SharedMemoryServiceImpl(ServiceContext& ctx, std::shared_ptr<UploadTransferTable> uploads)
      : ctx_(ctx), uploads_(std::move(uploads)) {}

  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegionInfo* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* CopyFromRegion(grpc::CallbackServerContext* context,
                                           const v1::CopyFromRegionRequest* request,
                                           v1::CopyRegionResponse* response) override;
  grpc::ServerUnaryReactor* CopyToRegion(grpc::CallbackServerContext* context,
                                         const v1::CopyToRegionRequest* request,
                                         v1::CopyRegionResponse* response) override;
  grpc::ServerUnaryReactor* ExportBuffer(grpc::CallbackServerContext* context,
                                         const v1::ExportBufferRequest* request,
                                         v1::ExportBufferResponse* response) override;

 private:
  ServiceContext& ctx_;
  const std::shared_ptr<UploadTransferTable> uploads_;
};

// Sessions (session_service.cc) and chains (chain_service.cc): tagged operations that
// feed each other without a round trip between them.
// SessionService.RunChain (chain_service.cc).
// Served in its raw form (a ChainRequest's bytes in, a ChainResponse's out), so that a
// chain submitted again is known by its bytes before they are parsed (chain_replay.h).
grpc::ServerUnaryReactor* RunChainCall(ServiceContext& ctx, grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response);

// SessionService on gRPC's callback API (session_service.cc), both methods raw: a
// session parses its requests itself (ParseRequest) and a chain is known by its bytes.
class SessionServiceImpl final
    : public v1::SessionService::WithRawCallbackMethod_Session<
          v1::SessionService::WithRawCallbackMethod_RunChain<v1::SessionService::Service>> {
 public:
  explicit SessionServiceImpl(ServiceContext& ctx) : ctx_(ctx) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* RunChain(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    return RunChainCall(ctx_, context, request, response);
  }

 private:
  ServiceContext& ctx_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_SERVICES_H_

// The gRPC services of gpucompute.v1, one class per RPC family, all on the callback
// API. Handlers validate, hand work to the executor and return; none blocks on compute.
// Every method is served raw (bytes in and out), so that a request that does not parse
// is INVALID_ARGUMENT naming its type; the unary ones keep their typed handlers
// (ParsedUnaryService).
#ifndef GPUCOMPUTE_SERVER_SERVICE_SERVICES_H_
#define GPUCOMPUTE_SERVER_SERVICE_SERVICES_H_

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <memory>
#include <string>

#include <google/protobuf/descriptor.h>
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

// Serves a unary method raw (bytes in and out) around its typed handler, so that a
// request that does not parse is answered INVALID_ARGUMENT naming its type, where gRPC's
// typed handler would answer UNIMPLEMENTED with no message. Otherwise the handler and its
// reactor run as they would typed: the request is parsed once and the response
// serialized once, as gRPC would; the handler's reactor is bound to a relay whose Finish
// serializes the response and finishes the real call, and the real call's events
// (OnCancel, OnDone) are passed on to it.
template <typename Request, typename Response>
class ParsedUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  // `handler(context, request, response)` returns the typed handler's reactor.
  template <typename Handler>
  static grpc::ServerUnaryReactor* Start(const Handler& handler,
                                         grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request_bytes,
                                         grpc::ByteBuffer* response_bytes) {
    auto* self = new ParsedUnaryReactor(response_bytes);
    if (absl::Status parsed = ParseRequest(*request_bytes, &self->request_); !parsed.ok()) {
      self->Finish(ToGrpcStatus(parsed));
      return self;
    }
    self->typed_ = handler(context, &self->request_, &self->response_);
    self->relay_.Bind(self->typed_);
    return self;
  }

  void OnSendInitialMetadataDone(bool ok) override {
    if (typed_ != nullptr) typed_->OnSendInitialMetadataDone(ok);
  }
  // A typed reactor that has finished has nothing left to give up, so it is not told of a
  // cancellation. That also keeps OnCancel off the context's default reactor, which the
  // handlers that answer at once return, and which gRPC destroys with the context.
  void OnCancel() override {
    if (typed_ != nullptr && !typed_finished_.load(std::memory_order_acquire)) {
      typed_->OnCancel();
    }
  }
  void OnDone() override {
    if (typed_ != nullptr) typed_->OnDone();
    delete this;
  }

 private:
  // The call the typed reactor is bound to.
  class Relay final : public grpc::ServerCallbackUnary {
   public:
    explicit Relay(ParsedUnaryReactor* outer) : outer_(outer) {}
    void Bind(grpc::ServerUnaryReactor* reactor) { BindReactor(reactor); }
    void Finish(grpc::Status status) override { outer_->FinishTyped(std::move(status)); }
    void SendInitialMetadata() override { outer_->StartSendInitialMetadata(); }

   private:
    // The real call counts the callbacks and calls OnDone; the relay never does.
    grpc::internal::ServerReactor* reactor() override { return outer_; }
    void CallOnDone() override {}

    ParsedUnaryReactor* const outer_;
  };

  explicit ParsedUnaryReactor(grpc::ByteBuffer* response_bytes)
      : response_bytes_(response_bytes), relay_(this) {}

  void FinishTyped(grpc::Status status) {
    typed_finished_.store(true, std::memory_order_release);
    if (status.ok()) *response_bytes_ = SerializeResponse(response_);
    Finish(std::move(status));
  }

  Request request_;
  Response response_;
  grpc::ByteBuffer* const response_bytes_;  // the call's, valid until OnDone
  grpc::ServerUnaryReactor* typed_ = nullptr;
  std::atomic<bool> typed_finished_{false};
  Relay relay_;
};

// The index gRPC registers unary `method` of `service` under (the order of the .proto
// file, as the generated code registers them). Aborts, naming them, unless the API has
// such a method taking `request`: a mistake of the code, met by every test at start.
inline int UnaryMethodIndex(const char* service, const char* method,
                            const google::protobuf::Descriptor* request) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  const google::protobuf::MethodDescriptor* m =
      s == nullptr ? nullptr : s->FindMethodByName(method);
  if (m == nullptr || m->client_streaming() || m->server_streaming() ||
      m->input_type() != request) {
    std::fprintf(stderr, "%s has no unary method %s taking %s\n", service, method,
                 std::string(request->full_name()).c_str());
    std::abort();
  }
  return m->index();
}

// A service of the API (`Api`, e.g. v1::BufferService) whose unary methods its
// constructor serves through ParsedUnaryReactor (ServeParsed), on `Base`.
template <typename Api, typename Base>
class ParsedUnaryService : public Base {
 protected:
  // Serves `method` raw, its typed `handler` (a member function of `Self`) unchanged.
  template <typename Self, typename Request, typename Response>
  void ServeParsed(const char* method,
                   grpc::ServerUnaryReactor* (Self::*handler)(grpc::CallbackServerContext*,
                                                              const Request*, Response*)) {
    Self* self = static_cast<Self*>(this);
    auto typed = [self, handler](grpc::CallbackServerContext* context, const Request* request,
                                 Response* response) {
      return (self->*handler)(context, request, response);
    };
    this->MarkMethodRawCallback(
        UnaryMethodIndex(Api::service_full_name(), method, Request::descriptor()),
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [typed](grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                    grpc::ByteBuffer* response) {
              return ParsedUnaryReactor<Request, Response>::Start(typed, context, request,
                                                                  response);
            }));
  }
};

// Upload and Download are served in their raw form (grpc::ByteBuffer messages), so that
// their reactors read and write chunk bytes without protobuf's copies; the wire format is
// the generated messages' all the same.
class BufferServiceImpl final
    : public ParsedUnaryService<v1::BufferService,
                                v1::BufferService::WithRawCallbackMethod_Upload<
                                    v1::BufferService::WithRawCallbackMethod_Download<
                                        v1::BufferService::CallbackService>>> {
 public:
  explicit BufferServiceImpl(ServiceContext& ctx)
      : ctx_(ctx), uploads_(std::make_shared<UploadTransferTable>()) {
    ServeParsed("CreateBuffer", &BufferServiceImpl::CreateBuffer);
    ServeParsed("BeginUpload", &BufferServiceImpl::BeginUpload);
    ServeParsed("GetBuffer", &BufferServiceImpl::GetBuffer);
    ServeParsed("ListBuffers", &BufferServiceImpl::ListBuffers);
    ServeParsed("DeleteBuffer", &BufferServiceImpl::DeleteBuffer);
    ServeParsed("RenewLease", &BufferServiceImpl::RenewLease);
  }

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

class StreamServiceImpl final
    : public ParsedUnaryService<v1::StreamService, v1::StreamService::CallbackService> {
 public:
  explicit StreamServiceImpl(ServiceContext& ctx) : ctx_(ctx) {
    ServeParsed("CreateStream", &StreamServiceImpl::CreateStream);
    ServeParsed("DeleteStream", &StreamServiceImpl::DeleteStream);
    ServeParsed("SynchronizeStream", &StreamServiceImpl::SynchronizeStream);
    ServeParsed("ListStreams", &StreamServiceImpl::ListStreams);
  }

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

class OperationServiceImpl final
    : public ParsedUnaryService<v1::OperationService, v1::OperationService::CallbackService> {
 public:
  explicit OperationServiceImpl(ServiceContext& ctx) : ctx_(ctx) {
    ServeParsed("Submit", &OperationServiceImpl::Submit);
    ServeParsed("GetOperation", &OperationServiceImpl::GetOperation);
    ServeParsed("WaitOperation", &OperationServiceImpl::WaitOperation);
  }

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
  absl::StatusOr<std::shared_ptr<Operation>> Start(grpc::CallbackServerContext& context,
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

class ServerServiceImpl final
    : public ParsedUnaryService<v1::ServerService, v1::ServerService::CallbackService> {
 public:
  explicit ServerServiceImpl(ServiceContext& ctx) : ctx_(ctx) {
    ServeParsed("GetServerInfo", &ServerServiceImpl::GetServerInfo);
    ServeParsed("GetStats", &ServerServiceImpl::GetStats);
    ServeParsed("TrimMemoryPool", &ServerServiceImpl::TrimMemoryPool);
    ServeParsed("StartProfiler", &ServerServiceImpl::StartProfiler);
    ServeParsed("StopProfiler", &ServerServiceImpl::StopProfiler);
  }

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
class SharedMemoryServiceImpl final
    : public ParsedUnaryService<v1::SharedMemoryService, v1::SharedMemoryService::CallbackService> {
 public:
  // `uploads`: BufferService's multi-range uploads, whose ranges CopyFromRegion may carry.
  SharedMemoryServiceImpl(ServiceContext& ctx, std::shared_ptr<UploadTransferTable> uploads)
      : ctx_(ctx), uploads_(std::move(uploads)) {
    ServeParsed("RegisterRegion", &SharedMemoryServiceImpl::RegisterRegion);
    ServeParsed("UnregisterRegion", &SharedMemoryServiceImpl::UnregisterRegion);
    ServeParsed("ListRegions", &SharedMemoryServiceImpl::ListRegions);
    ServeParsed("CopyFromRegion", &SharedMemoryServiceImpl::CopyFromRegion);
    ServeParsed("CopyToRegion", &SharedMemoryServiceImpl::CopyToRegion);
    ServeParsed("ExportBuffer", &SharedMemoryServiceImpl::ExportBuffer);
  }

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

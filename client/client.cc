#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <stdexcept>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

// The four generated stubs, sharing the Client's channel.
struct Client::Stubs {
  explicit Stubs(const std::shared_ptr<grpc::Channel>& channel)
      : buffers(v1::BufferService::NewStub(channel)),
        streams(v1::StreamService::NewStub(channel)),
        operations(v1::OperationService::NewStub(channel)),
        server(v1::ServerService::NewStub(channel)) {}

  std::unique_ptr<v1::BufferService::Stub> buffers;
  std::unique_ptr<v1::StreamService::Stub> streams;
  std::unique_ptr<v1::OperationService::Stub> operations;
  std::unique_ptr<v1::ServerService::Stub> server;
};

namespace {

// Messages the channel accepts beyond the server's limit: a download chunk of the
// full limit plus its framing and the buffer info.
constexpr size_t kMessageSlackBytes = size_t{1} << 20;

// What a call needs to build its context; asynchronous calls keep a copy.
struct CallSettings {
  std::string client_name;
  absl::Duration timeout;
};

std::unique_ptr<grpc::ClientContext> MakeContext(const CallSettings& settings, bool unary) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!settings.client_name.empty()) {
    context->AddMetadata(kClientMetadataKey, settings.client_name);
  }
  if (unary && settings.timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + settings.timeout));
  }
  return context;
}

CallSettings SettingsOf(const ClientOptions& options) {
  return CallSettings{options.client_name, options.timeout};
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(const CallSettings& settings, Stub* stub,
                                   grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                                   const Request& request) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(settings, /*unary=*/true);
  Response response;
  grpc::Status status = (stub->*method)(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

namespace client_internal {

class AsyncOperationCall;

// The asynchronous calls in flight. The Client cancels them and waits until they are
// destroyed before it destroys the channel: a channel must not be destroyed from one
// of its own callbacks, which is where the last reference would otherwise drop.
class AsyncCallRegistry {
 public:
  void Add(AsyncOperationCall* call, std::weak_ptr<AsyncOperationCall> handle) {
    absl::MutexLock lock(&mu_);
    calls_.emplace(call, std::move(handle));
  }

  // Called by each call's destructor.
  void Remove(AsyncOperationCall* call) {
    absl::MutexLock lock(&mu_);
    calls_.erase(call);
  }

  void CancelAllAndWait();

  // Submissions reach the server in the order they were made: one Submit RPC is in
  // flight at a time, and the next starts when the previous is answered. The waits
  // that follow run concurrently.
  void QueueSubmit(std::shared_ptr<AsyncOperationCall> call);
  void SubmitAnswered();
  // Blocks until every queued asynchronous submission has been answered, so that a
  // synchronous Submit cannot overtake them.
  void WaitForSubmissions();

 private:
  absl::Mutex mu_;
  std::map<AsyncOperationCall*, std::weak_ptr<AsyncOperationCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<AsyncOperationCall>> submit_queue_ ABSL_GUARDED_BY(mu_);
  bool submitting_ ABSL_GUARDED_BY(mu_) = false;
};

// Submits an operation and then waits for it with WaitOperation, each step started
// from the previous one's callback, until it is done, an RPC fails or it is cancelled.
// Owns everything the RPCs use; the callbacks hold it alive.
class AsyncOperationCall : public std::enable_shared_from_this<AsyncOperationCall> {
 public:
  AsyncOperationCall(CallSettings settings, v1::OperationService::Stub* stub,
                     std::shared_ptr<AsyncCallRegistry> registry, v1::SubmitRequest request)
      : settings_(std::move(settings)),
        stub_(stub),
        registry_(std::move(registry)),
        submit_request_(std::move(request)) {
    submit_request_.set_wait(false);
    submit_request_.set_wait_timeout_seconds(0);
  }

  ~AsyncOperationCall() { registry_->Remove(this); }

  std::shared_future<absl::StatusOr<v1::Operation>> future() {
    return promise_.get_future().share();
  }

  void Start() {
    registry_->Add(this, weak_from_this());
    registry_->QueueSubmit(shared_from_this());
  }

  // Sends the Submit RPC; called by the registry in submission order.
  void SendSubmit() {
    std::shared_ptr<grpc::ClientContext> context = NextContext();
    if (context == nullptr) {
      registry_->SubmitAnswered();
      return;
    }
    if (context == nullptr) return;
    stub_->async()->Submit(context.get(), &submit_request_, &response_,
                           [self = shared_from_this()](grpc::Status status) {
                             self->registry_->SubmitAnswered();
                             self->OnReply(status);
                           });
  }

  // For a call cancelled before its Submit was sent.
  void ResolveCancelled() { promise_.set_value(absl::CancelledError("the client was destroyed")); }

  // Cancels the RPC in flight and starts no other; the future resolves to CANCELLED.
  void Cancel() {
    std::shared_ptr<grpc::ClientContext> context;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      context = context_;
    }
    // Outside the lock: gRPC may run the call's callback inside TryCancel.
    if (context != nullptr) context->TryCancel();
  }

 private:
  // A fresh context for the next RPC (one context serves one call), or null when
  // cancelled (the future is then resolved). A context cancelled before its call
  // starts cancels the call when it does.
  std::shared_ptr<grpc::ClientContext> NextContext() {
    std::shared_ptr<grpc::ClientContext> context = MakeContext(settings_, /*unary=*/true);
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      promise_.set_value(absl::CancelledError("the client was destroyed"));
      return nullptr;
    }
    // The finished call holds its own reference until its callback returns, so the
    // context it used can go now.
    context_ = context;
    return context;
  }

  // Runs on a gRPC thread: never blocks, only starts the next RPC or resolves.
  void OnReply(const grpc::Status& status) {
    if (!status.ok()) {
      promise_.set_value(FromGrpcStatus(status));
      return;
    }
    if (response_.done()) {
      promise_.set_value(std::move(response_));
      return;
    }
    // A WaitOperation that returns before the operation is done (the server bounds
    // its waits) is simply repeated.
    wait_request_.set_operation_id(response_.id());
    std::shared_ptr<grpc::ClientContext> context = NextContext();
    if (context == nullptr) return;
    stub_->async()->WaitOperation(
        context.get(), &wait_request_, &response_,
        [self = shared_from_this()](grpc::Status status) { self->OnReply(status); });
  }

  const CallSettings settings_;
  v1::OperationService::Stub* const stub_;
  const std::shared_ptr<AsyncCallRegistry> registry_;
  std::promise<absl::StatusOr<v1::Operation>> promise_;
  v1::SubmitRequest submit_request_;
  v1::WaitOperationRequest wait_request_;
  v1::Operation response_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
};

void AsyncCallRegistry::QueueSubmit(std::shared_ptr<AsyncOperationCall> call) {
  {
    absl::MutexLock lock(&mu_);
    if (submitting_) {
      submit_queue_.push_back(std::move(call));
      return;
    }
    submitting_ = true;
  }
  call->SendSubmit();
}

void AsyncCallRegistry::SubmitAnswered() {
  std::shared_ptr<AsyncOperationCall> next;
  {
    absl::MutexLock lock(&mu_);
    if (submit_queue_.empty()) {
      submitting_ = false;
      return;
    }
    next = std::move(submit_queue_.front());
    submit_queue_.pop_front();
  }
  next->SendSubmit();
}

void AsyncCallRegistry::WaitForSubmissions() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* submitting) { return !*submitting; }, &submitting_));
}

void AsyncCallRegistry::CancelAllAndWait() {
  std::deque<std::shared_ptr<AsyncOperationCall>> unsent;
  {
    absl::MutexLock lock(&mu_);
    unsent.swap(submit_queue_);
  }
  for (const std::shared_ptr<AsyncOperationCall>& call : unsent) call->ResolveCancelled();
  unsent.clear();
  std::vector<std::shared_ptr<AsyncOperationCall>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [call, handle] : calls_) {
      if (std::shared_ptr<AsyncOperationCall> strong = handle.lock()) live.push_back(strong);
    }
  }
  for (const std::shared_ptr<AsyncOperationCall>& call : live) call->Cancel();
  // Dropping these may destroy calls, which take mu_.
  live.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::map<AsyncOperationCall*, std::weak_ptr<AsyncOperationCall>>* calls) {
        return calls->empty();
      },
      &calls_));
}

}  // namespace client_internal

namespace {

bool IsValidClientName(std::string_view name) {
  if (name.size() > kMaxClientNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their values (google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool OperationFuture::Ready() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

bool OperationFuture::Wait(absl::Duration timeout) const {
  if (!future_.valid()) return false;
  if (timeout == absl::InfiniteDuration()) {
    future_.wait();
    return true;
  }
  return future_.wait_for(absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()))) ==
         std::future_status::ready;
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stubs_(std::make_unique<Stubs>(channel_)),
      async_calls_(std::make_shared<client_internal::AsyncCallRegistry>()) {}

Client::~Client() { async_calls_->CancelAllAndWait(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("the server address is empty");
  }
  if (!IsValidClientName(options.client_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the client name must be at most ", kMaxClientNameBytes, " printable ASCII characters"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the call timeout must be positive");
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  arguments.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), arguments);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", options.target));
  }
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

size_t Client::ChunkBytes() const {
  if (options_.chunk_bytes == 0) return kDefaultChunkBytes;
  return std::min<size_t>(options_.chunk_bytes, kMaxChunkBytes);
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  return CallUnary(SettingsOf(options_), stubs_->server.get(),
                   &v1::ServerService::Stub::GetServerInfo, v1::GetServerInfoRequest());
}

absl::StatusOr<v1::Stats> Client::GetStats() {
  return CallUnary(SettingsOf(options_), stubs_->server.get(), &v1::ServerService::Stub::GetStats,
                   v1::GetStatsRequest());
}

absl::StatusOr<v1::TrimMemoryPoolResponse> Client::TrimMemoryPool(std::optional<int> device,
                                                                  uint64_t keep_bytes) {
  v1::TrimMemoryPoolRequest request;
  if (device.has_value()) request.set_device(*device);
  request.set_keep_bytes(keep_bytes);
  return CallUnary(SettingsOf(options_), stubs_->server.get(),
                   &v1::ServerService::Stub::TrimMemoryPool, request);
}

absl::Status Client::StartProfiler() {
  return CallUnary(SettingsOf(options_), stubs_->server.get(),
                   &v1::ServerService::Stub::StartProfiler, v1::StartProfilerRequest())
      .status();
}

absl::Status Client::StopProfiler() {
  return CallUnary(SettingsOf(options_), stubs_->server.get(),
                   &v1::ServerService::Stub::StopProfiler, v1::StopProfilerRequest())
      .status();
}

absl::StatusOr<v1::BufferInfo> Client::CreateBuffer(const v1::CreateBufferRequest& request) {
  absl::StatusOr<v1::CreateBufferResponse> response = CallUnary(
      SettingsOf(options_), stubs_->buffers.get(), &v1::BufferService::Stub::CreateBuffer, request);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_buffer());
}

absl::StatusOr<v1::UploadResponse> Client::Upload(const v1::UploadHeader& header,
                                                  std::span<const std::byte> data,
                                                  const ProgressFn& progress) {
  // Protobuf owns the bytes it sends, so each chunk is copied once into the message.
  return Upload(header, data.size(), SpanReader(data), progress);
}

UploadReader SpanReader(std::span<const std::byte> data) {
  return [data, position = uint64_t{0}](std::span<std::byte> out) mutable -> absl::StatusOr<size_t> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), data.size() - position));
    std::memcpy(out.data(), data.data() + position, n);
    position += n;
    return n;
  };
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(bool unary) const {
  return MakeContext(SettingsOf(options_), unary);
}

absl::StatusOr<v1::UploadResponse> Client::Upload(const v1::UploadHeader& header,
                                                  uint64_t size_bytes, const UploadReader& reader,
                                                  const ProgressFn& progress) {
  if (header.size_bytes() != 0 && header.size_bytes() != size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", size_bytes,
                                                   " are given"));
  }
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      stubs_->buffers->Upload(context.get(), &response);

  v1::UploadRequest request;
  *request.mutable_header() = header;
  request.mutable_header()->set_size_bytes(size_bytes);
  // Write returns false once the stream is broken (the server may already have
  // rejected the header); Finish then tells why.
  bool stream_ok = writer->Write(request);

  const size_t chunk_bytes = ChunkBytes();
  std::string* chunk = request.mutable_chunk();
  absl::Status reader_status;
  uint64_t sent = 0;
  while (stream_ok && sent < size_bytes) {
    const size_t wanted = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, size_bytes - sent));
    chunk->resize(wanted);
    absl::StatusOr<size_t> got =
        reader(std::span<std::byte>(reinterpret_cast<std::byte*>(chunk->data()), wanted));
    if (!got.ok()) {
      reader_status = got.status();
      break;
    }
    if (*got == 0 || *got > wanted) {
      reader_status = absl::InternalError(
          absl::StrCat("the upload reader returned ", *got, " bytes when ", wanted,
                       " were asked for, after ", sent, " of ", size_bytes));
      break;
    }
    chunk->resize(*got);
    stream_ok = writer->Write(request);
    if (!stream_ok) break;
    sent += *got;
    if (progress) progress(sent, size_bytes);
  }

  if (!reader_status.ok()) {
    // Cancelling makes the server discard what it received.
    context->TryCancel();
    writer->Finish().IgnoreError();
    return reader_status;
  }
  if (stream_ok) stream_ok = writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (!stream_ok || sent != size_bytes) {
    return absl::UnavailableError(
        absl::StrCat("the upload stream closed after ", sent, " of ", size_bytes, " bytes"));
  }
  return response;
}

absl::StatusOr<v1::DownloadResponse> Client::DownloadImpl(
    const v1::DownloadRequest& request,
    const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
    const DownloadSink& sink, const ProgressFn& progress) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
      stubs_->buffers->Download(context.get(), request);

  v1::DownloadResponse result;
  result.set_offset_bytes(request.offset_bytes());
  v1::DownloadResponse message;
  bool first = true;
  uint64_t total = 0;
  uint64_t received = 0;
  absl::Status local_status;
  while (reader->Read(&message)) {
    if (first) {
      first = false;
      if (!message.has_buffer() || request.offset_bytes() > message.buffer().size_bytes()) {
        local_status =
            absl::InternalError("the server's first download message does not describe the buffer");
        break;
      }
      *result.mutable_buffer() = message.buffer();
      total = request.size_bytes() != 0 ? request.size_bytes()
                                        : message.buffer().size_bytes() - request.offset_bytes();
      if (on_info) {
        local_status = on_info(result.buffer(), total);
        if (!local_status.ok()) break;
      }
    }
    const std::string& data = message.data();
    if (!data.empty()) {
      const uint64_t expected_offset = request.offset_bytes() + received;
      if (message.offset_bytes() != expected_offset || data.size() > total - received) {
        local_status = absl::InternalError(absl::StrCat(
            "the server sent ", data.size(), " bytes at offset ", message.offset_bytes(), " where ",
            total - received, " bytes at offset ", expected_offset, " remained"));
        break;
      }
      local_status = sink(message.offset_bytes(), data);
      if (!local_status.ok()) break;
      received += data.size();
      if (progress) progress(received, total);
    }
    if (message.has_transfer()) *result.mutable_transfer() = message.transfer();
  }

  if (!local_status.ok()) {
    context->TryCancel();
    while (reader->Read(&message)) {
    }
    reader->Finish().IgnoreError();
    return local_status;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (first) return absl::InternalError("the download ended without a message");
  if (received != total) {
    return absl::InternalError(
        absl::StrCat("the download ended after ", received, " of ", total, " bytes"));
  }
  return result;
}

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      std::string* data,
                                                      const ProgressFn& progress) {
  data->clear();
  auto reserve = [data](const v1::BufferInfo&, uint64_t total) -> absl::Status {
    try {
      data->reserve(static_cast<size_t>(total));
    } catch (const std::length_error&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
    }
    return absl::OkStatus();
  };
  auto append = [data](uint64_t, std::string_view chunk) {
    data->append(chunk);
    return absl::OkStatus();
  };
  return DownloadImpl(request, reserve, append, progress);
}

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      const DownloadSink& sink,
                                                      const ProgressFn& progress) {
  return DownloadImpl(request, {}, sink, progress);
}

absl::StatusOr<v1::BufferInfo> Client::GetBuffer(std::string_view buffer) {
  v1::GetBufferRequest request;
  request.set_buffer(std::string(buffer));
  return CallUnary(SettingsOf(options_), stubs_->buffers.get(), &v1::BufferService::Stub::GetBuffer,
                   request);
}

absl::StatusOr<v1::ListBuffersResponse> Client::ListBuffers() {
  return CallUnary(SettingsOf(options_), stubs_->buffers.get(),
                   &v1::BufferService::Stub::ListBuffers, v1::ListBuffersRequest());
}

absl::Status Client::DeleteBuffer(std::string_view buffer) {
  v1::DeleteBufferRequest request;
  request.set_buffer(std::string(buffer));
  return CallUnary(SettingsOf(options_), stubs_->buffers.get(),
                   &v1::BufferService::Stub::DeleteBuffer, request)
      .status();
}

absl::StatusOr<v1::StreamInfo> Client::CreateStream(std::optional<int> device) {
  v1::CreateStreamRequest request;
  if (device.has_value()) request.set_device(*device);
  return CallUnary(SettingsOf(options_), stubs_->streams.get(),
                   &v1::StreamService::Stub::CreateStream, request);
}

absl::Status Client::DeleteStream(std::string_view stream_id) {
  v1::DeleteStreamRequest request;
  request.set_stream_id(std::string(stream_id));
  return CallUnary(SettingsOf(options_), stubs_->streams.get(),
                   &v1::StreamService::Stub::DeleteStream, request)
      .status();
}

absl::StatusOr<bool> Client::SynchronizeStream(std::string_view stream_id, double timeout_seconds) {
  v1::SynchronizeStreamRequest request;
  request.set_stream_id(std::string(stream_id));
  request.set_timeout_seconds(timeout_seconds);
  absl::StatusOr<v1::SynchronizeStreamResponse> response =
      CallUnary(SettingsOf(options_), stubs_->streams.get(),
                &v1::StreamService::Stub::SynchronizeStream, request);
  if (!response.ok()) return response.status();
  return response->idle();
}

absl::StatusOr<v1::ListStreamsResponse> Client::ListStreams() {
  return CallUnary(SettingsOf(options_), stubs_->streams.get(),
                   &v1::StreamService::Stub::ListStreams, v1::ListStreamsRequest());
}

absl::StatusOr<v1::Operation> Client::Submit(const v1::SubmitRequest& request) {
  async_calls_->WaitForSubmissions();
  return CallUnary(SettingsOf(options_), stubs_->operations.get(),
                   &v1::OperationService::Stub::Submit, request);
}

absl::StatusOr<v1::Operation> Client::GetOperation(std::string_view id) {
  v1::GetOperationRequest request;
  request.set_operation_id(std::string(id));
  return CallUnary(SettingsOf(options_), stubs_->operations.get(),
                   &v1::OperationService::Stub::GetOperation, request);
}

absl::StatusOr<v1::Operation> Client::WaitOperation(std::string_view id, double timeout_seconds) {
  v1::WaitOperationRequest request;
  request.set_operation_id(std::string(id));
  request.set_timeout_seconds(timeout_seconds);
  return CallUnary(SettingsOf(options_), stubs_->operations.get(),
                   &v1::OperationService::Stub::WaitOperation, request);
}

OperationFuture Client::SubmitAsync(v1::SubmitRequest request) {
  auto call = std::make_shared<client_internal::AsyncOperationCall>(
      SettingsOf(options_), stubs_->operations.get(), async_calls_, std::move(request));
  OperationFuture future(call->future());
  call->Start();
  return future;
}

v1::Operand BufferOperand(std::string_view buffer) {
  v1::Operand operand;
  operand.set_buffer(std::string(buffer));
  return operand;
}

v1::Operand ScalarOperand(double value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_float_value(value);
  return operand;
}

v1::Operand ScalarOperand(int64_t value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_int_value(value);
  return operand;
}

v1::Operand ScalarOperand(int value) { return ScalarOperand(static_cast<int64_t>(value)); }

v1::Operand ScalarOperand(bool value) {
  v1::Operand operand;
  operand.mutable_scalar()->set_bool_value(value);
  return operand;
}

v1::Output ExistingOutput(std::string_view buffer) {
  v1::Output output;
  output.set_buffer(std::string(buffer));
  return output;
}

v1::Output NewOutput(std::string_view name, v1::DType dtype) {
  v1::Output output;
  output.set_name(std::string(name));
  output.set_dtype(dtype);
  return output;
}

v1::SubmitRequest Elementwise(
    std::string_view expression,
    std::initializer_list<std::pair<std::string_view, v1::Operand>> inputs, v1::Output output) {
  v1::SubmitRequest request;
  v1::ElementwiseOp* op = request.mutable_elementwise();
  op->set_expression(std::string(expression));
  for (const auto& [name, operand] : inputs) {
    (*op->mutable_inputs())[std::string(name)] = operand;
  }
  *op->mutable_output() = std::move(output);
  return request;
}

v1::SubmitRequest Reduce(v1::ReduceKind kind, std::string_view input, std::optional<int> axis,
                         v1::Output output) {
  v1::SubmitRequest request;
  v1::ReduceOp* op = request.mutable_reduce();
  op->set_input(std::string(input));
  op->set_kind(kind);
  if (axis.has_value()) op->set_axis(*axis);
  *op->mutable_output() = std::move(output);
  return request;
}

v1::SubmitRequest Gemv(std::string_view a, std::string_view x, v1::Output y, bool transpose,
                       double alpha, double beta) {
  v1::SubmitRequest request;
  v1::GemvOp* op = request.mutable_gemv();
  op->set_a(std::string(a));
  op->set_x(std::string(x));
  *op->mutable_y() = std::move(y);
  op->set_transpose(transpose);
  op->set_alpha(alpha);
  op->set_beta(beta);
  return request;
}

v1::SubmitRequest Random(v1::Distribution distribution, const std::vector<uint64_t>& shape,
                         v1::DType dtype, uint64_t seed, v1::Output output) {
  v1::SubmitRequest request;
  v1::RandomOp* op = request.mutable_random();
  op->set_distribution(distribution);
  for (uint64_t dimension : shape) op->add_shape(dimension);
  op->set_seed(seed);
  if (output.dtype() == v1::DTYPE_UNSPECIFIED) output.set_dtype(dtype);
  *op->mutable_output() = std::move(output);
  return request;
}

}  // namespace gpucompute

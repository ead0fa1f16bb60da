#include "client/cpp/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_tuning.h"
#include "common/wire_format.h"

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
  std::string token;
  absl::Duration timeout;
  std::string request_id;
};

std::unique_ptr<grpc::ClientContext> MakeContext(const CallSettings& settings, bool unary) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!settings.client_name.empty()) {
    context->AddMetadata(kClientMetadataKey, settings.client_name);
  }
  if (!settings.token.empty()) context->AddMetadata("authorization", "Bearer " + settings.token);
  if (!settings.request_id.empty()) {
    context->AddMetadata(kRequestIdMetadataKey, settings.request_id);
  }
  if (unary && settings.timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + settings.timeout));
  }
  return context;
}

// Receive window of a transfer channel's streams, with gRPC's window estimate (BDP
// probing) off. Measured on an H100 host over loopback, 512 MiB in 8 streams, two runs:
// downloads 5.2 / 5.4 GB/s with gRPC's defaults, 15.8 / 16.2 with this window (4 streams:
// 4.6 / 6.7 against 10.3 / 10.7). One stream on the main channel keeps the defaults,
// which did better there: 3.8 / 3.9 GB/s against 2.8 / 2.9.
constexpr int kTransferWindowBytes = 64 << 20;

// A channel's arguments: for a transfer channel (`transfer_index` > 0) a connection of
// its own and the window above, then those of the environment
// (common/grpc_tuning.h), then the client's options.
grpc::ChannelArguments ChannelArgumentsFor(const ClientOptions& options,
                                           const GrpcIntArgs& environment, int transfer_index) {
  grpc::ChannelArguments arguments;
  // Every channel has a subchannel pool of its own, so that each Client, and each of its
  // transfer channels, has a connection of its own: gRPC would otherwise share one among
  // all channels of the process to the same target, and every call of every Client
  // would go through that connection's one transport.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (transfer_index > 0) {
    arguments.SetInt("gpucompute.transfer_channel", transfer_index);
    arguments.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kTransferWindowBytes);
    arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }
  for (const auto& [name, value] : environment) arguments.SetInt(name, value);
  if (!options.tls_server_name.empty()) arguments.SetSslTargetNameOverride(options.tls_server_name);
  arguments.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  arguments.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  return arguments;
}

// The chunks of an upload from memory: slices over the caller's memory, which outlives
// the call.
std::function<absl::StatusOr<grpc::Slice>(uint64_t)> MemoryChunks(std::span<const std::byte> data,
                                                                  size_t chunk_bytes) {
  return [data, chunk_bytes](uint64_t sent) -> absl::StatusOr<grpc::Slice> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, data.size() - sent));
    return grpc::Slice(data.data() + sent, n, grpc::Slice::STATIC_SLICE);
  };
}

// Upload and Download are called in their raw form, so that chunks go on and off the
// wire as slices (common/wire_format.h).
constexpr char kUploadMethod[] = "/gpucompute.v1.BufferService/Upload";
constexpr char kDownloadMethod[] = "/gpucompute.v1.BufferService/Download";

CallSettings SettingsOf(const ClientOptions& options) {
  return CallSettings{options.client_name, options.token, options.timeout, options.request_id};
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(const CallSettings& settings, Stub* stub,
                                   grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                                   const Request& request) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(settings, /*unary=*/true);
  Response response;
  grpc::Status status = (stub->*method)(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status, *context);
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

// Metadata values the server accepts: at most `max` printable ASCII characters.
bool IsPrintableAscii(std::string_view value, size_t max) {
  if (value.size() > max) return false;
  return std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CredentialsFor(
    const ClientOptions& options) {
  const bool tls = options.tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
                   !options.tls_key_file.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate and its key go together: give both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("the TLS CA", options.tls_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("the TLS certificate", options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("the TLS key", options.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

// The payload's type URL: any unique string will do.
constexpr char kRequestIdPayload[] = "gpucompute/request-id";

absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context) {
  absl::Status result = FromGrpcStatus(status);
  const auto& metadata = context.GetServerInitialMetadata();
  if (auto it = metadata.find(kRequestIdMetadataKey); it != metadata.end() && !result.ok()) {
    result.SetPayload(kRequestIdPayload,
                      absl::Cord(std::string(it->second.data(), it->second.size())));
  }
  return result;
}

std::string RequestIdOf(const absl::Status& status) {
  const auto id = status.GetPayload(kRequestIdPayload);
  return id.has_value() ? std::string(*id) : std::string();
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

Client::Client(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials,
               GrpcIntArgs grpc_args, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      credentials_(std::move(credentials)),
      grpc_args_(std::move(grpc_args)),
      channel_(std::move(channel)),
      stubs_(std::make_unique<Stubs>(channel_)),
      async_calls_(std::make_shared<client_internal::AsyncCallRegistry>()) {}

Client::~Client() { async_calls_->CancelAllAndWait(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("the server address is empty");
  }
  if (!IsPrintableAscii(options.client_name, kMaxClientNameBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the client name must be at most ", kMaxClientNameBytes, " printable ASCII characters"));
  }
  if (!options.request_id.empty() && !IsPrintableAscii(options.request_id, kMaxRequestIdBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request id must be at most ", kMaxRequestIdBytes, " printable ASCII characters"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the call timeout must be positive");
  }
  if (options.token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("the token must be one line");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = CredentialsFor(options);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<GrpcIntArgs> grpc_args = GrpcArgsFromEnvironment();
  if (!grpc_args.ok()) return grpc_args.status();
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      options.target, *credentials, ChannelArgumentsFor(options, *grpc_args, 0));
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", options.target));
  }
  return std::unique_ptr<Client>(new Client(options, *std::move(credentials),
                                            *std::move(grpc_args), std::move(channel)));
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
  if (header.size_bytes() != 0 && header.size_bytes() != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", data.size(),
                                                   " are given"));
  }
  const int streams = TransferStreams(data.size(), /*upload=*/true);
  if (streams > 1) return ParallelUpload(header, data, streams, progress);
  return UploadStream(*channel_, header, data.size(), MemoryChunks(data, ChunkBytes()), progress);
}

UploadReader SpanReader(std::span<const std::byte> data) {
  return [data,
          position = uint64_t{0}](std::span<std::byte> out) mutable -> absl::StatusOr<size_t> {
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
  const size_t chunk_bytes = ChunkBytes();
  // The reader writes straight into the slice that is sent.
  return UploadStream(
      *channel_, header, size_bytes,
      [&](uint64_t sent) -> absl::StatusOr<grpc::Slice> {
        const size_t wanted =
            static_cast<size_t>(std::min<uint64_t>(chunk_bytes, size_bytes - sent));
        grpc::Slice slice(grpc_slice_malloc(wanted), grpc::Slice::STEAL_REF);
        absl::StatusOr<size_t> got = reader(std::span<std::byte>(
            reinterpret_cast<std::byte*>(const_cast<uint8_t*>(slice.begin())), wanted));
        if (!got.ok()) return got.status();
        if (*got == 0 || *got > wanted) {
          return absl::InternalError(absl::StrCat("the upload reader returned ", *got,
                                                  " bytes when ", wanted, " were asked for, after ",
                                                  sent, " of ", size_bytes));
        }
        return *got == wanted ? slice : slice.sub(0, *got);
      },
      progress);
}

absl::StatusOr<v1::UploadResponse> Client::UploadStream(
    grpc::Channel& channel, const v1::UploadHeader& header, uint64_t size_bytes,
    const std::function<absl::StatusOr<grpc::Slice>(uint64_t sent)>& next_chunk,
    const ProgressFn& progress) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  grpc::ByteBuffer response_bytes;
  const grpc::internal::RpcMethod method(kUploadMethod,
                                         grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(&channel, method, context.get(),
                                                                    &response_bytes));
  v1::UploadRequest request;
  *request.mutable_header() = header;
  request.mutable_header()->set_size_bytes(size_bytes);
  // Write returns false once the stream is broken (the server may already have
  // rejected the header); Finish then tells why.
  bool stream_ok = writer->Write(wire::Serialize(request));

  absl::Status local_status;
  uint64_t sent = 0;
  while (stream_ok && sent < size_bytes) {
    absl::StatusOr<grpc::Slice> chunk = next_chunk(sent);
    if (!chunk.ok()) {
      local_status = chunk.status();
      break;
    }
    std::optional<uint32_t> crc;
    if (options_.checksums) crc = ExtendCrc32c(0, chunk->begin(), chunk->size());
    stream_ok = writer->Write(wire::UploadChunk(*chunk, crc));
    if (!stream_ok) break;
    sent += chunk->size();
    if (progress) progress(sent, size_bytes);
  }

  if (!local_status.ok()) {
    // Cancelling makes the server discard what it received.
    context->TryCancel();
    writer->Finish().IgnoreError();
    return local_status;
  }
  if (stream_ok) stream_ok = writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status, *context);
  if (!stream_ok || sent != size_bytes) {
    return absl::UnavailableError(
        absl::StrCat("the upload stream closed after ", sent, " of ", size_bytes, " bytes"));
  }
  v1::UploadResponse response;
  if (!wire::Parse(response_bytes, &response).ok()) {
    return absl::InternalError("the server's upload response does not parse");
  }
  return response;
}

absl::StatusOr<v1::BeginUploadResponse> Client::BeginUpload(const v1::BeginUploadRequest& request) {
  return CallUnary(SettingsOf(options_), stubs_->buffers.get(),
                   &v1::BufferService::Stub::BeginUpload, request);
}

absl::StatusOr<v1::UploadResponse> Client::UploadRange(std::string_view transfer_id,
                                                       uint64_t offset_bytes,
                                                       std::span<const std::byte> data, int channel,
                                                       const ProgressFn& progress) {
  v1::UploadHeader header;
  header.set_transfer_id(std::string(transfer_id));
  header.set_offset_bytes(offset_bytes);
  return UploadStream(*TransferChannel(channel), header, data.size(),
                      MemoryChunks(data, ChunkBytes()), progress);
}

namespace {

// [offset, offset + size) of each of `streams` ranges of `bytes`: equal ones, the last
// taking the remainder.
std::vector<std::pair<uint64_t, uint64_t>> SplitRanges(uint64_t bytes, int streams) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const uint64_t each = bytes / streams;
  for (int i = 0; i < streams; ++i) {
    const uint64_t offset = each * i;
    ranges.emplace_back(offset, i + 1 == streams ? bytes - offset : each);
  }
  return ranges;
}

// The error a split transfer reports: the cause rather than the cancellations it led to.
absl::Status FirstCause(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok() && s.code() != absl::StatusCode::kCancelled) return s;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Sums the progress of concurrent ranges for one ProgressFn.
class SharedProgress {
 public:
  SharedProgress(const ProgressFn& progress, uint64_t total) : progress_(progress), total_(total) {}
  void Add(uint64_t bytes) {
    if (!progress_) return;
    absl::MutexLock lock(&mu_);
    done_ += bytes;
    progress_(done_, total_);
  }

 private:
  const ProgressFn& progress_;
  const uint64_t total_;
  absl::Mutex mu_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs transfer(i, progress of range i) for each of `ranges` ranges concurrently, one
// thread each; returns their results, or the cause of the first failure.
template <typename Response>
absl::StatusOr<std::vector<Response>> RunRanges(
    size_t ranges, uint64_t total, const ProgressFn& progress,
    const std::function<absl::StatusOr<Response>(size_t, const ProgressFn&)>& transfer) {
  std::vector<absl::Status> statuses(ranges);
  std::vector<Response> responses(ranges);
  SharedProgress shared_progress(progress, total);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranges; ++i) {
    threads.emplace_back([&, i] {
      ProgressFn range_progress = [&, last = uint64_t{0}](uint64_t done, uint64_t) mutable {
        shared_progress.Add(done - last);
        last = done;
      };
      absl::StatusOr<Response> r = transfer(i, range_progress);
      if (r.ok()) {
        responses[i] = *std::move(r);
      } else {
        statuses[i] = r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (absl::Status s = FirstCause(statuses); !s.ok()) return s;
  return responses;
}

}  // namespace

absl::StatusOr<v1::UploadResponse> Client::ParallelUpload(const v1::UploadHeader& header,
                                                          std::span<const std::byte> data,
                                                          int streams, const ProgressFn& progress) {
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = header;
  begin.mutable_header()->set_size_bytes(data.size());
  absl::StatusOr<v1::BeginUploadResponse> started = BeginUpload(begin);
  if (!started.ok()) return started.status();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = SplitRanges(data.size(), streams);
  absl::StatusOr<std::vector<v1::UploadResponse>> responses = RunRanges<v1::UploadResponse>(
      ranges.size(), data.size(), progress, [&](size_t i, const ProgressFn& range_progress) {
        return UploadRange(started->transfer_id(), ranges[i].first,
                           data.subspan(ranges[i].first, ranges[i].second),
                           static_cast<int>(i) + 1, range_progress);
      });
  if (!responses.ok()) return responses.status();
  return responses->front();
}

absl::StatusOr<v1::DownloadResponse> Client::DownloadImpl(
    const v1::DownloadRequest& request,
    const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
    const DownloadSink& sink, const ProgressFn& progress) {
  return DownloadOn(*channel_, request, on_info, sink, progress, /*whole_chunks=*/true,
                    /*sink_behind=*/false);
}

namespace {

// Runs a download's sink on a thread of its own, behind the thread that reads: that
// thread, which also receives the bytes from the socket, hands each message over and
// reads the next one while the sink copies the last one out. At most one message waits
// while another is being copied; the message's slices travel with it.
class SinkBehind {
 public:
  explicit SinkBehind(const DownloadSink& sink) : sink_(sink), thread_([this] { Loop(); }) {}
  ~SinkBehind() { Finish().IgnoreError(); }
  SinkBehind(const SinkBehind&) = delete;
  SinkBehind& operator=(const SinkBehind&) = delete;

  // Waits until no message waits, then hands `message` over; the first sink error so
  // far, in which case `message` is dropped.
  absl::Status Push(wire::DownloadMessage message) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &SinkBehind::CanPush));
    if (!status_.ok()) return status_;
    pending_.emplace(std::move(message));
    return absl::OkStatus();
  }

  // Waits for every message handed over and stops the thread; the first sink error.
  absl::Status Finish() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.has_value() || !status_.ok();
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || closing_;
  }

  void Loop() {
    for (;;) {
      wire::DownloadMessage message;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &SinkBehind::HasWork));
        if (!pending_.has_value()) return;  // closing, and nothing is left
        message = *std::move(pending_);
        pending_.reset();
      }
      absl::Status status;
      uint64_t offset = message.offset_bytes;
      for (std::string_view piece : message.data.views) {
        status = sink_(offset, piece);
        if (!status.ok()) break;
        offset += piece.size();
      }
      if (!status.ok()) {
        absl::MutexLock lock(&mu_);
        if (status_.ok()) status_ = std::move(status);
      }
    }
  }

  const DownloadSink& sink_;
  absl::Mutex mu_;
  std::optional<wire::DownloadMessage> pending_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it starts once the members above exist
};

// Downloads from this size on run their sink behind the reading thread (SinkBehind).
constexpr uint64_t kSinkBehindBytes = uint64_t{16} << 20;

}  // namespace

absl::StatusOr<v1::DownloadResponse> Client::DownloadOn(
    grpc::Channel& channel, const v1::DownloadRequest& request,
    const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
    const DownloadSink& sink, const ProgressFn& progress, bool whole_chunks, bool sink_behind) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  v1::DownloadRequest sent_request = request;
  if (options_.checksums) sent_request.set_crc32c(true);
  const grpc::internal::RpcMethod method(kDownloadMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(&channel, method, context.get(),
                                                                    wire::Serialize(sent_request)));

  v1::DownloadResponse result;
  result.set_offset_bytes(request.offset_bytes());
  grpc::ByteBuffer raw;
  wire::DownloadMessage message;
  std::string joined;
  bool first = true;
  uint64_t total = 0;
  uint64_t received = 0;
  absl::Status local_status;
  // Made once the size is known: only large downloads pay for its thread.
  std::optional<SinkBehind> behind;
  while (reader->Read(&raw)) {
    local_status = wire::ParseDownloadResponse(raw, &message);
    raw.Clear();
    if (!local_status.ok()) break;
    if (first) {
      first = false;
      if (!message.has_buffer || request.offset_bytes() > message.buffer.size_bytes()) {
        local_status =
            absl::InternalError("the server's first download message does not describe the buffer");
        break;
      }
      *result.mutable_buffer() = message.buffer;
      total = request.size_bytes() != 0 ? request.size_bytes()
                                        : message.buffer.size_bytes() - request.offset_bytes();
      if (on_info) {
        local_status = on_info(result.buffer(), total);
        if (!local_status.ok()) break;
      }
      if (sink_behind && total >= kSinkBehindBytes) behind.emplace(sink);
    }
    if (options_.checksums && message.data.size != 0 &&
        (!message.data_crc32c.has_value() || *message.data_crc32c != message.data.Crc32c())) {
      local_status = absl::DataLossError(
          absl::StrCat("the downloaded bytes at offset ", message.offset_bytes,
                       message.data_crc32c.has_value() ? " do not match their CRC32C"
                                                       : " came without a CRC32C"));
      break;
    }
    // Before the message may move to the sink's thread.
    if (message.has_transfer) *result.mutable_transfer() = message.transfer;
    if (message.data.size != 0) {
      const uint64_t expected_offset = request.offset_bytes() + received;
      if (message.offset_bytes != expected_offset || message.data.size > total - received) {
        local_status = absl::InternalError(absl::StrCat(
            "the server sent ", message.data.size, " bytes at offset ", message.offset_bytes,
            " where ", total - received, " bytes at offset ", expected_offset, " remained"));
        break;
      }
      received += message.data.size;
      if (behind.has_value()) {
        local_status = behind->Push(std::move(message));
        message = wire::DownloadMessage();
      } else if (message.data.views.size() == 1 || !whole_chunks) {
        uint64_t offset = message.offset_bytes;
        for (std::string_view piece : message.data.views) {
          local_status = sink(offset, piece);
          if (!local_status.ok()) break;
          offset += piece.size();
        }
      } else {
        // The sink was promised one call per chunk; gRPC received it in several slices.
        joined.resize(message.data.size);
        message.data.CopyTo(joined.data());
        local_status = sink(message.offset_bytes, joined);
      }
      if (!local_status.ok()) break;
      if (progress) progress(received, total);
    }
  }
  if (behind.has_value() && local_status.ok()) local_status = behind->Finish();

  if (!local_status.ok()) {
    context->TryCancel();
    while (reader->Read(&raw)) {
    }
    reader->Finish().IgnoreError();
    return local_status;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status, *context);
  if (first) return absl::InternalError("the download ended without a message");
  if (received != total) {
    return absl::InternalError(
        absl::StrCat("the download ended after ", received, " of ", total, " bytes"));
  }
  return result;
}

namespace {

absl::Status Reserve(std::string* data, uint64_t total, bool resize) {
  try {
    if (resize) {
      data->resize(static_cast<size_t>(total));
    } else {
      data->reserve(static_cast<size_t>(total));
    }
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      std::string* data,
                                                      const ProgressFn& progress) {
  if (options_.transfer_streams != 1) {
    // `data` as it is: a string that already has the size is not zero-filled again.
    absl::StatusOr<v1::DownloadResponse> parallel = ParallelDownload(request, data, progress);
    // UNIMPLEMENTED: the transfer is too small to split.
    if (parallel.status().code() != absl::StatusCode::kUnimplemented) return parallel;
  }
  data->clear();
  auto reserve = [data](const v1::BufferInfo&, uint64_t total) {
    return Reserve(data, total, /*resize=*/false);
  };
  auto append = [data](uint64_t, std::string_view chunk) {
    data->append(chunk);
    return absl::OkStatus();
  };
  return DownloadOn(*channel_, request, reserve, append, progress, /*whole_chunks=*/false,
                    /*sink_behind=*/true);
}

absl::StatusOr<v1::DownloadResponse> Client::ParallelDownload(const v1::DownloadRequest& request,
                                                              std::string* data,
                                                              const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  // The range's size decides the split; a request without one needs the buffer's.
  // The split needs the range's size; a range the buffer does not hold is left to one
  // stream, for the server to refuse.
  if (request.size_bytes() != 0 && TransferStreams(request.size_bytes(), /*upload=*/false) <= 1) {
    return absl::UnimplementedError("one stream");
  }
  absl::StatusOr<v1::BufferInfo> info = GetBuffer(request.buffer());
  if (!info.ok()) return absl::UnimplementedError("one stream");
  const uint64_t size = info->size_bytes();
  const uint64_t offset = request.offset_bytes();
  if (offset > size || request.size_bytes() > size - offset) {
    return absl::UnimplementedError("one stream");
  }
  const uint64_t total = request.size_bytes() == 0 ? size - offset : request.size_bytes();
  const int streams = TransferStreams(total, /*upload=*/false);
  if (streams <= 1) return absl::UnimplementedError("one stream");
  // Resizing writes only bytes the string did not have (a reused string keeps its own).
  if (absl::Status s = Reserve(data, total, /*resize=*/true); !s.ok()) {
    data->clear();
    return s;
  }
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = SplitRanges(total, streams);
  char* out = data->data() - request.offset_bytes();
  absl::StatusOr<std::vector<v1::DownloadResponse>> responses = RunRanges<v1::DownloadResponse>(
      ranges.size(), total, progress, [&](size_t i, const ProgressFn& range_progress) {
        v1::DownloadRequest range = request;
        range.set_offset_bytes(request.offset_bytes() + ranges[i].first);
        range.set_size_bytes(ranges[i].second);
        return DownloadOn(
            *TransferChannel(static_cast<int>(i) + 1), range, {},
            [out](uint64_t offset, std::string_view piece) {
              std::memcpy(out + offset, piece.data(), piece.size());
              return absl::OkStatus();
            },
            range_progress, /*whole_chunks=*/false, /*sink_behind=*/false);
      });
  if (!responses.ok()) {
    data->clear();
    return responses.status();
  }
  v1::DownloadResponse result;
  *result.mutable_buffer() = responses->front().buffer();
  result.set_offset_bytes(request.offset_bytes());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.mutable_transfer()->set_bytes(total);
  result.mutable_transfer()->set_seconds(seconds);
  if (seconds > 0) result.mutable_transfer()->set_gbps(static_cast<double>(total) / seconds / 1e9);
  return result;
}

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      const DownloadSink& sink,
                                                      const ProgressFn& progress) {
  return DownloadImpl(request, {}, sink, progress);
}

int Client::TransferStreams(uint64_t bytes, bool upload) const {
  int n = options_.transfer_streams;
  if (n <= 0) {
    n = bytes < kParallelTransferBytes ? 1 : upload ? kAutoUploadStreams : kAutoDownloadStreams;
  }
  n = std::min(n, kMaxTransferStreams);
  if (bytes < static_cast<uint64_t>(n)) n = static_cast<int>(std::max<uint64_t>(bytes, 1));
  return n;
}

std::shared_ptr<grpc::Channel> Client::TransferChannel(int index) {
  if (index <= 0) return channel_;
  absl::MutexLock lock(&channels_mu_);
  if (transfer_channels_.size() < static_cast<size_t>(index)) {
    transfer_channels_.resize(index);
  }
  std::shared_ptr<grpc::Channel>& channel = transfer_channels_[index - 1];
  if (channel == nullptr) {
    channel = grpc::CreateCustomChannel(options_.target, credentials_,
                                        ChannelArgumentsFor(options_, grpc_args_, index));
  }
  return channel;
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

absl::StatusOr<v1::BufferInfo> Client::RenewLease(std::string_view buffer,
                                                  std::optional<double> ttl_seconds) {
  v1::RenewLeaseRequest request;
  request.set_buffer(std::string(buffer));
  if (ttl_seconds.has_value()) request.set_ttl_seconds(*ttl_seconds);
  absl::StatusOr<v1::RenewLeaseResponse> response = CallUnary(
      SettingsOf(options_), stubs_->buffers.get(), &v1::BufferService::Stub::RenewLease, request);
  if (!response.ok()) return response.status();
  return response->buffer();
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

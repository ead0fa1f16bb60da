// The Client's connection: its channels and their arguments, credentials, the checks
// of its options, and the unary calls on buffers, streams and the server. Transfers are
// in transfers.cc, operations in operations.cc.
#include "client/cpp/client.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client_internal.h"
#include "common/grpc_tuning.h"

namespace gpucompute {

using client_internal::MakeContext;
using client_internal::SettingsOf;

namespace client_internal {

std::unique_ptr<grpc::ClientContext> MakeContext(const CallSettings& settings, bool unary) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!settings.client_name.empty()) {
    context->AddMetadata(kClientMetadataKey, settings.client_name);
  }
  if (!settings.token.empty()) context->AddMetadata("authorization", "Bearer " + settings.token);
  if (!settings.tenant.empty()) context->AddMetadata(kTenantMetadataKey, settings.tenant);
  if (!settings.request_id.empty()) {
    context->AddMetadata(kRequestIdMetadataKey, settings.request_id);
  }
  if (unary && settings.timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + settings.timeout));
  }
  return context;
}

}  // namespace client_internal

namespace {

// Messages the channel accepts beyond the server's limit: a download chunk of the
// full limit plus its framing and the buffer info.
constexpr size_t kMessageSlackBytes = size_t{1} << 20;

// Receive window of a transfer channel's streams, with gRPC's window estimate (BDP
// probing) off: with several streams, the estimate left each stream's window too small
// to keep its connection busy. One stream on the main channel keeps gRPC's defaults,
// which serve it better (docs/performance.md).
constexpr int kTransferWindowBytes = 64 << 20;

// The host part of a target: "HOST:PORT", "[V6]:PORT" or "dns:///HOST:PORT".
std::string HostOf(std::string_view target) {
  if (const size_t scheme = target.find(":///"); scheme != std::string_view::npos) {
    target.remove_prefix(scheme + 4);
  }
  if (!target.empty() && target.front() == '[') {
    const size_t close = target.find(']');
    return std::string(target.substr(1, close == std::string_view::npos ? close : close - 1));
  }
  return std::string(target.substr(0, target.rfind(':')));
}

// A channel's arguments: for a transfer channel (`transfer_index` > 0) a connection of
// its own and the window above, then those of the environment
// (common/grpc_tuning.h), then the client's options.
grpc::ChannelArguments ChannelArgumentsFor(const ClientOptions& options,
                                           const GrpcIntArgs& environment, int transfer_index,
                                           const std::string& target) {
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
  if (!options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  } else if (target != options.target) {
    // A replica the client was redirected to proves the name the first target did.
    arguments.SetSslTargetNameOverride(HostOf(options.target));
  }
  arguments.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  arguments.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes + kMessageSlackBytes));
  return arguments;
}

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
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kRedirectAddressKey);
      it != trailers.end() && result.code() == absl::StatusCode::kFailedPrecondition) {
    result.SetPayload(kRedirectAddressKey,
                      absl::Cord(std::string(it->second.data(), it->second.size())));
  }
  return result;
}

std::string RequestIdOf(const absl::Status& status) {
  const auto id = status.GetPayload(kRequestIdPayload);
  return id.has_value() ? std::string(*id) : std::string();
}

std::string RedirectAddressOf(const absl::Status& status) {
  const auto address = status.GetPayload(kRedirectAddressKey);
  return address.has_value() ? std::string(*address) : std::string();
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials,
               GrpcIntArgs grpc_args, std::shared_ptr<const Connection> connection)
    : options_(std::move(options)),
      credentials_(std::move(credentials)),
      grpc_args_(std::move(grpc_args)),
      connection_(std::move(connection)),
      async_calls_(std::make_shared<client_internal::AsyncCallRegistry>()) {}

std::shared_ptr<const Client::Connection> Client::connection() const {
  absl::MutexLock lock(&connection_mu_);
  return connection_;
}

std::shared_ptr<grpc::Channel> Client::channel() const { return connection()->channel; }
std::string Client::target() const { return connection()->target; }

std::shared_ptr<grpc::Channel> Client::MakeChannel(const std::string& target,
                                                   int transfer_index) const {
  return grpc::CreateCustomChannel(
      target, credentials_, ChannelArgumentsFor(options_, grpc_args_, transfer_index, target));
}

bool Client::Redirect(const absl::Status& refused) {
  const std::string address = RedirectAddressOf(refused);
  if (address.empty()) return false;
  {
    absl::MutexLock lock(&connection_mu_);
    // Once in the client's life: a second redirect means the replicas disagree.
    if (replaced_ != nullptr) return false;
    replaced_ = connection_;
    connection_ = std::make_shared<Connection>(address, MakeChannel(address, 0));
  }
  absl::MutexLock lock(&channels_mu_);
  transfer_channels_.clear();
  return true;
}

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
  if (!IsPrintableAscii(options.tenant, kMaxTenantNameBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tenant must be at most ", kMaxTenantNameBytes, " printable ASCII characters"));
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = CredentialsFor(options);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<GrpcIntArgs> grpc_args = GrpcArgsFromEnvironment();
  if (!grpc_args.ok()) return grpc_args.status();
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      options.target, *credentials, ChannelArgumentsFor(options, *grpc_args, 0, options.target));
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", options.target));
  }
  return std::unique_ptr<Client>(
      new Client(options, *std::move(credentials), *std::move(grpc_args),
                 std::make_shared<Connection>(options.target, std::move(channel))));
}

size_t Client::ChunkBytes() const {
  if (options_.chunk_bytes == 0) return kDefaultChunkBytes;
  return std::min<size_t>(options_.chunk_bytes, kMaxChunkBytes);
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(bool unary) const {
  return MakeContext(SettingsOf(options_), unary);
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
  std::shared_ptr<const Connection> current = connection();
  if (index <= 0) return current->channel;
  absl::MutexLock lock(&channels_mu_);
  if (transfer_channels_.size() < static_cast<size_t>(index)) {
    transfer_channels_.resize(index);
  }
  std::shared_ptr<grpc::Channel>& channel = transfer_channels_[index - 1];
  if (channel == nullptr) channel = MakeChannel(current->target, index);
  return channel;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  return Unary(&Stubs::server, &v1::ServerService::Stub::GetServerInfo, v1::GetServerInfoRequest());
}

absl::StatusOr<v1::Stats> Client::GetStats() {
  return Unary(&Stubs::server, &v1::ServerService::Stub::GetStats,
                   v1::GetStatsRequest());
}

absl::StatusOr<v1::TrimMemoryPoolResponse> Client::TrimMemoryPool(std::optional<int> device,
                                                                  uint64_t keep_bytes) {
  v1::TrimMemoryPoolRequest request;
  if (device.has_value()) request.set_device(*device);
  request.set_keep_bytes(keep_bytes);
  return Unary(&Stubs::server, &v1::ServerService::Stub::TrimMemoryPool, request);
}

absl::Status Client::StartProfiler() {
  return Unary(&Stubs::server, &v1::ServerService::Stub::StartProfiler, v1::StartProfilerRequest())
      .status();
}

absl::Status Client::StopProfiler() {
  return Unary(&Stubs::server, &v1::ServerService::Stub::StopProfiler, v1::StopProfilerRequest())
      .status();
}

absl::StatusOr<v1::BufferInfo> Client::CreateBuffer(const v1::CreateBufferRequest& request) {
  absl::StatusOr<v1::CreateBufferResponse> response = Unary(&Stubs::buffers, &v1::BufferService::Stub::CreateBuffer, request);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_buffer());
}

absl::StatusOr<v1::BufferInfo> Client::GetBuffer(std::string_view buffer) {
  v1::GetBufferRequest request;
  request.set_buffer(std::string(buffer));
  return Unary(&Stubs::buffers, &v1::BufferService::Stub::GetBuffer,
                   request);
}

absl::StatusOr<v1::ListBuffersResponse> Client::ListBuffers() {
  return Unary(&Stubs::buffers, &v1::BufferService::Stub::ListBuffers, v1::ListBuffersRequest());
}

absl::Status Client::DeleteBuffer(std::string_view buffer) {
  v1::DeleteBufferRequest request;
  request.set_buffer(std::string(buffer));
  return Unary(&Stubs::buffers, &v1::BufferService::Stub::DeleteBuffer, request)
      .status();
}

absl::StatusOr<v1::BufferInfo> Client::RenewLease(std::string_view buffer,
                                                  std::optional<double> ttl_seconds) {
  v1::RenewLeaseRequest request;
  request.set_buffer(std::string(buffer));
  if (ttl_seconds.has_value()) request.set_ttl_seconds(*ttl_seconds);
  absl::StatusOr<v1::RenewLeaseResponse> response = Unary(&Stubs::buffers, &v1::BufferService::Stub::RenewLease, request);
  if (!response.ok()) return response.status();
  return response->buffer();
}

absl::StatusOr<v1::StreamInfo> Client::CreateStream(std::optional<int> device) {
  v1::CreateStreamRequest request;
  if (device.has_value()) request.set_device(*device);
  return Unary(&Stubs::streams, &v1::StreamService::Stub::CreateStream, request);
}

absl::Status Client::DeleteStream(std::string_view stream_id) {
  v1::DeleteStreamRequest request;
  request.set_stream_id(std::string(stream_id));
  return Unary(&Stubs::streams, &v1::StreamService::Stub::DeleteStream, request)
      .status();
}

absl::StatusOr<bool> Client::SynchronizeStream(std::string_view stream_id, double timeout_seconds) {
  v1::SynchronizeStreamRequest request;
  request.set_stream_id(std::string(stream_id));
  request.set_timeout_seconds(timeout_seconds);
  absl::StatusOr<v1::SynchronizeStreamResponse> response =
      Unary(&Stubs::streams, &v1::StreamService::Stub::SynchronizeStream, request);
  if (!response.ok()) return response.status();
  return response->idle();
}

absl::StatusOr<v1::ListStreamsResponse> Client::ListStreams() {
  return Unary(&Stubs::streams, &v1::StreamService::Stub::ListStreams, v1::ListStreamsRequest());
}

}  // namespace gpucompute

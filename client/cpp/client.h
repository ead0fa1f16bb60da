// C++ client of the gpucompute service.
//
// One Client holds one channel and the stubs of the four services; it is safe to use
// from many threads at once. Every call names the client (metadata
// "gpucompute-client") when ClientOptions::client_name is set, and unary calls carry
// the ClientOptions::timeout deadline. Errors are absl::Status values with the gRPC
// status code and message the server gave (see FromGrpcStatus).
//
// Transfers stream: Upload sends the header and then chunks read from memory or from a
// reader callback, Download hands chunks to a sink in order, so arrays larger than
// memory (and larger than 4 GiB) move through a buffer of one chunk. Chunks go on the
// wire without a protobuf copy: an upload from memory sends slices that point into the
// caller's memory. Large uploads from memory and downloads into memory are split into
// byte ranges carried by concurrent streams over separate connections
// (ClientOptions::transfer_streams; BufferService.BeginUpload). A program that moves large
// arrays should call RetainTransferMemory() (common/transfer_memory.h) at start,
// or gRPC's receive memory is page-faulted in afresh for every chunk.
#ifndef GPUCOMPUTE_CLIENT_CPP_CLIENT_H_
#define GPUCOMPUTE_CLIENT_CPP_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "client/cpp/array_ref.h"
#include "common/grpc_status.h"
#include "common/grpc_tuning.h"
#include "gpucompute/v1/limits.h"

namespace gpucompute {

namespace client_internal {
class AsyncCallRegistry;
}  // namespace client_internal

struct ClientOptions {
  std::string target = "127.0.0.1:50051";
  // Sent as the metadata "gpucompute-client" when non-empty.
  std::string client_name;
  // Upload chunk size; 0 means the default, and sizes are clamped to kMaxChunkBytes
  // (gpucompute/v1/limits.h). A server run with a smaller --max-message-bytes reports
  // its own bound in GetServerInfo (Limits.max_chunk_bytes) and refuses larger chunks;
  // the default always fits it.
  size_t chunk_bytes = kDefaultChunkBytes;
  // Deadline of each unary call. Uploads and downloads have none: they take as long
  // as the data takes.
  absl::Duration timeout = absl::InfiniteDuration();
  // Concurrent streams, each on its own connection, that an upload from memory or a
  // download into memory is split over. 0: automatic (kAutoUploadStreams or
  // kAutoDownloadStreams for transfers of at least kParallelTransferBytes, else one); 1:
  // always one stream.
  int transfer_streams = 0;
  // Send a CRC32C with every upload chunk and ask for one with every download chunk; a
  // mismatch fails the transfer with DATA_LOSS.
  bool checksums = false;
  // Sent as the metadata "authorization: Bearer TOKEN" with every call when non-empty
  // (a server with a tokens file requires one).
  std::string token;
  // TLS, used when `tls` is set or any tls_* file is given. PEM files: the CA that
  // verifies the server (empty: the system's roots), and for mutual TLS the client's
  // certificate chain and private key. tls_server_name, when set, is the name the
  // server's certificate must carry instead of the target's host, and the name sent
  // as SNI: a proxy's SNI route routes TENANT.SUFFIX to the tenant's replica.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Sent as the metadata "gpucompute-tenant" with every call when non-empty: the tenant
  // the token or certificate names, which a proxy in front of several replicas routes on.
  // A server refuses any other name with PERMISSION_DENIED.
  std::string tenant;
  // Sent as the metadata "x-request-id" with every call when non-empty (at most
  // kMaxRequestIdBytes printable ASCII characters), so that the server's log lines about
  // these calls carry it; else the server makes one up per call. Either way, a failed
  // call's status carries the id the server used (RequestIdOf).
  std::string request_id;
};

// The ranges of a parallel transfer go on transfer connections, one each, with a large
// receive window (client.cc). Eight streams each way, because both ways still gained
// from four to eight (docs/performance.md).
inline constexpr int kAutoUploadStreams = 8;
inline constexpr int kAutoDownloadStreams = 8;
inline constexpr uint64_t kParallelTransferBytes = uint64_t{64} << 20;
// Streams one transfer is split over at most.
inline constexpr int kMaxTransferStreams = 64;

// Called after each chunk with the bytes moved so far and the total.
using ProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;
// Fills the span with the next bytes of an upload and returns how many it wrote (at
// least 1 while bytes remain; fewer than the span is fine).
using UploadReader = std::function<absl::StatusOr<size_t>(std::span<std::byte>)>;
// Receives a download's chunks in order; `offset` is the chunk's byte offset in the
// buffer.
using DownloadSink = std::function<absl::Status(uint64_t offset, std::string_view chunk)>;

// FromGrpcStatus(status) (common/grpc_status.h), with the request id the server
// returned for the call (if any) attached as a payload, which RequestIdOf reads.
absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context);
// The server's request id of the failed call `status` came from; empty if unknown.
std::string RequestIdOf(const absl::Status& status);
// The address of the replica that serves the caller's tenant, when `status` is a
// server's refusal of a call it does not serve (metadata "gpucompute-redirect-address");
// else empty.
std::string RedirectAddressOf(const absl::Status& status);

// A reader that hands out `data` in order; `data` must outlive it.
UploadReader SpanReader(std::span<const std::byte> data);

// The result of SubmitAsync: resolves to the finished operation (done is true; its
// state may be FAILED) or to the error of an RPC. Copyable; copies share the result.
class OperationFuture {
 public:
  OperationFuture() = default;
  explicit OperationFuture(std::shared_future<absl::StatusOr<v1::Operation>> future)
      : future_(std::move(future)) {}

  // False for a default-constructed future.
  bool valid() const { return future_.valid(); }
  // True once Get would not block.
  bool Ready() const;
  // Waits up to `timeout` and returns Ready().
  bool Wait(absl::Duration timeout) const;
  // Waits for the result.
  const absl::StatusOr<v1::Operation>& Get() const { return future_.get(); }

 private:
  std::shared_future<absl::StatusOr<v1::Operation>> future_;
};

// Replicas. A server that is one replica of several answers a call for a tenant placed on
// another one with FAILED_PRECONDITION and that replica's address (RedirectAddressOf).
// The Client then reconnects there, once in its life, and from then on talks to it
// directly: the call is made again there when it can be (every unary call, an upload from
// memory, a download, an upload from a reader that was not yet read); otherwise the
// refusal is returned, and the next call goes to the new replica. A second redirect is
// returned as it is. TLS keeps verifying the name the first target was verified by
// (tls_server_name, or the first target's host). Sessions, chains and shared-memory
// transports made after the redirect use the new connection; asynchronous submissions do
// not follow a redirect.
class Client {
 public:
  // Creates the channel; no RPC is made, so an unreachable server shows up as
  // UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  // Cancels the asynchronous calls still in flight (their futures resolve to
  // CANCELLED; the operations go on on the server) and waits for their callbacks.
  ~Client();

  const ClientOptions& options() const { return options_; }
  // The channel, and a context for a call on it that names the client (and carries the
  // call timeout when `unary`): for stubs of services this class does not wrap, such as
  // SharedMemoryTransport's (client/cpp/shared_memory.h) and the sessions and chains of
  // client/cpp/session.h.
  std::shared_ptr<grpc::Channel> channel() const;
  // The address the client talks to: options().target, or where a redirect sent it.
  std::string target() const;
  std::unique_ptr<grpc::ClientContext> NewContext(bool unary) const;

  absl::StatusOr<v1::ServerInfo> GetServerInfo();
  absl::StatusOr<v1::Stats> GetStats();
  // Returns pool memory beyond what buffers use and `keep_bytes` to `device` (none:
  // every device); the response has each trimmed pool's usage afterwards.
  absl::StatusOr<v1::TrimMemoryPoolResponse> TrimMemoryPool(std::optional<int> device = {},
                                                            uint64_t keep_bytes = 0);
  // The profiler's capture range (nsys --capture-range=cudaProfilerApi);
  // FAILED_PRECONDITION on backends without one.
  absl::Status StartProfiler();
  absl::Status StopProfiler();

  // Buffers.
  absl::StatusOr<v1::BufferInfo> CreateBuffer(const v1::CreateBufferRequest& request);
  // Uploads `data`. header.size_bytes may be 0 (it is set to data.size()) or must
  // equal data.size().
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            std::span<const std::byte> data,
                                            const ProgressFn& progress = {});
  // Uploads `size_bytes` bytes produced by `reader`, one chunk at a time. If the
  // reader fails, the upload is cancelled (the server changes nothing) and its error
  // is returned.
  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header, uint64_t size_bytes,
                                            const UploadReader& reader,
                                            const ProgressFn& progress = {});
  // Downloads into `data`, resized to the bytes read. The result has the buffer's
  // info (from the first message), offset_bytes of the request and the transfer stats
  // (from the last), and no data.
  absl::StatusOr<v1::DownloadResponse> Download(const v1::DownloadRequest& request,
                                                std::string* data, const ProgressFn& progress = {});
  // Downloads into `sink`. If the sink fails, the download is cancelled and its error
  // is returned. The result is as above.
  absl::StatusOr<v1::DownloadResponse> Download(const v1::DownloadRequest& request,
                                                const DownloadSink& sink,
                                                const ProgressFn& progress = {});
  // The parts of a multi-range upload, for callers that split and schedule the ranges
  // themselves (Upload does both for an upload from memory): BeginUpload reserves the
  // upload, then each range goes in its own UploadRange call, concurrently or not,
  // `channel` choosing which of the client's connections carries it (0: the main one;
  // 1 and up: transfer connections, opened as needed). Every UploadRange of
  // the upload returns once the whole upload has committed or failed, with its outcome.
  absl::StatusOr<v1::BeginUploadResponse> BeginUpload(const v1::BeginUploadRequest& request);
  absl::StatusOr<v1::UploadResponse> UploadRange(std::string_view transfer_id,
                                                 uint64_t offset_bytes,
                                                 std::span<const std::byte> data, int channel = 0,
                                                 const ProgressFn& progress = {});
  absl::StatusOr<v1::BufferInfo> GetBuffer(std::string_view buffer);
  absl::StatusOr<v1::ListBuffersResponse> ListBuffers();
  absl::Status DeleteBuffer(std::string_view buffer);
  // Renews the buffer's lease, with a new time-to-live when `ttl_seconds` is set (0
  // ends the lease).
  absl::StatusOr<v1::BufferInfo> RenewLease(std::string_view buffer,
                                            std::optional<double> ttl_seconds = {});

  // Streams.
  absl::StatusOr<v1::StreamInfo> CreateStream(std::optional<int> device = {});
  absl::Status DeleteStream(std::string_view stream_id);
  // Returns whether the stream went idle before `timeout_seconds` (0: no limit but the
  // call's deadline). An empty id is the default stream.
  absl::StatusOr<bool> SynchronizeStream(std::string_view stream_id, double timeout_seconds = 0);
  absl::StatusOr<v1::ListStreamsResponse> ListStreams();

  // Operations.
  // Submits `request` as given: with request.wait set, returns the finished operation.
  absl::StatusOr<v1::Operation> Submit(const v1::SubmitRequest& request);
  absl::StatusOr<v1::Operation> GetOperation(std::string_view id);
  // The operation when it finished or after `timeout_seconds` (0: no limit but the
  // call's deadline); `done` tells which.
  absl::StatusOr<v1::Operation> WaitOperation(std::string_view id, double timeout_seconds = 0);
  // Submits without waiting (request.wait is ignored) and returns at once. The future
  // resolves when the operation finishes, through callbacks on gRPC's threads: many
  // operations can be in flight without a thread each. Submissions from one Client
  // reach the server in the order they were made (asynchronous ones before a later
  // synchronous Submit), so a chain of dependent operations runs in order.
  OperationFuture SubmitAsync(v1::SubmitRequest request);

 private:
  struct Stubs;
  // A channel to one target and the stubs on it.
  struct Connection;
  Client(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials,
         GrpcIntArgs grpc_args, std::shared_ptr<const Connection> connection);

  std::shared_ptr<const Connection> connection() const ABSL_LOCKS_EXCLUDED(connection_mu_);
  // Runs `call(connection)` on the current connection; if the server answers with a
  // redirect the client follows (Redirect), runs it again on the new one when `again`
  // says it may. (client_internal.h)
  template <typename Call>
  auto Routed(const Call& call, const std::function<bool()>& again = {});
  // A unary call of the `stub` of the current connection, Routed.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(std::unique_ptr<Stub> Stubs::*stub,
                                 grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                              const Request&, Response*),
                                 const Request& request);
  // Reconnects to the address `refused` names (RedirectAddressOf), unless the client was
  // redirected before; returns whether it did.
  bool Redirect(const absl::Status& refused) ABSL_LOCKS_EXCLUDED(connection_mu_);
  std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int transfer_index) const;

  // Downloads, calling `on_info` with the buffer's info and the byte count before
  // the first chunk reaches `sink`.
  absl::StatusOr<v1::DownloadResponse> DownloadImpl(
      const v1::DownloadRequest& request,
      const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
      const DownloadSink& sink, const ProgressFn& progress);
  size_t ChunkBytes() const;
  // Streams the transfer of `bytes` is split into.
  int TransferStreams(uint64_t bytes, bool upload) const;
  // Channel `index` of the transfer streams: 0 is the client's channel, each other one
  // its own connection.
  std::shared_ptr<grpc::Channel> TransferChannel(int index);
  // One Upload stream: `header`, then chunks of `size_bytes` bytes in all, each the
  // slice `next_chunk` gives.
  absl::StatusOr<v1::UploadResponse> UploadStream(
      grpc::Channel& channel, const v1::UploadHeader& header, uint64_t size_bytes,
      const std::function<absl::StatusOr<grpc::Slice>(uint64_t sent)>& next_chunk,
      const ProgressFn& progress);
  absl::StatusOr<v1::UploadResponse> ParallelUpload(const v1::UploadHeader& header,
                                                    std::span<const std::byte> data, int streams,
                                                    const ProgressFn& progress);
  absl::StatusOr<v1::DownloadResponse> ParallelDownload(const v1::DownloadRequest& request,
                                                        std::string* data,
                                                        const ProgressFn& progress);
  // Downloads on `channel`. `whole_chunks`: one sink call per chunk, however gRPC split
  // it. `sink_behind`: a large download's sink runs on a thread of its own, one message
  // behind this one (client.cc's SinkBehind).
  absl::StatusOr<v1::DownloadResponse> DownloadOn(
      grpc::Channel& channel, const v1::DownloadRequest& request,
      const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
      const DownloadSink& sink, const ProgressFn& progress, bool whole_chunks, bool sink_behind);

  ClientOptions options_;
  // For the transfer channels: the credentials and the environment's channel arguments.
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  GrpcIntArgs grpc_args_;
  mutable absl::Mutex connection_mu_;
  std::shared_ptr<const Connection> connection_ ABSL_GUARDED_BY(connection_mu_);
  // The connection a redirect replaced: asynchronous calls may still use its stubs.
  std::shared_ptr<const Connection> replaced_ ABSL_GUARDED_BY(connection_mu_);
  absl::Mutex channels_mu_;
  // Of connection_'s target; a redirect empties it.
  std::vector<std::shared_ptr<grpc::Channel>> transfer_channels_ ABSL_GUARDED_BY(channels_mu_);
  // Shared with the asynchronous calls, which leave it as they are destroyed.
  std::shared_ptr<client_internal::AsyncCallRegistry> async_calls_;
};

// Builders for the common requests. The results can be adjusted (stream_id, wait,
// wait_timeout_seconds) before submitting. Wherever they take an ArrayRef, a buffer id or
// name works as before, and a view (array_ref.h) is sent as the request's view steps.

// An operand bound to a buffer (id or name) or a view of one, or to a scalar.
v1::Operand BufferOperand(const ArrayRef& buffer);
v1::Operand ScalarOperand(double value);
v1::Operand ScalarOperand(int64_t value);
v1::Operand ScalarOperand(int value);
v1::Operand ScalarOperand(bool value);
// Output into an existing buffer (id or name), or through a view of one (elementwise
// operations only).
v1::Output ExistingOutput(const ArrayRef& buffer);
// Output into a new buffer, optionally named, of `dtype` or the natural dtype.
v1::Output NewOutput(std::string_view name = {}, v1::DType dtype = v1::DTYPE_UNSPECIFIED);

using NamedOperands = std::initializer_list<std::pair<std::string_view, v1::Operand>>;

// With `shape`, the result has that shape (ElementwiseOp.shape): the buffers broadcast to
// it, and index(k) gives the coordinates along its axes, e.g. Elementwise("index(0)", {},
// {}, std::vector<int64_t>{5}) is numpy.arange(5).
v1::SubmitRequest Elementwise(std::string_view expression, NamedOperands inputs,
                              v1::Output output = {},
                              std::optional<std::vector<int64_t>> shape = std::nullopt);
// A reduction over every axis, or over `axis`.
v1::SubmitRequest Reduce(v1::ReduceKind kind, const ArrayRef& input, std::optional<int> axis = {},
                         v1::Output output = {});

// How a reduction reduces (ReduceOp): over `axes` (negative counting from the end; none
// given: every axis; an empty list: none), keeping them with length 1 when `keepdims`,
// and for var and std dividing by N - ddof.
struct ReduceOptions {
  std::optional<std::vector<int32_t>> axes;
  bool keepdims = false;
  double ddof = 0;
};
v1::SubmitRequest ReduceOver(v1::ReduceKind kind, const ArrayRef& input,
                             const ReduceOptions& options, v1::Output output = {});
// A reduction of the values of an elementwise expression, in one pass without a
// temporary: ReduceExpression(v1::REDUCE_KIND_SUM, "x*y", {{"x", BufferOperand("a")},
// {"y", BufferOperand("b")}}).
v1::SubmitRequest ReduceExpression(v1::ReduceKind kind, std::string_view expression,
                                   NamedOperands inputs, const ReduceOptions& options = {},
                                   v1::Output output = {});
// y = alpha * op(A) * x + beta * y.
v1::SubmitRequest Gemv(const ArrayRef& a, const ArrayRef& x, v1::Output y = {},
                       bool transpose = false, double alpha = 1, double beta = 0);

struct MatmulOptions {
  bool transpose_a = false;
  bool transpose_b = false;
  double alpha = 1;
  // Applies with an existing `c` only.
  double beta = 0;
  // float32 on CUDA: TF32 tensor cores (MatmulOp.allow_tf32).
  bool allow_tf32 = false;
};
// C = alpha * op(A) @ op(B) + beta * C, as numpy.matmul (MatmulOp); into a new buffer
// unless `c` names one. Submit, SubmitAsync, a Session or a Chain run it as any other.
v1::SubmitRequest Matmul(const ArrayRef& a, const ArrayRef& b, v1::Output c = {},
                         const MatmulOptions& options = {});
// A download of `array` (whole elements in C order for a view).
v1::DownloadRequest DownloadOf(const ArrayRef& array);
// A fill of a new buffer with `shape` and `dtype`; distribution parameters (mean,
// stddev, low, high, offset) can be set on the returned request's random op. Normals use
// NORMAL_TRANSFORM_V2; set_normal_transform on the op picks NORMAL_TRANSFORM_V3 (float32
// by the inverse CDF, faster on GPUs) or NORMAL_TRANSFORM_V1 (fills made before v2).
v1::SubmitRequest Random(v1::Distribution distribution, const std::vector<uint64_t>& shape,
                         v1::DType dtype, uint64_t seed, v1::Output output = {});

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_CLIENT_H_

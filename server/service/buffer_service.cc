// BufferService: CreateBuffer, Upload, Download, GetBuffer, ListBuffers, DeleteBuffer,
// RenewLease.
// The streaming transfers run in their own reactors (transfer_reactors.h).
#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/wire_format.h"
#include "server/service/download_view.h"
#include "server/service/operation_planner.h"
#include "server/service/proto_conversions.h"
#include "server/service/services.h"
#include "server/service/transfer_reactors.h"
#include "server/tenancy/auth.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

// The tenant a request of an admin names, as the registry files it ("" for
// kUnauthenticatedTenantName). PERMISSION_DENIED, saying `what` was refused, for a caller
// that is not an admin; INVALID_ARGUMENT for a name that is no tenant's.
absl::StatusOr<std::string> NamedTenant(const Caller& caller, absl::string_view tenant,
                                        absl::string_view what) {
  RETURN_IF_ERROR(RequireAdmin(caller, what));
  if (tenant == kUnauthenticatedTenantName) return std::string();
  if (absl::Status s = ValidateTenantName(tenant); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant: ", s.message(), ", or '", kUnauthenticatedTenantName,
        "' for the buffers persisted without authentication"));
  }
  return std::string(tenant);
}

}  // namespace

grpc::ServerUnaryReactor* BufferServiceImpl::CreateBuffer(grpc::CallbackServerContext* context,
                                                          const v1::CreateBufferRequest* request,
                                                          v1::CreateBufferResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<BufferHandle> buffer = AllocateFromRequest(ctx_, caller->scope, *request);
  if (!buffer.ok()) return FinishNow(context, buffer.status());
  if (absl::Status s = SubmitCreated(ctx_, caller->scope, *buffer, *request).status(); !s.ok()) {
    return FinishNow(context, s);
  }
  ToProto(**buffer, response->mutable_buffer());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerReadReactor<grpc::ByteBuffer>* BufferServiceImpl::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  using Refuse = Refusal<grpc::ServerReadReactor<grpc::ByteBuffer>>;
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return new Refuse(caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return new Refuse(s);
  return NewUploadReactor(ctx_, uploads_, context, *std::move(caller), response);
}

grpc::ServerUnaryReactor* BufferServiceImpl::BeginUpload(grpc::CallbackServerContext* context,
                                                         const v1::BeginUploadRequest* request,
                                                         v1::BeginUploadResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  if (absl::Status s = CheckTimeout(request->idle_timeout_seconds()); !s.ok()) {
    return FinishNow(context, s);
  }
  if (request->header().size_bytes() == 0 &&
      request->header().target_case() != v1::UploadHeader::kCreate) {
    return FinishNow(
        context, absl::InvalidArgumentError("a multi-range upload needs size_bytes of at least 1"));
  }
  absl::StatusOr<std::shared_ptr<UploadTransfer>> transfer =
      UploadTransfer::Start(ctx_, caller->scope, request->header());
  if (!transfer.ok()) return FinishNow(context, transfer.status());
  if ((*transfer)->size() == 0) {
    return FinishNow(context, absl::InvalidArgumentError(
                                  "a multi-range upload carries at least one byte; upload an "
                                  "empty buffer with Upload"));
  }
  const double idle = request->idle_timeout_seconds() == 0
                          ? kDefaultUploadIdleTimeoutSeconds
                          : std::clamp(request->idle_timeout_seconds(), 0.05, 3600.0);
  (*transfer)->Publish(uploads_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::duration<double>(idle)));
  response->set_transfer_id((*transfer)->id());
  response->set_size_bytes((*transfer)->size());
  response->set_idle_timeout_seconds(idle);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* BufferServiceImpl::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  using Refuse = Refusal<grpc::ServerWriteReactor<grpc::ByteBuffer>>;
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return new Refuse(caller.status());
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return new Refuse(s);
  v1::DownloadRequest parsed;
  if (absl::Status s = wire::Parse(*raw_request, &parsed); !s.ok()) return new Refuse(s);
  const v1::DownloadRequest* request = &parsed;
  const uint64_t chunk = request->chunk_bytes() == 0
                             ? kDefaultChunkBytes
                             : std::clamp<uint64_t>(request->chunk_bytes(), 4096,
                                                   ctx_.limits.max_chunk_bytes());
  if (!request->view().empty()) {
    absl::StatusOr<DownloadSource> source = DownloadView(ctx_, caller->scope, *request);
    if (!source.ok()) return new Refuse(source.status());
    return NewDownloadReactor(ctx_, *std::move(source), chunk, request->crc32c(),
                              std::move(caller->admission));
  }
  absl::StatusOr<BufferHandle> buffer = ctx_.registry.Lookup(caller->scope, request->buffer());
  if (!buffer.ok()) return new Refuse(buffer.status());
  const uint64_t size = (*buffer)->size_bytes();
  const uint64_t offset = request->offset_bytes();
  if (offset > size || request->size_bytes() > size - offset) {
    return new Refuse(absl::InvalidArgumentError(
        absl::StrCat("bytes [", offset, ", +", request->size_bytes(), ") are outside buffer ",
                     (*buffer)->id, " of ", size, " bytes")));
  }
  const uint64_t length = request->size_bytes() == 0 ? size - offset : request->size_bytes();
  DownloadSource source;
  source.buffer = *std::move(buffer);
  source.offset = offset;
  source.size = length;
  return NewDownloadReactor(ctx_, std::move(source), chunk, request->crc32c(),
                            std::move(caller->admission));
}

grpc::ServerUnaryReactor* BufferServiceImpl::GetBuffer(grpc::CallbackServerContext* context,
                                                       const v1::GetBufferRequest* request,
                                                       v1::BufferInfo* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  absl::StatusOr<BufferHandle> buffer = ctx_.registry.Lookup(caller->scope, request->buffer());
  if (buffer.ok()) ToProto(**buffer, response);
  return FinishNow(context, buffer.status());
}

grpc::ServerUnaryReactor* BufferServiceImpl::ListBuffers(grpc::CallbackServerContext* context,
                                                         const v1::ListBuffersRequest* request,
                                                         v1::ListBuffersResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  std::vector<BufferHandle> buffers;
  if (request->tenant().empty()) {
    buffers = ctx_.registry.List(caller->scope);
  } else {
    absl::StatusOr<std::string> tenant =
        NamedTenant(*caller, request->tenant(), "listing a tenant's buffers");
    if (!tenant.ok()) return FinishNow(context, tenant.status());
    buffers = ctx_.registry.ListTenant(*tenant);
  }
  uint64_t total = 0;
  for (const BufferHandle& b : buffers) {
    ToProto(*b, response->add_buffers());
    total += b->size_bytes();
  }
  response->set_total_bytes(total);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* BufferServiceImpl::DeleteBuffer(grpc::CallbackServerContext* context,
                                                          const v1::DeleteBufferRequest* request,
                                                          v1::DeleteBufferResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  std::string scope = caller->scope;
  if (!request->tenant().empty()) {
    absl::StatusOr<std::string> tenant =
        NamedTenant(*caller, request->tenant(), "deleting a tenant's buffer");
    if (!tenant.ok()) return FinishNow(context, tenant.status());
    if (!request->buffer().empty() && !absl::StartsWith(request->buffer(), "buf-")) {
      return FinishNow(context, absl::InvalidArgumentError(absl::StrCat(
                                    "with a tenant, name the buffer by its id ('buf-...'), not '",
                                    request->buffer(),
                                    "': names belong to a client; ListBuffers with the tenant "
                                    "shows the ids")));
    }
    // A scope of the tenant with no client: an id resolves in every client of its tenant.
    scope = ScopeOf(*tenant, "");
  }
  absl::StatusOr<BufferHandle> buffer = ctx_.registry.Remove(scope, request->buffer());
  if (!buffer.ok()) return FinishNow(context, buffer.status());
  // Answer once the work queued on the buffer is done; the memory goes with the last handle.
  auto* reactor = new DeferredReactor(caller->admission);
  ctx_.executor.AcquireHostAccess(
      {{*buffer, true}},
      [this, state = reactor->state()](const std::shared_ptr<HostAccess>& access) {
        ctx_.executor.Release(access);
        DeferredReactor::FinishOnce(state, [] { return grpc::Status::OK; });
      });
  return reactor;
}

grpc::ServerUnaryReactor* BufferServiceImpl::RenewLease(grpc::CallbackServerContext* context,
                                                        const v1::RenewLeaseRequest* request,
                                                        v1::RenewLeaseResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  // Checked first: a rejected request leaves the lease as it was.
  std::optional<int64_t> ttl;
  if (request->has_ttl_seconds()) {
    absl::StatusOr<int64_t> nanos = TtlNanos(request->ttl_seconds());
    if (!nanos.ok()) return FinishNow(context, nanos.status());
    ttl = *nanos;
  }
  // The lookup renews the lease with the buffer's own ttl.
  absl::StatusOr<BufferHandle> buffer = ctx_.registry.Lookup(caller->scope, request->buffer());
  if (!buffer.ok()) return FinishNow(context, buffer.status());
  if (ttl.has_value()) (*buffer)->lease.Set(*ttl, SteadyNanos());
  ToProto(**buffer, response->mutable_buffer());
  return FinishNow(context, absl::OkStatus());
}

}  // namespace gpucompute

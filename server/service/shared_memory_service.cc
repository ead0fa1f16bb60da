// SharedMemoryService: RegisterRegion, UnregisterRegion, ListRegions, CopyFromRegion,
// CopyToRegion, ExportBuffer. The regions themselves live in
// server/shared_memory/region_registry.h; copies are executor operations, ordered with
// everything else that touches their buffer, except a copy into a multi-range upload,
// which is one of the upload's writes (server/service/upload_transfer.h).
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "server/core/host_staging_pool.h"
#include "server/service/operation_planner.h"
#include "server/service/services.h"
#include "server/service/transfer_reactors.h"
#include "server/service/upload_transfer.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Disabled(absl::string_view what, absl::string_view flag) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " is disabled on this server; start it with ", flag,
                   " (only for trusted clients on the server's host)"));
}

absl::Status CheckAllowed(const ServiceContext& ctx, RegionKind kind) {
  if (kind == RegionKind::kSystem) {
    if (!ctx.shared_memory.allow_system)
      return Disabled("system shared memory", kAllowSharedMemoryFlag);
  } else if (!ctx.shared_memory.allow_cuda_ipc) {
    return Disabled("CUDA IPC", kAllowCudaIpcFlag);
  }
  return absl::OkStatus();
}

// For the RPCs that serve regions of either kind.
absl::Status CheckAnyAllowed(const ServiceContext& ctx) {
  if (ctx.regions != nullptr) return absl::OkStatus();
  return Disabled("shared memory", absl::StrCat(kAllowSharedMemoryFlag, " or ", kAllowCudaIpcFlag));
}

v1::RegionKind ToProto(RegionKind kind) {
  switch (kind) {
    case RegionKind::kSystem:
      return v1::REGION_KIND_SYSTEM;
    case RegionKind::kCudaIpc:
      return v1::REGION_KIND_CUDA_IPC;
    case RegionKind::kExport:
      return v1::REGION_KIND_EXPORT;
  }
  return v1::REGION_KIND_UNSPECIFIED;
}

void ToProto(const Region& region, v1::RegionInfo* info) {
  info->set_id(region.id);
  info->set_kind(ToProto(region.kind));
  info->set_size_bytes(region.size);
  info->set_shm_name(region.shm_name);
  info->set_shm_offset_bytes(region.shm_offset);
  info->set_read_only(region.read_only);
  info->set_device(region.device);
  if (region.exported != nullptr) info->set_buffer(region.exported->id);
  info->set_create_time_unix_nanos(region.create_time_unix_nanos);
}

// The region a copy reads or writes: a system or CUDA IPC region of the client.
absl::StatusOr<RegionHandle> LookupCopyRegion(ServiceContext& ctx, absl::string_view client,
                                              absl::string_view id, bool write) {
  ASSIGN_OR_RETURN(RegionHandle region, ctx.regions->Lookup(client, id));
  if (region->kind == RegionKind::kExport) {
    return absl::InvalidArgumentError(absl::StrCat("region ", id, " is an export of buffer ",
                                                   region->exported->id,
                                                   "; use the buffer itself"));
  }
  if (write && region->read_only) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", id, " was registered read-only; it can only be copied from"));
  }
  return region;
}

// A copy between a region and a buffer, validated and ready to queue.
struct RegionCopy {
  Executor::OpSpec spec;
  // Runs once the operation has succeeded, before the answer: the last step of a copy
  // that stages bytes into a region (its error is the call's). May be empty.
  absl::AnyInvocable<absl::Status() &&> finish;
  // Held until the copy completes: the launch's own references go once it is enqueued.
  RegionHandle region;
  BufferHandle buffer;
  // A buffer the copy creates: registered when it is done, if the call is still live.
  BufferHandle created;
  uint64_t bytes = 0;
  OperationKind transfer = OperationKind::kUpload;
};

// Queues the copy and answers once it is done. A new buffer becomes visible only then,
// and not at all if the call ended before (a client that went away leaves nothing).
grpc::ServerUnaryReactor* SubmitCopy(ServiceContext& ctx, grpc::CallbackServerContext* context,
                                     const Caller& caller, absl::string_view stream_id,
                                     RegionCopy copy, v1::CopyRegionResponse* response) {
  const Clock::time_point start = Clock::now();
  copy.spec.kind = OperationKind::kCopy;
  copy.spec.bytes_read = copy.bytes;
  copy.spec.bytes_written = copy.bytes;
  copy.spec.outputs.clear();
  if (copy.transfer == OperationKind::kUpload) copy.spec.outputs.push_back(*copy.buffer);
  absl::StatusOr<std::shared_ptr<Operation>> op =
      ctx.executor.Submit(caller.scope, stream_id, std::move(copy.spec));
  if (!op.ok()) return FinishNow(context, op.status());
  auto* reactor = new DeferredReactor(caller.admission);
  ctx.executor.OnDone(*op, [&ctx, op = *op, copy = std::move(copy), start, response,
                            state = reactor->state()]() mutable {
    const OperationStatus done = ctx.executor.GetStatus(*op);
    DeferredReactor::FinishOnce(state, [&]() -> grpc::Status {
      if (!done.error.ok()) return ToGrpcStatus(done.error);
      if (copy.finish) {
        if (absl::Status s = std::move(copy.finish)(); !s.ok()) return ToGrpcStatus(s);
      }
      if (copy.created != nullptr) {
        if (absl::Status s = ctx.registry.Register(copy.created); !s.ok()) return ToGrpcStatus(s);
      }
      ToProto(*copy.buffer, response->mutable_buffer());
      SetTransferStats(copy.bytes, start, response->mutable_transfer());
      v1::Operation operation;
      ToProto(done, &operation);
      *response->mutable_timing() = operation.timing();
      ctx.executor.RecordTransfer(copy.buffer->client, copy.transfer, copy.bytes);
      return grpc::Status::OK;
    });
    // The region, and a buffer never registered, go here, after the copy.
  });
  return reactor;
}

// OK when `size` bytes from `region_offset` lie in the copy's region, and a CUDA IPC
// region is on the buffer's device.
// [offset, offset + size) of a region, read into a staging block on this thread, where a
// shrunk object fails the read (ReadRegion) rather than faulting in a backend thread, where
// it would end the server.
absl::StatusOr<HostStagingPool::Block> StageRegion(HostStagingPool& staging, const Region& region,
                                                   uint64_t offset, uint64_t size) {
  ASSIGN_OR_RETURN(HostStagingPool::Block block, staging.Acquire(size));
  RETURN_IF_ERROR(ReadRegion(region, offset, block->data(), size));
  return block;
}

absl::Status CheckRegionSide(const RegionCopy& copy, uint64_t region_offset, uint64_t size) {
  RETURN_IF_ERROR(CheckByteRange(region_offset, size, copy.region->size,
                                 absl::StrCat("region ", copy.region->id)));
  if (copy.region->kind == RegionKind::kCudaIpc && copy.region->device != copy.buffer->device) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", copy.region->id, " is on device ", copy.region->device,
                     " but buffer ", copy.buffer->id, " is on device ", copy.buffer->device));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionCopy> PlanCopyFromRegion(ServiceContext& ctx, const std::string& client,
                                              const v1::CopyFromRegionRequest& request) {
  RegionCopy copy;
  ASSIGN_OR_RETURN(copy.region,
                   LookupCopyRegion(ctx, client, request.region_id(), /*write=*/false));
  uint64_t size = request.size_bytes();
  uint64_t offset = request.offset_bytes();
  switch (request.target_case()) {
    case v1::CopyFromRegionRequest::kCreate: {
      if (offset != 0) {
        return absl::InvalidArgumentError("a copy that creates a buffer must start at offset 0");
      }
      if (request.create().has_fill()) {
        return absl::InvalidArgumentError("a copy provides the contents; 'fill' is not allowed");
      }
      ASSIGN_OR_RETURN(copy.created, AllocateFromRequest(ctx, client, request.create()));
      copy.buffer = copy.created;
      const uint64_t buffer_size = copy.buffer->size_bytes();
      if (size != 0 && size != buffer_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("size_bytes is ", size, " but a ", DTypeName(copy.buffer->dtype),
                         " buffer of that shape holds ", buffer_size, " bytes"));
      }
      size = buffer_size;
      break;
    }
    case v1::CopyFromRegionRequest::kBuffer: {
      ASSIGN_OR_RETURN(copy.buffer, ctx.registry.Lookup(client, request.buffer()));
      const uint64_t buffer_size = copy.buffer->size_bytes();
      RETURN_IF_ERROR(
          CheckByteRange(offset, size, buffer_size, absl::StrCat("buffer ", copy.buffer->id)));
      if (size == 0) size = buffer_size - offset;
      break;
    }
    case v1::CopyFromRegionRequest::kTransferId:
      // Not a copy of its own: ServeCopyIntoUpload serves it.
      return absl::InternalError("a copy into an upload was planned as a copy");
    case v1::CopyFromRegionRequest::TARGET_NOT_SET:
      return absl::InvalidArgumentError(
          "the copy names no target: set 'create', 'buffer' or 'transfer_id'");
  }
  RETURN_IF_ERROR(CheckRegionSide(copy, request.region_offset_bytes(), size));
  copy.bytes = size;
  copy.transfer = OperationKind::kUpload;
  copy.spec.accesses = {{copy.buffer, true}};
  const char* src = copy.region->mapping != nullptr ? copy.region->mapping->data() : nullptr;
  copy.spec.launch = [&backend = ctx.backend, &staging = *ctx.staging, region = copy.region.get(),
                      buffer = copy.buffer.get(), src,
                      region_offset = request.region_offset_bytes(), offset,
                      size](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    // Raw pointers: SubmitCopy holds the region and the buffer until the copy is done.
    absl::Status s;
    if (region->kind == RegionKind::kCudaIpc) {
      s = backend.Copy(stream, region->ipc_memory, region_offset, buffer->memory, offset, size);
    } else if (DmaCopy(*region, size)) {
      RETURN_IF_ERROR(CheckRegionHolds(*region, region_offset, size));
      s = backend.CopyFromPinnedHost(stream, src + region_offset, buffer->memory, offset, size);
    } else {
      ASSIGN_OR_RETURN(HostStagingPool::Block block,
                       StageRegion(staging, *region, region_offset, size));
      s = backend.CopyFromPinnedHost(stream, block->data(), buffer->memory, offset, size);
      // The block goes back once the copy out of it is done.
      if (s.ok()) s = stream.OnComplete([block = std::move(block)](absl::Status) {});
    }
    if (!s.ok()) return s;
    return LaunchInfo{};
  };
  return copy;
}

absl::StatusOr<RegionCopy> PlanCopyToRegion(ServiceContext& ctx, const std::string& client,
                                            const v1::CopyToRegionRequest& request) {
  RegionCopy copy;
  ASSIGN_OR_RETURN(copy.region, LookupCopyRegion(ctx, client, request.region_id(), /*write=*/true));
  ASSIGN_OR_RETURN(copy.buffer, ctx.registry.Lookup(client, request.buffer()));
  const uint64_t buffer_size = copy.buffer->size_bytes();
  const uint64_t offset = request.offset_bytes();
  RETURN_IF_ERROR(CheckByteRange(offset, request.size_bytes(), buffer_size,
                                 absl::StrCat("buffer ", copy.buffer->id)));
  const uint64_t size = request.size_bytes() == 0 ? buffer_size - offset : request.size_bytes();
  RETURN_IF_ERROR(CheckRegionSide(copy, request.region_offset_bytes(), size));
  copy.bytes = size;
  copy.transfer = OperationKind::kDownload;
  copy.spec.accesses = {{copy.buffer, false}};
  char* dst = copy.region->mapping != nullptr ? copy.region->mapping->data() : nullptr;
  // Without DMA, the bytes stop in staging memory and reach the region once the copy is
  // done, written by the thread that answers, where a shrunk object fails the copy
  // (WriteRegion), not by the backend's own threads, where it would end the server.
  auto staged = std::make_shared<HostStagingPool::Block>();
  copy.finish = [region = copy.region, staged, region_offset = request.region_offset_bytes(),
                 size]() -> absl::Status {
    if (*staged == nullptr) return absl::OkStatus();
    return WriteRegion(*region, region_offset, (*staged)->data(), size);
  };
  copy.spec.launch = [&backend = ctx.backend, &staging = *ctx.staging, region = copy.region.get(),
                      buffer = copy.buffer.get(), dst, staged,
                      region_offset = request.region_offset_bytes(), offset,
                      size](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
    absl::Status s;
    if (region->kind == RegionKind::kCudaIpc) {
      s = backend.Copy(stream, buffer->memory, offset, region->ipc_memory, region_offset, size);
    } else if (DmaCopy(*region, size)) {
      RETURN_IF_ERROR(CheckRegionHolds(*region, region_offset, size));
      s = backend.CopyToPinnedHost(stream, buffer->memory, offset, dst + region_offset, size);
    } else {
      ASSIGN_OR_RETURN(*staged, staging.Acquire(size));
      s = backend.CopyToPinnedHost(stream, buffer->memory, offset, (*staged)->data(), size);
    }
    if (!s.ok()) return s;
    return LaunchInfo{};
  };
  return copy;
}

// The checks every copy call makes before it reads its request.
absl::StatusOr<Caller> IdentifyCopyCaller(ServiceContext& ctx,
                                          grpc::CallbackServerContext& context) {
  ASSIGN_OR_RETURN(Caller caller, IdentifyCaller(ctx, context));
  RETURN_IF_ERROR(CheckAnyAllowed(ctx));
  RETURN_IF_ERROR(CheckBackendHealthy(ctx.backend));
  return caller;
}

// Both copy RPCs: the checks every call makes, the plan, and the copy.
template <typename Request>
grpc::ServerUnaryReactor* ServeCopy(
    ServiceContext& ctx, grpc::CallbackServerContext* context, const Request& request,
    absl::StatusOr<RegionCopy> (*plan)(ServiceContext&, const std::string&, const Request&),
    v1::CopyRegionResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCopyCaller(ctx, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  absl::StatusOr<RegionCopy> copy = plan(ctx, caller->scope, request);
  if (!copy.ok()) return FinishNow(context, copy.status());
  return SubmitCopy(ctx, context, *caller, request.stream_id(), *std::move(copy), response);
}

// The region a range of an upload is copied from, and the checks of the request's region
// side: a system region of the client, holding the range.
absl::StatusOr<RegionHandle> LookupUploadSource(ServiceContext& ctx, const std::string& client,
                                                const v1::CopyFromRegionRequest& request) {
  if (!request.stream_id().empty()) {
    return absl::InvalidArgumentError(
        "a copy into an upload runs on the upload's own stream; stream_id must be empty");
  }
  ASSIGN_OR_RETURN(RegionHandle region,
                   LookupCopyRegion(ctx, client, request.region_id(), /*write=*/false));
  if (region->kind != RegionKind::kSystem) {
    // The upload copies from host memory; a device allocation would need a device copy.
    return absl::InvalidArgumentError(
        absl::StrCat("region ", region->id,
                     " is CUDA IPC memory; an upload's range is copied from system shared "
                     "memory (copy from the region into a buffer instead)"));
  }
  RETURN_IF_ERROR(CheckByteRange(request.region_offset_bytes(), request.size_bytes(), region->size,
                                 absl::StrCat("region ", region->id)));
  return region;
}

// CopyFromRegion with `transfer_id`: bytes [offset_bytes, +size_bytes) of that upload
// copied from the region, as an Upload range stream would carry them. The call answers
// with the upload's outcome; every refusal after the upload is found, and a cancelled
// call, fails the whole upload, so that nothing of it becomes visible.
grpc::ServerUnaryReactor* ServeCopyIntoUpload(ServiceContext& ctx, UploadTransferTable& uploads,
                                              grpc::CallbackServerContext* context,
                                              const v1::CopyFromRegionRequest& request,
                                              v1::CopyRegionResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCopyCaller(ctx, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  absl::StatusOr<std::shared_ptr<UploadTransfer>> found =
      uploads.Lookup(caller->scope, request.transfer_id());
  if (!found.ok()) return FinishNow(context, found.status());
  std::shared_ptr<UploadTransfer> transfer = *std::move(found);
  auto* reactor = new DeferredReactor(caller->admission);
  const uint64_t offset = request.offset_bytes();
  const uint64_t size = request.size_bytes();
  // The upload's outcome is the call's answer.
  UploadTransfer::Listener listener = [state = reactor->state(), response](
                                          const absl::Status& status,
                                          const v1::UploadResponse& outcome) {
    DeferredReactor::FinishOnce(state, [&]() -> grpc::Status {
      if (!status.ok()) return ToGrpcStatus(status);
      *response->mutable_buffer() = outcome.buffer();
      *response->mutable_transfer() = outcome.transfer();
      return grpc::Status::OK;
    });
  };
  absl::Status added = transfer->AddRange(offset, size, std::move(listener));
  if (absl::IsNotFound(added)) {
    // The upload was over already and never took the listener.
    DeferredReactor::FinishOnce(reactor->state(), [&] { return ToGrpcStatus(added); });
    return reactor;
  }
  // Otherwise the upload answers, also when the range was bad (it failed the upload).
  if (!added.ok()) return reactor;
  // A client that gives up on any range gives up on the upload, as with Upload streams.
  reactor->CallOnCancel([transfer] {
    transfer->Fail(
        absl::CancelledError("a copy into the upload was cancelled; nothing was changed"));
  });
  const auto fail = [&](const absl::Status& why) {
    transfer->Fail(absl::Status(why.code(), absl::StrCat(why.message(), "; nothing was changed")));
    return reactor;
  };
  absl::StatusOr<RegionHandle> region = LookupUploadSource(ctx, caller->scope, request);
  if (!region.ok()) return fail(region.status());
  const Region& source = **region;
  const uint64_t region_offset = request.region_offset_bytes();
  if (DmaCopy(source, size)) {
    if (absl::Status holds = CheckRegionHolds(source, region_offset, size); !holds.ok()) {
      return fail(holds);
    }
    transfer->Write(offset, source.mapping->data() + region_offset,
                    UploadTransfer::HostMemory::kPinned, size,
                    [transfer, region = *std::move(region)](absl::Status) {
                      // Copied (or failed, which fails the upload): the range is done, and
                      // the region may go.
                      transfer->RangeDone();
                    });
    return reactor;
  }
  absl::StatusOr<HostStagingPool::Block> block =
      StageRegion(*ctx.staging, source, region_offset, size);
  if (!block.ok()) return fail(block.status());
  const void* staged = (*block)->data();
  transfer->Write(offset, staged, UploadTransfer::HostMemory::kStaging, size,
                  [transfer, block = *std::move(block)](absl::Status) { transfer->RangeDone(); });
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegionInfo* response) {
  // The caller first, as on every RPC: a caller without valid credentials hears of
  // nothing else, not even what the server allows.
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  auto region = std::make_unique<Region>();
  switch (request->source_case()) {
    case v1::RegisterRegionRequest::kSystem:
      region->kind = RegionKind::kSystem;
      break;
    case v1::RegisterRegionRequest::kCudaIpc:
      region->kind = RegionKind::kCudaIpc;
      break;
    case v1::RegisterRegionRequest::SOURCE_NOT_SET:
      if (absl::Status s = CheckAnyAllowed(ctx_); !s.ok()) return FinishNow(context, s);
      return FinishNow(context, absl::InvalidArgumentError(
                                    "the request names no memory: set 'system' or 'cuda_ipc'"));
  }
  if (absl::Status s = CheckAllowed(ctx_, region->kind); !s.ok()) return FinishNow(context, s);
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  region->client = caller->scope;
  if (region->kind == RegionKind::kSystem) {
    const v1::SystemSharedMemory& system = request->system();
    absl::StatusOr<std::unique_ptr<SharedMapping>> mapping =
        SharedMapping::Open(ctx_.backend, system.name(), system.offset_bytes(), system.size_bytes(),
                            system.read_only());
    if (!mapping.ok()) return FinishNow(context, mapping.status());
    region->shm_name = system.name();
    region->shm_offset = system.offset_bytes();
    region->read_only = system.read_only();
    region->size = system.size_bytes();
    region->mapping = *std::move(mapping);
  } else {
    const v1::CudaIpcMemory& ipc = request->cuda_ipc();
    if (absl::Status s = CheckDeviceIndex(ctx_.backend, ipc.device()); !s.ok())
      return FinishNow(context, s);
    if (ipc.size_bytes() == 0) {
      return FinishNow(context,
                       absl::InvalidArgumentError("a CUDA IPC region needs size_bytes > 0"));
    }
    absl::StatusOr<DeviceMemory> memory =
        ctx_.backend.OpenIpcHandle(ipc.device(), ipc.handle(), ipc.size_bytes());
    if (!memory.ok()) return FinishNow(context, memory.status());
    region->device = ipc.device();
    region->size = ipc.size_bytes();
    region->ipc_memory = *std::move(memory);
  }
  absl::StatusOr<RegionHandle> added = ctx_.regions->Add(std::move(region));
  if (added.ok()) ToProto(**added, response);
  return FinishNow(context, added.status());
}

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckAnyAllowed(ctx_); !s.ok()) return FinishNow(context, s);
  // Copies in flight hold the region until they complete.
  return FinishNow(context, ctx_.regions->Remove(caller->scope, request->region_id()).status());
}

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::ListRegions(
    grpc::CallbackServerContext* context, const v1::ListRegionsRequest* request,
    v1::ListRegionsResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckAnyAllowed(ctx_); !s.ok()) return FinishNow(context, s);
  for (const RegionHandle& region : ctx_.regions->List(caller->scope)) {
    ToProto(*region, response->add_regions());
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::CopyFromRegion(
    grpc::CallbackServerContext* context, const v1::CopyFromRegionRequest* request,
    v1::CopyRegionResponse* response) {
  if (request->target_case() == v1::CopyFromRegionRequest::kTransferId) {
    return ServeCopyIntoUpload(ctx_, *uploads_, context, *request, response);
  }
  return ServeCopy(ctx_, context, *request, PlanCopyFromRegion, response);
}

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::CopyToRegion(
    grpc::CallbackServerContext* context, const v1::CopyToRegionRequest* request,
    v1::CopyRegionResponse* response) {
  return ServeCopy(ctx_, context, *request, PlanCopyToRegion, response);
}

grpc::ServerUnaryReactor* SharedMemoryServiceImpl::ExportBuffer(
    grpc::CallbackServerContext* context, const v1::ExportBufferRequest* request,
    v1::ExportBufferResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = CheckAllowed(ctx_, RegionKind::kExport); !s.ok())
    return FinishNow(context, s);
  if (absl::Status s = CheckBackendHealthy(ctx_.backend); !s.ok()) return FinishNow(context, s);
  absl::StatusOr<BufferHandle> buffer;
  switch (request->target_case()) {
    case v1::ExportBufferRequest::kBuffer:
      buffer = ctx_.registry.Lookup(caller->scope, request->buffer());
      if (buffer.ok() && !(*buffer)->exportable) {
        return FinishNow(context, absl::FailedPreconditionError(absl::StrCat(
                                      "buffer ", (*buffer)->id,
                                      " was not created exportable (its memory comes from the "
                                      "stream-ordered pool); create one with ExportBuffer's "
                                      "'create'")));
      }
      break;
    case v1::ExportBufferRequest::kCreate:
      buffer = AllocateFromRequest(ctx_, caller->scope, request->create(), /*exportable=*/true);
      break;
    case v1::ExportBufferRequest::TARGET_NOT_SET:
      return FinishNow(context,
                       absl::InvalidArgumentError("the request names no buffer: set 'buffer' or "
                                                  "'create'"));
  }
  if (!buffer.ok()) return FinishNow(context, buffer.status());
  absl::StatusOr<std::string> handle = ctx_.backend.ExportIpcHandle((*buffer)->memory);
  if (!handle.ok()) return FinishNow(context, handle.status());
  auto region = std::make_unique<Region>();
  region->client = caller->scope;
  region->kind = RegionKind::kExport;
  region->size = (*buffer)->size_bytes();
  region->device = (*buffer)->device;
  region->exported = *buffer;
  region->ipc_handle = *handle;
  std::shared_ptr<Operation> filled;
  if (request->has_create()) {
    // Registered before the export, so that a failure leaves neither.
    absl::StatusOr<std::shared_ptr<Operation>> op =
        SubmitCreated(ctx_, caller->scope, *buffer, request->create());
    if (!op.ok()) return FinishNow(context, op.status());
    filled = *std::move(op);
  }
  absl::StatusOr<RegionHandle> added = ctx_.regions->Add(std::move(region));
  if (!added.ok()) {
    if (request->has_create()) (void)ctx_.registry.Remove(caller->scope, (*buffer)->id);
    return FinishNow(context, added.status());
  }
  ToProto(**buffer, response->mutable_buffer());
  ToProto(**added, response->mutable_region());
  response->set_handle(*handle);
  if (filled == nullptr) return FinishNow(context, absl::OkStatus());
  // A process that opens the handle reads the memory outside the stream order: the
  // handle goes out once the fill has covered whatever the memory held before.
  auto* reactor = new DeferredReactor(caller->admission);
  ctx_.executor.OnDone(filled, [this, filled, state = reactor->state()] {
    const absl::Status error = ctx_.executor.GetStatus(*filled).error;
    DeferredReactor::FinishOnce(state, [&] { return ToGrpcStatus(error); });
  });
  return reactor;
}

}  // namespace gpucompute

// ServerService: GetServerInfo, GetStats, TrimMemoryPool, StartProfiler, StopProfiler.
#include "common/host_identity.h"
#include "server/util/request_id.h"
#include "server/service/services.h"

namespace gpucompute {
namespace {

void ToProto(int device, const PoolUsage& usage, v1::MemoryPoolUsage* out) {
  out->set_device(device);
  out->set_reserved_bytes(usage.reserved_bytes);
  out->set_used_bytes(usage.used_bytes);
}

// The memory and buffers of one tenant's scopes. Its memory is all it holds: buffers,
// uploads under way and outputs of queued operations (MemoryLimiter).
struct TenantUsage {
  uint64_t bytes = 0;
  uint64_t buffers = 0;
};

TenantUsage UsageOf(const ServiceContext& ctx, absl::string_view tenant) {
  TenantUsage usage;
  usage.bytes = ctx.limiter.TenantUsed(tenant);
  ctx.registry.ForEach(
      [&](const BufferMeta& b) { usage.buffers += TenantOfScope(b.client) == tenant; });
  return usage;
}

// Empty while the backend is healthy, else its error.
std::string BackendError(const Backend& backend) {
  const absl::Status health = backend.health();
  return health.ok() ? std::string() : health.ToString();
}

}  // namespace

grpc::ServerUnaryReactor* ServerServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const v1::GetServerInfoRequest* request,
                                                           v1::ServerInfo* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  const TenantUsage own = UsageOf(ctx_, caller->tenant);
  response->set_tenant(caller->tenant);
  response->set_admin(caller->admin);
  response->set_authentication_enabled(ctx_.auth != nullptr);
  response->set_tenant_memory_used_bytes(own.bytes);
  response->set_tenant_buffer_count(own.buffers);
  response->set_version(kVersion);
  response->set_api(kApi);
  response->set_backend(std::string(ctx_.backend.name()));
  for (const DeviceDescription& d : ctx_.backend.devices()) {
    v1::DeviceInfo* info = response->add_devices();
    info->set_index(d.index);
    info->set_name(d.name);
    info->set_total_memory_bytes(d.total_memory_bytes);
    info->set_peak_bandwidth_gbps(d.peak_bandwidth_gbps);
    info->set_compute_units(d.compute_units);
    if (caller->admin) {  // the pools hold every tenant's memory
      const PoolUsage pool = ctx_.backend.MemoryPoolUsage(d.index);
      info->set_pool_reserved_bytes(pool.reserved_bytes);
      info->set_pool_used_bytes(pool.used_bytes);
    }
  }
  response->set_default_device(ctx_.executor.default_device());
  response->set_memory_limit_bytes(ctx_.limiter.limit());
  response->set_memory_used_bytes(caller->admin ? ctx_.limiter.used() : own.bytes);
  response->set_buffer_count(caller->admin ? ctx_.registry.size() : own.buffers);
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(ctx_.limits.max_message_bytes);
  limits->set_max_chunk_bytes(ctx_.limits.max_chunk_bytes());
  limits->set_max_dimensions(ctx_.limits.max_dimensions);
  limits->set_max_elements(ctx_.limits.max_elements);
  limits->set_max_streams_per_client(Executor::kMaxStreamsPerClient);
  limits->set_max_streams(ctx_.executor.max_streams());
  limits->set_max_expression_bytes(ctx_.limits.max_expression_bytes);
  limits->set_max_expression_depth(ctx_.limits.max_expression_depth);
  limits->set_max_inline_values(kMaxInlineValues);
  limits->set_max_regions_per_client(kMaxRegionsPerClient);
  limits->set_max_session_in_flight(kMaxSessionInFlight);
  limits->set_max_chain_steps(kMaxChainSteps);
  limits->set_max_upload_ranges(kMaxUploadRanges);
  limits->set_upload_idle_timeout_seconds(kDefaultUploadIdleTimeoutSeconds);
  limits->set_max_ttl_seconds(kMaxTtlSeconds);
  response->set_default_result_ttl_seconds(static_cast<double>(ctx_.default_result_ttl_nanos) /
                                           1e9);
  response->set_leases_expired(ctx_.registry.leases_expired());
  response->set_persistence_enabled(ctx_.persistence_enabled);
  if (ctx_.quotas != nullptr) {
    const TenantQuota quota = ctx_.quotas->For(caller->tenant);
    limits->set_tenant_max_device_bytes(quota.device_bytes);
    limits->set_tenant_max_buffers(quota.buffers);
    limits->set_tenant_max_streams(quota.streams);
    limits->set_tenant_max_operations_in_flight(quota.operations);
  }
  limits->set_stream_upload_idle_timeout_seconds(absl::ToDoubleSeconds(ctx_.upload_idle_timeout));
  if (ctx_.admission != nullptr) {
    using Kind = TenantAdmission::Kind;
    limits->set_tenant_max_calls_in_flight(ctx_.admission->limits().calls);
    limits->set_tenant_max_uploads_in_flight(ctx_.admission->limits().uploads);
    response->set_tenant_calls_in_flight(ctx_.admission->InUse(Kind::kCall, caller->tenant));
    response->set_tenant_uploads_in_flight(ctx_.admission->InUse(Kind::kUpload, caller->tenant));
  }
  response->set_host_to_device_gbps(ctx_.copy_ceiling.host_to_device_gbps);
  response->set_device_to_host_gbps(ctx_.copy_ceiling.device_to_host_gbps);
  response->set_copy_ceiling(ctx_.copy_ceiling.description);
  response->set_backend_error(BackendError(ctx_.backend));
  response->set_shared_memory_enabled(ctx_.shared_memory.allow_system);
  response->set_cuda_ipc_enabled(ctx_.shared_memory.allow_cuda_ipc);
  response->set_hostname(HostName());
  response->set_boot_id(BootId());
  response->set_region_idle_timeout_seconds(absl::ToDoubleSeconds(ctx_.shared_memory.idle_timeout));
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                      const v1::GetStatsRequest* request,
                                                      v1::Stats* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  response->set_tenant(caller->tenant);
  response->set_admin(caller->admin);
  const std::array<KindStats, kNumOperationKinds> stats = ctx_.executor.Stats(
      caller->admin ? std::nullopt : std::optional<absl::string_view>(caller->tenant));
  for (int k = 0; k < kNumOperationKinds; ++k) {
    const KindStats& s = stats[k];
    if (s.count == 0) continue;
    v1::KindStats* out = response->add_kinds();
    out->set_kind(ToProto(static_cast<OperationKind>(k)));
    out->set_count(s.count);
    out->set_failed(s.failed);
    out->set_device_seconds(s.device_seconds);
    out->set_bytes_read(s.bytes_read);
    out->set_bytes_written(s.bytes_written);
    out->set_flops(s.flops);
    out->set_cancelled(s.cancelled);
    out->set_timed_out(s.timed_out);
  }
  response->set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx_.start_time).count());
  if (!caller->admin) {
    response->set_memory_used_bytes(ctx_.limiter.TenantUsed(caller->tenant));
    response->set_backend_error(BackendError(ctx_.backend));
    return FinishNow(context, absl::OkStatus());
  }
  response->set_memory_used_bytes(ctx_.limiter.used());
  response->set_memory_peak_bytes(ctx_.limiter.peak());
  for (const DeviceDescription& d : ctx_.backend.devices()) {
    ToProto(d.index, ctx_.backend.MemoryPoolUsage(d.index), response->add_pools());
  }
  response->set_backend_error(BackendError(ctx_.backend));
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerServiceImpl::TrimMemoryPool(
    grpc::CallbackServerContext* context, const v1::TrimMemoryPoolRequest* request,
    v1::TrimMemoryPoolResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = RequireAdmin(*caller, "TrimMemoryPool"); !s.ok()) {
    return FinishNow(context, s);
  }
  std::vector<int> devices;
  if (request->has_device()) {
    if (absl::Status s = CheckDeviceIndex(ctx_.backend, request->device()); !s.ok())
      return FinishNow(context, s);
    devices.push_back(request->device());
  } else {
    for (const DeviceDescription& d : ctx_.backend.devices()) devices.push_back(d.index);
  }
  // Trimming returns memory to the driver and does not wait for queued work, so it is
  // done here, on the callback's thread.
  for (int device : devices) {
    absl::StatusOr<PoolUsage> usage = ctx_.backend.TrimMemoryPool(device, request->keep_bytes());
    if (!usage.ok()) return FinishNow(context, usage.status());
    ToProto(device, *usage, response->add_pools());
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerServiceImpl::StartProfiler(grpc::CallbackServerContext* context,
                                                           const v1::StartProfilerRequest* request,
                                                           v1::StartProfilerResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = RequireAdmin(*caller, "StartProfiler"); !s.ok())
    return FinishNow(context, s);
  return FinishNow(context, ctx_.backend.StartProfiler());
}

grpc::ServerUnaryReactor* ServerServiceImpl::StopProfiler(grpc::CallbackServerContext* context,
                                                          const v1::StopProfilerRequest* request,
                                                          v1::StopProfilerResponse* response) {
  absl::StatusOr<Caller> caller = IdentifyCaller(ctx_, *context);
  if (!caller.ok()) return FinishNow(context, caller.status());
  if (absl::Status s = RequireAdmin(*caller, "StopProfiler"); !s.ok()) return FinishNow(context, s);
  return FinishNow(context, ctx_.backend.StopProfiler());
}

}  // namespace gpucompute

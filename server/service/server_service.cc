// ServerService: GetServerInfo, GetStats.
#include "server/service/services.h"

namespace gpucompute {

grpc::ServerUnaryReactor* ServerServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const v1::GetServerInfoRequest* request,
                                                           v1::ServerInfo* response) {
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
  }
  response->set_default_device(ctx_.executor.default_device());
  response->set_memory_limit_bytes(ctx_.limiter.limit());
  response->set_memory_used_bytes(ctx_.limiter.used());
  response->set_buffer_count(ctx_.registry.size());
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(kMaxMessageBytes);
  limits->set_max_dimensions(kMaxDimensions);
  limits->set_max_streams_per_client(Executor::kMaxStreamsPerClient);
  limits->set_max_expression_bytes(kMaxExpressionBytes);
  limits->set_max_inline_values(kMaxInlineValues);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerServiceImpl::GetStats(grpc::CallbackServerContext* context,
                                                      const v1::GetStatsRequest* request, v1::Stats* response) {
  const std::array<KindStats, kNumOpKinds> stats = ctx_.executor.Stats();
  for (int k = 0; k < kNumOpKinds; ++k) {
    const KindStats& s = stats[k];
    if (s.count == 0) continue;
    v1::KindStats* out = response->add_kinds();
    out->set_kind(ToProto(static_cast<OpKind>(k)));
    out->set_count(s.count);
    out->set_failed(s.failed);
    out->set_device_seconds(s.device_seconds);
    out->set_bytes_read(s.bytes_read);
    out->set_bytes_written(s.bytes_written);
    out->set_flops(s.flops);
  }
  response->set_memory_used_bytes(ctx_.limiter.used());
  response->set_memory_peak_bytes(ctx_.limiter.peak());
  response->set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx_.start_time).count());
  return FinishNow(context, absl::OkStatus());
}

}  // namespace gpucompute


#include "server/metrics/server_metrics.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/tenancy/auth.h"
#include "server/util/log.h"
#include "server/metrics/process_metrics.h"

namespace gpucompute::metrics {
namespace {

// Uploads and downloads are transfers, counted apart from the operations on the device;
// every other kind goes through the executor's queue.
bool IsTransfer(OperationKind kind) {
  return kind == OperationKind::kUpload || kind == OperationKind::kDownload;
}

Family Make(std::string name, std::string help, MetricType type) {
  return Family{std::move(name), std::move(help), type, {}, {}};
}

Family Single(std::string name, std::string help, double value,
              MetricType type = MetricType::kGauge) {
  Family f = Make(std::move(name), std::move(help), type);
  f.samples.push_back({{}, value});
  return f;
}

std::string Kind(int k) { return std::string(OperationKindName(static_cast<OperationKind>(k))); }

}  // namespace

ServerMetrics::ServerMetrics(ServiceContext& ctx, Options options) : ctx_(ctx) {
  for (int k = 0; k < kNumOperationKinds; ++k) {
    // Device time from 10 us to 100 s; latency, which adds the wait in the queue and
    // the completion's hand-off, from 100 us.
    device_seconds_[k] = std::make_unique<Histogram>(DecadeBounds(-5, 2));
    latency_seconds_[k] = std::make_unique<Histogram>(DecadeBounds(-4, 2));
  }
  devices_ = ctx_.backend.devices().size();
  load_ = std::make_unique<DeviceLoad[]>(devices_);
  gpus_ = ctx_.backend.name() == "cuda" || options.nvml_on_any_backend;
  if (gpus_ && !options.nvml_library.empty()) {
    nvml_ = Nvml::Load(options.nvml_library, &nvml_error_);
    if (nvml_ == nullptr) {
      Log(LogLevel::kWarning, "metrics: no GPU utilization or power", {{"error", nvml_error_}});
    }
  }
}

absl::Status ServerMetrics::Serve(const std::string& listen, HttpEndpoint::Readiness ready) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http =
      HttpEndpoint::Start(listen, [this] { return Render(); }, std::move(ready));
  if (!http.ok()) return http.status();
  http_ = *std::move(http);
  return absl::OkStatus();
}

void ServerMetrics::StopServing() { http_.reset(); }

void ServerMetrics::OnSubmitted(const OperationStatus& op) {
  if (op.device >= 0 && static_cast<size_t>(op.device) < devices_) {
    load_[op.device].queued.fetch_add(1, std::memory_order_relaxed);
  }
}

void ServerMetrics::OnDispatched(const OperationStatus& op) {
  if (op.device >= 0 && static_cast<size_t>(op.device) < devices_) {
    load_[op.device].queued.fetch_sub(1, std::memory_order_relaxed);
    load_[op.device].running.fetch_add(1, std::memory_order_relaxed);
  }
}

void ServerMetrics::OnCompleted(const OperationStatus& op) {
  if (op.device >= 0 && static_cast<size_t>(op.device) < devices_) {
    load_[op.device].running.fetch_sub(1, std::memory_order_relaxed);
  }
  if (op.state != OperationStatus::State::kSucceeded) return;
  // An operation that runs several as one unit: each with an even share of the device
  // time, and the unit's latency.
  OperationMember one;
  const std::span<const OperationMember> operations = op.Operations(one);
  const double share = op.timing.device_seconds / operations.size();
  for (const OperationMember& m : operations) {
    const int k = static_cast<int>(m.kind);
    device_seconds_[k]->Observe(share);
    latency_seconds_[k]->Observe(op.timing.queued_seconds + op.timing.device_seconds);
  }
}

std::vector<Family> ServerMetrics::Collect() {
  std::vector<Family> out;
  CollectOperations(out);
  CollectBuffers(out);
  CollectDevices(out);
  CollectGpus(out);
  for (Family& f : ProcessFamilies()) out.push_back(std::move(f));
  return out;
}

void ServerMetrics::CollectOperations(std::vector<Family>& out) {
  const std::array<KindStats, kNumOperationKinds> stats = ctx_.executor.Stats();
  Family total =
      Make("gpucompute_operations_total", "Operations and transfers finished, by kind and outcome.",
           MetricType::kCounter);
  Family abandoned = Make("gpucompute_transfers_abandoned_total",
                          "Uploads and downloads that failed because the client cancelled or broke "
                          "them off (reason=cancelled) or sent nothing for the idle timeout "
                          "(reason=timed_out); also counted as failed.",
                          MetricType::kCounter);
  Family read = Make("gpucompute_operation_read_bytes_total",
                     "Bytes operations read from device memory, by kind.", MetricType::kCounter);
  Family written = Make("gpucompute_operation_written_bytes_total",
                        "Bytes operations wrote to device memory, by kind.", MetricType::kCounter);
  Family flops = Make("gpucompute_operation_flops_total",
                      "Floating-point operations performed, by kind.", MetricType::kCounter);
  Family device = Make("gpucompute_operation_device_seconds",
                       "Device time of each succeeded operation, by kind.", MetricType::kHistogram);
  Family latency = Make("gpucompute_operation_latency_seconds",
                        "Time from an operation's submission to its completion (queued plus device "
                        "time), succeeded operations, by kind.",
                        MetricType::kHistogram);
  for (int k = 0; k < kNumOperationKinds; ++k) {
    const KindStats& s = stats[k];
    const std::string kind = Kind(k);
    total.samples.push_back(
        {{{"kind", kind}, {"outcome", "succeeded"}}, static_cast<double>(s.count - s.failed)});
    total.samples.push_back(
        {{{"kind", kind}, {"outcome", "failed"}}, static_cast<double>(s.failed)});
    if (IsTransfer(static_cast<OperationKind>(k))) {
      abandoned.samples.push_back(
          {{{"kind", kind}, {"reason", "cancelled"}}, static_cast<double>(s.cancelled)});
      abandoned.samples.push_back(
          {{{"kind", kind}, {"reason", "timed_out"}}, static_cast<double>(s.timed_out)});
      continue;
    }
    read.samples.push_back({{{"kind", kind}}, static_cast<double>(s.bytes_read)});
    written.samples.push_back({{{"kind", kind}}, static_cast<double>(s.bytes_written)});
    flops.samples.push_back({{{"kind", kind}}, static_cast<double>(s.flops)});
    device.histograms.push_back({{{"kind", kind}}, device_seconds_[k]->Read()});
    latency.histograms.push_back({{{"kind", kind}}, latency_seconds_[k]->Read()});
  }
  out.push_back(std::move(total));
  out.push_back(std::move(abandoned));
  out.push_back(std::move(device));
  out.push_back(std::move(latency));
  out.push_back(std::move(read));
  out.push_back(std::move(written));
  out.push_back(std::move(flops));

  Family uploaded =
      Make("gpucompute_uploaded_bytes_total", "Bytes clients uploaded.", MetricType::kCounter);
  uploaded.samples.push_back(
      {{}, static_cast<double>(stats[static_cast<int>(OperationKind::kUpload)].bytes_written)});
  Family downloaded =
      Make("gpucompute_downloaded_bytes_total", "Bytes clients downloaded.", MetricType::kCounter);
  downloaded.samples.push_back(
      {{}, static_cast<double>(stats[static_cast<int>(OperationKind::kDownload)].bytes_read)});
  out.push_back(std::move(uploaded));
  out.push_back(std::move(downloaded));

  Family queued =
      Make("gpucompute_operations_queued",
           "Operations submitted and not yet handed to the device: waiting for earlier work "
           "on their stream or for a buffer another stream uses.",
           MetricType::kGauge);
  Family running =
      Make("gpucompute_operations_running",
           "Operations handed to the device and not finished (on a busy device, some wait "
           "there behind others).",
           MetricType::kGauge);
  for (size_t d = 0; d < devices_; ++d) {
    queued.samples.push_back(
        {{{"device", absl::StrCat(d)}}, static_cast<double>(load_[d].queued.load())});
    running.samples.push_back(
        {{{"device", absl::StrCat(d)}}, static_cast<double>(load_[d].running.load())});
  }
  out.push_back(std::move(queued));
  out.push_back(std::move(running));
}

void ServerMetrics::CollectBuffers(std::vector<Family>& out) {
  struct Usage {
    uint64_t buffers = 0;
    uint64_t bytes = 0;
  };
  std::map<std::pair<std::string, int>, Usage> usage;  // (client, device)
  std::map<std::string, uint64_t> client_bytes;
  ctx_.registry.ForEach([&](const BufferMeta& b) {
    const std::string client = DisplayScope(b.client);
    Usage& u = usage[{client, b.device}];
    ++u.buffers;
    u.bytes += b.size_bytes();
    client_bytes[client] += b.size_bytes();
  });
  if (client_bytes.size() > kMaxClientSeries) {
    // Keep the clients holding the most bytes; fold the rest into one series per device.
    std::vector<std::pair<uint64_t, std::string>> by_bytes;
    for (const auto& [client, bytes] : client_bytes) by_bytes.emplace_back(bytes, client);
    std::sort(by_bytes.begin(), by_bytes.end(), std::greater<>());
    std::map<std::string, uint64_t> kept;
    for (size_t i = 0; i < kMaxClientSeries - 1; ++i) kept.insert({by_bytes[i].second, 0});
    std::map<std::pair<std::string, int>, Usage> folded;
    for (const auto& [key, u] : usage) {
      Usage& f = folded[{kept.count(key.first) != 0 ? key.first : kOtherClients, key.second}];
      f.buffers += u.buffers;
      f.bytes += u.bytes;
    }
    usage = std::move(folded);
  }
  Family buffers =
      Make("gpucompute_buffers", "Resident buffers, by device and client.", MetricType::kGauge);
  Family bytes = Make("gpucompute_buffer_bytes", "Bytes of resident buffers, by device and client.",
                      MetricType::kGauge);
  for (const auto& [key, u] : usage) {
    const Labels labels{{"device", absl::StrCat(key.second)}, {"client", key.first}};
    buffers.samples.push_back({labels, static_cast<double>(u.buffers)});
    bytes.samples.push_back({labels, static_cast<double>(u.bytes)});
  }
  out.push_back(std::move(buffers));
  out.push_back(std::move(bytes));
  out.push_back(Single("gpucompute_memory_limit_bytes",
                       "Bytes all buffers may hold together (--memory-limit).",
                       static_cast<double>(ctx_.limiter.limit())));
  out.push_back(Single("gpucompute_memory_used_bytes",
                       "Bytes charged against the memory limit: buffers and upload staging.",
                       static_cast<double>(ctx_.limiter.used())));
  out.push_back(Single("gpucompute_memory_peak_bytes",
                       "The most bytes charged against the limit at once.",
                       static_cast<double>(ctx_.limiter.peak())));
}

void ServerMetrics::CollectDevices(std::vector<Family>& out) {
  Family info = Make("gpucompute_device_info", "The server's devices; the value is always 1.",
                     MetricType::kGauge);
  Family total =
      Make("gpucompute_device_memory_total_bytes", "Memory of each device.", MetricType::kGauge);
  Family reserved =
      Make("gpucompute_pool_reserved_bytes",
           "Bytes each device's memory pool holds from the device.", MetricType::kGauge);
  Family used =
      Make("gpucompute_pool_used_bytes",
           "Bytes of each device's memory pool that live allocations use.", MetricType::kGauge);
  for (const DeviceDescription& d : ctx_.backend.devices()) {
    const std::string device = absl::StrCat(d.index);
    info.samples.push_back({{{"device", device}, {"name", d.name}}, 1});
    total.samples.push_back({{{"device", device}}, static_cast<double>(d.total_memory_bytes)});
    const PoolUsage pool = ctx_.backend.MemoryPoolUsage(d.index);
    reserved.samples.push_back({{{"device", device}}, static_cast<double>(pool.reserved_bytes)});
    used.samples.push_back({{{"device", device}}, static_cast<double>(pool.used_bytes)});
  }
  out.push_back(std::move(info));
  out.push_back(std::move(total));
  out.push_back(std::move(reserved));
  out.push_back(std::move(used));
  out.push_back(
      Single("gpucompute_backend_healthy",
             "1 while the backend is healthy; 0 after a failure that makes the server refuse work "
             "until restarted.",
             ctx_.backend.health().ok() ? 1 : 0));
  Family lane = Make("gpucompute_lane_jobs_total",
                     "Submits and chains planned and launched on the warm lane (ran_on=lane), "
                     "or on the call's own thread, the lane being busy, asleep or off "
                     "(ran_on=call).",
                     MetricType::kCounter);
  if (ctx_.lane != nullptr) {  // null once the server has shut down
    lane.samples.push_back({{{"ran_on", "lane"}}, static_cast<double>(ctx_.lane->ran_on_lane())});
    lane.samples.push_back({{{"ran_on", "call"}}, static_cast<double>(ctx_.lane->ran_on_caller())});
    out.push_back(std::move(lane));
  }
  out.push_back(Single("gpucompute_redirected_calls_total",
                       "Calls refused because the placement table places their tenant on "
                       "another replica.",
                       static_cast<double>(ctx_.routing->redirects.load()), MetricType::kCounter));
  out.push_back(Single("gpucompute_tenant_header_refusals_total",
                       "Calls refused because their gpucompute-tenant header named another "
                       "tenant than their credentials.",
                       static_cast<double>(ctx_.routing->tenant_header_refused.load()),
                       MetricType::kCounter));
  out.push_back(Single(
      "gpucompute_uptime_seconds", "Seconds since the server started.",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx_.start_time).count()));
  Family build =
      Make("gpucompute_build_info", "The server's version, API and backend; the value is always 1.",
           MetricType::kGauge);
  build.samples.push_back(
      {{{"version", kVersion}, {"api", kApi}, {"backend", std::string(ctx_.backend.name())}}, 1});
  out.push_back(std::move(build));
}

void ServerMetrics::CollectGpus(std::vector<Family>& out) {
  if (!gpus_) return;
  out.push_back(
      Single("gpucompute_nvml_up",
             "1 when NVML (libnvidia-ml.so.1) was loaded and the gpucompute_gpu_* series are "
             "present.",
             nvml_ != nullptr ? 1 : 0));
  if (nvml_ == nullptr) return;
  const std::vector<GpuReading> gpus = nvml_->Read();
  struct Series {
    const char* name;
    const char* help;
    std::optional<double> GpuReading::*field;
  };
  static constexpr Series kSeries[] = {
      {"gpucompute_gpu_utilization_ratio",
       "Fraction of the last sample period a kernel ran (NVML).", &GpuReading::utilization_ratio},
      {"gpucompute_gpu_memory_utilization_ratio",
       "Fraction of the last sample period device memory was read or written (NVML).",
       &GpuReading::memory_utilization_ratio},
      {"gpucompute_gpu_memory_used_bytes", "Device memory in use, by every process (NVML).",
       &GpuReading::memory_used_bytes},
      {"gpucompute_gpu_memory_total_bytes", "Device memory (NVML).",
       &GpuReading::memory_total_bytes},
      {"gpucompute_gpu_power_watts", "Power draw (NVML).", &GpuReading::power_watts},
      {"gpucompute_gpu_power_limit_watts", "Enforced power limit (NVML).",
       &GpuReading::power_limit_watts},
      {"gpucompute_gpu_temperature_celsius", "GPU die temperature (NVML).",
       &GpuReading::temperature_celsius},
  };
  Family info =
      Make("gpucompute_gpu_info", "GPUs NVML sees, by NVML index and UUID; the value is always 1.",
           MetricType::kGauge);
  for (const GpuReading& g : gpus) {
    info.samples.push_back(
        {{{"gpu", absl::StrCat(g.index)}, {"uuid", g.uuid}, {"name", g.name}}, 1});
  }
  out.push_back(std::move(info));
  for (const Series& s : kSeries) {
    Family f = Make(s.name, s.help, MetricType::kGauge);
    for (const GpuReading& g : gpus) {
      const std::optional<double>& value = g.*(s.field);
      if (value.has_value())
        f.samples.push_back({{{"gpu", absl::StrCat(g.index)}, {"uuid", g.uuid}}, *value});
    }
    out.push_back(std::move(f));
  }
}

}  // namespace gpucompute::metrics

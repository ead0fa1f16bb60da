// The series gpucompute-server exposes on /metrics. Most are read at each scrape from
// the state the server already keeps (the executor's per-kind statistics, the buffer
// registry, the memory limiter, the backend's pools and health), so /metrics and the
// GetStats RPC agree; what needs each operation (latency histograms, operations queued
// and running) is recorded as the executor's OperationObserver.
//
// Series (label values in <>):
//   gpucompute_operations_total{kind,outcome=succeeded|failed}        counter
//   gpucompute_operation_device_seconds{kind}         histogram, succeeded operations
//   gpucompute_operation_latency_seconds{kind}        histogram, submission to completion
//   gpucompute_operation_read_bytes_total{kind}, _written_bytes_total{kind},
//   gpucompute_operation_flops_total{kind}                             counters
//   gpucompute_uploaded_bytes_total, gpucompute_downloaded_bytes_total counters
//   gpucompute_operations_queued{device}, gpucompute_operations_running{device}  gauges
//   gpucompute_buffers{device,client}, gpucompute_buffer_bytes{device,client}    gauges
//   gpucompute_memory_limit_bytes, _used_bytes, _peak_bytes                     gauges
//   gpucompute_pool_reserved_bytes{device}, gpucompute_pool_used_bytes{device}  gauges
//   gpucompute_device_info{device,name}, gpucompute_device_memory_total_bytes{device}
//   gpucompute_lane_jobs_total{ran_on=lane|call}   counter, Submits and chains (warm_lane.h)
//   gpucompute_redirected_calls_total, gpucompute_tenant_header_refusals_total  counters
//   (IdentifyCaller's routing checks, service_context.h)
//   gpucompute_backend_healthy, gpucompute_uptime_seconds,
//   gpucompute_build_info{version,api,backend}                                  gauges
//   process_* (process_metrics.h)
//   CUDA backend: gpucompute_nvml_up, and from NVML, per GPU {gpu,uuid}:
//   gpucompute_gpu_info{name}, _utilization_ratio, _memory_utilization_ratio,
//   _memory_used_bytes, _memory_total_bytes, _power_watts, _power_limit_watts,
//   _temperature_celsius (gpucompute_gpu_ prefix).
#ifndef GPUCOMPUTE_SERVER_METRICS_SERVER_METRICS_H_
#define GPUCOMPUTE_SERVER_METRICS_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/executor.h"
#include "server/metrics/exposition.h"
#include "server/metrics/http_endpoint.h"
#include "server/metrics/nvml.h"
#include "server/service/service_context.h"

namespace gpucompute::metrics {

// Clients beyond this many (those with the fewest bytes) are summed under client="_other",
// so that a client naming itself freely cannot grow the series without bound.
inline constexpr size_t kMaxClientSeries = 64;
inline constexpr char kOtherClients[] = "_other";

class ServerMetrics final : public OperationObserver {
 public:
  struct Options {
    // Where NVML is loaded from on the CUDA backend; empty: not loaded.
    std::string nvml_library = Nvml::kLibrary;
    // Load it whatever the backend (tests, with a stand-in library).
    bool nvml_on_any_backend = false;
  };

  // Reads the server `ctx` describes; serves nothing until Serve.
  ServerMetrics(ServiceContext& ctx, Options options);
  explicit ServerMetrics(ServiceContext& ctx) : ServerMetrics(ctx, Options()) {}
  // Serves /metrics, and /readyz from `ready` when set, on `listen` (see
  // HttpEndpoint::Start) until StopServing or destruction.
  absl::Status Serve(const std::string& listen, HttpEndpoint::Readiness ready = nullptr);
  void StopServing();
  int port() const { return http_ == nullptr ? 0 : http_->port(); }

  std::vector<Family> Collect();
  std::string Render() { return metrics::Render(Collect()); }

  void OnSubmitted(const OperationStatus& op) override;
  void OnDispatched(const OperationStatus& op) override;
  void OnCompleted(const OperationStatus& op) override;

 private:
  // Counted from the executor's threads as operations move, with no lock: OnSubmitted
  // and OnDispatched are called under the executor's mutex, which must not wait here.
  struct DeviceLoad {
    std::atomic<int64_t> queued{0};
    std::atomic<int64_t> running{0};
  };

  void CollectOperations(std::vector<Family>& out);
  void CollectBuffers(std::vector<Family>& out);
  void CollectDevices(std::vector<Family>& out);
  void CollectGpus(std::vector<Family>& out);

  ServiceContext& ctx_;
  std::array<std::unique_ptr<Histogram>, kNumOperationKinds> device_seconds_;
  std::array<std::unique_ptr<Histogram>, kNumOperationKinds> latency_seconds_;
  std::unique_ptr<DeviceLoad[]> load_;  // by device
  size_t devices_ = 0;
  bool gpus_ = false;             // whether the gpucompute_nvml_up and gpu series are exported
  std::unique_ptr<Nvml> nvml_;
  std::string nvml_error_;
  std::unique_ptr<HttpEndpoint> http_;
};

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_SERVER_METRICS_H_

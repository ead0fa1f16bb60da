// GPU utilization, memory, power and temperature from NVIDIA's management library
// (NVML), loaded at run time with dlopen so that the server starts, and serves every other
// series, on machines without the driver. No CUDA or NVML header is needed: the few entry
// points used are declared in nvml.cc.
//
// NVML numbers GPUs its own way (PCI bus order, within what the container sees), which
// need not be CUDA's device order; each GPU is therefore also named by its UUID.
#ifndef GPUCOMPUTE_SERVER_METRICS_NVML_H_
#define GPUCOMPUTE_SERVER_METRICS_NVML_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpucompute::metrics {

struct GpuReading {
  unsigned index = 0;  // NVML's index
  std::string uuid;
  std::string name;
  // Each unset when the GPU does not report it (e.g. utilization on a MIG instance).
  std::optional<double> utilization_ratio;  // kernels running, 0..1 of the last sample period
  std::optional<double> memory_utilization_ratio;  // memory controller busy, 0..1
  std::optional<double> memory_used_bytes;         // by every process, less the driver's reserve
  std::optional<double> memory_total_bytes;
  std::optional<double> power_watts;
  std::optional<double> power_limit_watts;
  std::optional<double> temperature_celsius;
};

class Nvml {
 public:
  static constexpr char kLibrary[] = "libnvidia-ml.so.1";

  // Loads `library` and initializes NVML. Null, with the reason in *error, when the
  // library is missing or NVML does not initialize (no driver, no GPU).
  static std::unique_ptr<Nvml> Load(const std::string& library, std::string* error);
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // One reading of every GPU NVML sees. Thread-safe (NVML is).
  std::vector<GpuReading> Read() const;

  struct Api;  // the entry points, resolved with dlsym

 private:
  Nvml(void* handle, std::unique_ptr<Api> api);
  void* handle_;
  std::unique_ptr<Api> api_;
};

}  // namespace gpucompute::metrics

#endif  // GPUCOMPUTE_SERVER_METRICS_NVML_H_

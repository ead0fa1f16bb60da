#include "server/metrics/nvml.h"

#include <dlfcn.h>

namespace gpucompute::metrics {
namespace {

// The subset of nvml.h used here, with NVML's own names and layouts (stable across
// driver versions: these are the unversioned structs of the v2 API).
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the sample period a kernel was running
  unsigned int memory;  // percent of it device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;  // includes memory the driver reserves
};
// Drivers since R510: `used` without what the driver reserves, as nvidia-smi shows it.
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned int kMemoryV2Version = sizeof(nvmlMemory_v2_t) | (2u << 24);  // nvmlMemory_v2
constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr unsigned kNameLength = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidLength = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*Init)();
  nvmlReturn_t (*Shutdown)();
  const char* (*ErrorString)(nvmlReturn_t);
  nvmlReturn_t (*DeviceGetCount)(unsigned int*);
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*DeviceGetMemoryInfoV2)(nvmlDevice_t, nvmlMemory_v2_t*);  // null on old drivers
  nvmlReturn_t (*DeviceGetPowerUsage)(nvmlDevice_t, unsigned int*);
  nvmlReturn_t (*DeviceGetEnforcedPowerLimit)(nvmlDevice_t, unsigned int*);
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned int*);
};

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn*& fn, std::string* missing) {
  fn = reinterpret_cast<Fn*>(dlsym(handle, symbol));
  if (fn == nullptr && missing->empty()) *missing = symbol;
  return fn != nullptr;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::Load(const std::string& library, std::string* error) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : "cannot load " + library;
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  Resolve(handle, "nvmlInit_v2", api->Init, &missing);
  Resolve(handle, "nvmlShutdown", api->Shutdown, &missing);
  Resolve(handle, "nvmlErrorString", api->ErrorString, &missing);
  Resolve(handle, "nvmlDeviceGetCount_v2", api->DeviceGetCount, &missing);
  Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", api->DeviceGetHandleByIndex, &missing);
  Resolve(handle, "nvmlDeviceGetName", api->DeviceGetName, &missing);
  Resolve(handle, "nvmlDeviceGetUUID", api->DeviceGetUUID, &missing);
  Resolve(handle, "nvmlDeviceGetUtilizationRates", api->DeviceGetUtilizationRates, &missing);
  Resolve(handle, "nvmlDeviceGetMemoryInfo", api->DeviceGetMemoryInfo, &missing);
  Resolve(handle, "nvmlDeviceGetPowerUsage", api->DeviceGetPowerUsage, &missing);
  Resolve(handle, "nvmlDeviceGetEnforcedPowerLimit", api->DeviceGetEnforcedPowerLimit, &missing);
  Resolve(handle, "nvmlDeviceGetTemperature", api->DeviceGetTemperature, &missing);
  std::string optional;
  Resolve(handle, "nvmlDeviceGetMemoryInfo_v2", api->DeviceGetMemoryInfoV2, &optional);
  if (!missing.empty()) {
    *error = library + " has no " + missing;
    dlclose(handle);
    return nullptr;
  }
  if (nvmlReturn_t r = api->Init(); r != NVML_SUCCESS) {
    const char* why = api->ErrorString(r);
    *error = std::string("nvmlInit failed: ") + (why != nullptr ? why : "unknown error");
    dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->Shutdown();
  dlclose(handle_);
}

std::vector<GpuReading> Nvml::Read() const {
  std::vector<GpuReading> out;
  unsigned int count = 0;
  if (api_->DeviceGetCount(&count) != NVML_SUCCESS) return out;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    if (api_->DeviceGetHandleByIndex(i, &device) != NVML_SUCCESS) continue;
    GpuReading g;
    g.index = i;
    char text[kUuidLength > kNameLength ? kUuidLength : kNameLength] = {};
    if (api_->DeviceGetUUID(device, text, kUuidLength) == NVML_SUCCESS) g.uuid = text;
    text[0] = '\0';
    if (api_->DeviceGetName(device, text, kNameLength) == NVML_SUCCESS) g.name = text;
    nvmlUtilization_t utilization{};
    if (api_->DeviceGetUtilizationRates(device, &utilization) == NVML_SUCCESS) {
      g.utilization_ratio = utilization.gpu / 100.0;
      g.memory_utilization_ratio = utilization.memory / 100.0;
    }
    nvmlMemory_v2_t memory_v2{};
    memory_v2.version = kMemoryV2Version;
    nvmlMemory_t memory{};
    if (api_->DeviceGetMemoryInfoV2 != nullptr &&
        api_->DeviceGetMemoryInfoV2(device, &memory_v2) == NVML_SUCCESS) {
      g.memory_used_bytes = static_cast<double>(memory_v2.used);
      g.memory_total_bytes = static_cast<double>(memory_v2.total);
    } else if (api_->DeviceGetMemoryInfo(device, &memory) == NVML_SUCCESS) {
      g.memory_used_bytes = static_cast<double>(memory.used);
      g.memory_total_bytes = static_cast<double>(memory.total);
    }
    unsigned int milliwatts = 0;
    if (api_->DeviceGetPowerUsage(device, &milliwatts) == NVML_SUCCESS)
      g.power_watts = milliwatts / 1000.0;
    if (api_->DeviceGetEnforcedPowerLimit(device, &milliwatts) == NVML_SUCCESS) {
      g.power_limit_watts = milliwatts / 1000.0;
    }
    unsigned int celsius = 0;
    if (api_->DeviceGetTemperature(device, NVML_TEMPERATURE_GPU, &celsius) == NVML_SUCCESS) {
      g.temperature_celsius = celsius;
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace gpucompute::metrics

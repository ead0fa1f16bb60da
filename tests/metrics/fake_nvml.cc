// A stand-in for libnvidia-ml.so.1 with two GPUs and fixed readings, so that loading
// NVML with dlopen and reading it through dlsym'ed entry points is tested on machines
// without a GPU. The second GPU reports no utilization, as a MIG instance does.
// FAKE_NVML_INIT_ERROR=N makes nvmlInit_v2 return N; FAKE_NVML_NO_MEMORY_V2 makes
// nvmlDeviceGetMemoryInfo_v2 fail, as on drivers before it.
#include <cstdlib>
#include <cstring>

extern "C" {

struct nvmlDevice_st {
  unsigned index;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};

namespace {
nvmlDevice_st devices[2] = {{0}, {1}};
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kInsufficientSize = 7;
int initialized = 0;

int CopyText(const char* text, char* out, unsigned length) {
  if (std::strlen(text) + 1 > length) return kInsufficientSize;
  std::strcpy(out, text);
  return kSuccess;
}
}  // namespace

int nvmlInit_v2() {
  if (const char* e = std::getenv("FAKE_NVML_INIT_ERROR"); e != nullptr) return std::atoi(e);
  ++initialized;
  return kSuccess;
}
int nvmlShutdown() {
  --initialized;
  return kSuccess;
}
const char* nvmlErrorString(int result) {
  return result == 9 ? "Driver Not Loaded" : "Unknown Error";
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_st** device) {
  if (index >= 2) return kInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}
int nvmlDeviceGetName(nvmlDevice_st* device, char* name, unsigned int length) {
  return CopyText(device->index == 0 ? "Fake GPU \"A\"" : "Fake GPU B", name, length);
}
int nvmlDeviceGetUUID(nvmlDevice_st* device, char* uuid, unsigned int length) {
  return CopyText(device->index == 0 ? "GPU-00000000-1111-2222-3333-444444444444"
                                     : "GPU-55555555-6666-7777-8888-999999999999",
                  uuid, length);
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_st* device, nvmlUtilization_t* utilization) {
  if (device->index == 1) return kNotSupported;
  utilization->gpu = 87;
  utilization->memory = 42;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_st* device, nvmlMemory_t* memory) {
  memory->total = 80ull << 30;
  memory->used = device->index == 0 ? 3ull << 30 : 1ull << 20;
  memory->free = memory->total - memory->used;
  return kSuccess;
}
// As NVML: `used` leaves out the 512 MiB the driver reserves, which v1 counts as used.
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_st* device, nvmlMemory_v2_t* memory) {
  constexpr unsigned int kVersion2 = sizeof(nvmlMemory_v2_t) | (2u << 24);
  if (std::getenv("FAKE_NVML_NO_MEMORY_V2") != nullptr) return kNotSupported;
  if (memory->version != kVersion2) return kInvalidArgument;
  memory->total = 80ull << 30;
  memory->reserved = 512ull << 20;
  memory->used = (device->index == 0 ? 3ull << 30 : 1ull << 20) - (512ull << 20);
  memory->free = memory->total - memory->used - memory->reserved;
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_st* device, unsigned int* milliwatts) {
  *milliwatts = device->index == 0 ? 312500 : 71250;
  return kSuccess;
}
int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_st*, unsigned int* milliwatts) {
  *milliwatts = 700000;
  return kSuccess;
}
int nvmlDeviceGetTemperature(nvmlDevice_st* device, int sensor, unsigned int* celsius) {
  if (sensor != 0) return kInvalidArgument;
  *celsius = device->index == 0 ? 61 : 35;
  return kSuccess;
}

}  // extern "C"

// What a backend module exports: the contract between the server and a backend built as a
// shared library (libgpucompute_cuda_backend.so) that the server opens with dlopen, as
// Triton opens its backends. The module exports exactly one symbol, the extern "C"
// function named kCudaModuleEntryPoint; everything else in it, including its own copies
// of the static libraries it shares with the server, is hidden.
//
// The table passes C++ types (ServerOptions, Backend, absl::Status) across the boundary,
// so a module works only with the server of the build tree that made it: `abi` carries
// that tree's random id (GPUCOMPUTE_BUILD_ID, chosen once at configure time), and the
// loader refuses a module whose `abi` differs from its own.
#ifndef GPUCOMPUTE_SERVER_CORE_BACKEND_MODULE_H_
#define GPUCOMPUTE_SERVER_CORE_BACKEND_MODULE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/backend.h"
#include "server/server.h"
#include "server/util/log.h"

#ifndef GPUCOMPUTE_BUILD_ID
#error "GPUCOMPUTE_BUILD_ID (a string literal) must be defined by the build"
#endif

namespace gpucompute {

inline constexpr char kBackendModuleAbi[] =
    "gpucompute-backend-module/2 build " GPUCOMPUTE_BUILD_ID;

// The program's Log (server/util/log.h).
using LogFunction = void (*)(LogLevel level, absl::string_view message,
                             absl::Span<const LogField> fields);

struct BackendModule {
  const char* abi;  // kBackendModuleAbi of the build that made the module
  // The devices the backend could use here: 0 without a driver or a device.
  int (*device_count)();
  // A backend over every device, configured from the CUDA options of `options`.
  // FAILED_PRECONDITION when there is no device.
  absl::StatusOr<std::unique_ptr<Backend>> (*create_backend)(const ServerOptions& options);
  // Hands the module the program's log: the module's own lines (failed CUDA calls, the
  // kernel cache) go through it, in the program's format and to its sink. The loader
  // calls it once, before anything else of the module.
  void (*set_log)(LogFunction log);
};

// The module's one exported function: `extern "C" const BackendModule* <this name>()`.
inline constexpr char kCudaModuleEntryPoint[] = "GpucomputeCudaBackendModule";
// The module's file name, looked for beside the program and in the build tree.
inline constexpr char kCudaModuleFileName[] = "libgpucompute_cuda_backend.so";

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_BACKEND_MODULE_H_

// Chooses and makes the backend a server runs on. The CPU backend is linked in; the CUDA
// backend is a module (libgpucompute_cuda_backend.so, server/core/backend_module.h) opened with
// dlopen only when the server runs on CUDA, so that the server program links no CUDA
// library and a server on the CPU starts without loading any.
#ifndef GPUCOMPUTE_SERVER_CORE_BACKEND_LOADER_H_
#define GPUCOMPUTE_SERVER_CORE_BACKEND_LOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/backend.h"
#include "server/server.h"

namespace gpucompute {

struct BackendModule;  // server/core/backend_module.h

// The backend options.backend names:
// - "cpu": the CPU backend.
// - "cuda": the CUDA module's backend. FAILED_PRECONDITION, saying what is missing, when
//   the NVIDIA driver (libcuda.so.1) cannot be loaded, the module cannot be found or
//   loaded, or there is no GPU.
// - "auto": CUDA when the driver loads, the module loads and reports a device; else the
//   CPU (logging on stderr why, when a driver is there but the module is not usable).
//   Without a driver the module is not opened at all.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ServerOptions& options);

// Where the CUDA module is looked for, in order: options.cuda_module alone when set; else
// $GPUCOMPUTE_CUDA_MODULE alone when set; else the program's directory (from
// /proc/self/exe), then the build tree that built this program.
std::vector<std::string> CudaModuleCandidates(const ServerOptions& options);

// Opens the first of CudaModuleCandidates that exists and checks that this build made it.
// FAILED_PRECONDITION naming the paths when none exists, or naming the one that does not
// load. The module stays loaded until the process ends.
absl::StatusOr<const BackendModule*> LoadCudaModule(const ServerOptions& options);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_BACKEND_LOADER_H_

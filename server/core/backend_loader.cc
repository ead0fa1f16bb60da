#include "server/core/backend_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/backend_module.h"
#include "server/cpu/cpu_backend.h"
#include "server/util/log.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

std::string DlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown error";
}

// Whether the NVIDIA driver is installed: its library loads. This maps the library only;
// counting devices would need cuInit, i.e. CUDA calls, which stay in the module
// (server/cuda/). Without a driver nothing can run on CUDA, so the module, with its
// hundreds of megabytes of CUDA libraries, is not opened at all.
absl::Status ProbeDriver() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver is not installed here (", DlError(), ")"));
  }
  dlclose(driver);  // the CUDA runtime opens it again when it is used
  return absl::OkStatus();
}

// Opens the module at `path` and checks that this build made it. The module is never
// closed: the backends it makes, their memory deleters and their threads run its code
// until the process ends.
absl::StatusOr<const BackendModule*> OpenCudaModule(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the CUDA backend module ", path, ": ", DlError()));
  }
  using EntryPoint = const BackendModule* (*)();
  auto entry = reinterpret_cast<EntryPoint>(dlsym(handle, kCudaModuleEntryPoint));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a gpucompute CUDA backend module: ", DlError()));
  }
  const BackendModule* module = entry();
  if (module == nullptr || std::strcmp(module->abi, kBackendModuleAbi) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA backend module ", path, " comes from another build (",
                     module == nullptr ? "none" : module->abi, ") than this program (",
                     kBackendModuleAbi, "); use the module built with it"));
  }
  module->set_log(&Log);
  return module;
}

std::unique_ptr<Backend> MakeCpuBackend(const ServerOptions& options) {
  return std::make_unique<cpu::CpuBackend>(static_cast<size_t>(std::max(0, options.cpu_threads)));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const ServerOptions& options) {
  if (absl::Status s = ProbeDriver(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--backend=cuda: ", s.message()));
  }
  ASSIGN_OR_RETURN(const BackendModule* module, LoadCudaModule(options));
  return module->create_backend(options);
}

}  // namespace

std::vector<std::string> CudaModuleCandidates(const ServerOptions& options) {
  if (!options.cuda_module.empty()) return {options.cuda_module};
  if (const char* path = std::getenv("GPUCOMPUTE_CUDA_MODULE"); path != nullptr && *path != '\0') {
    return {path};
  }
  std::vector<std::string> candidates;
  std::error_code ec;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((program.parent_path() / kCudaModuleFileName).string());
#if defined(GPUCOMPUTE_CUDA_MODULE_BUILD_PATH)
  // Test programs in build/tests/ find the module of their own build in build/server/.
  if (std::find(candidates.begin(), candidates.end(), GPUCOMPUTE_CUDA_MODULE_BUILD_PATH) ==
      candidates.end()) {
    candidates.push_back(GPUCOMPUTE_CUDA_MODULE_BUILD_PATH);
  }
#endif
  return candidates;
}

// A candidate that exists but does not load is an error rather than a reason to look
// further: its error is what the user must fix.
absl::StatusOr<const BackendModule*> LoadCudaModule(const ServerOptions& options) {
  const std::vector<std::string> candidates = CudaModuleCandidates(options);
  for (const std::string& path : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return OpenCudaModule(path);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot find the CUDA backend module (", kCudaModuleFileName, "); looked for ",
                   absl::StrJoin(candidates, ", "),
                   ". Name it with --cuda-module=PATH or GPUCOMPUTE_CUDA_MODULE"));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ServerOptions& options) {
  if (options.backend == "cpu") return MakeCpuBackend(options);
  if (options.backend == "cuda") return MakeCudaBackend(options);
  if (options.backend != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend '", options.backend, "' (use auto, cpu or cuda)"));
  }
  if (!ProbeDriver().ok()) return MakeCpuBackend(options);
  absl::StatusOr<const BackendModule*> module = LoadCudaModule(options);
  if (!module.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("the NVIDIA driver is installed but ",
                                         module.status().message(), "; serving on the CPU"));
    return MakeCpuBackend(options);
  }
  if ((*module)->device_count() == 0) return MakeCpuBackend(options);
  return (*module)->create_backend(options);
}

}  // namespace gpucompute

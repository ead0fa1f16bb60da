// How a server finds and opens its backend: the CPU backend by name, the CUDA backend from
// the module libgpucompute_cuda_backend.so, looked for where CudaModuleCandidates says.
// Where this build has the module, it is opened here even without a GPU (the CUDA
// libraries load; only the device count is 0).
#include "server/core/backend_loader.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "server/core/backend_module.h"

namespace gpucompute {
namespace {

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool DriverInstalled() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) dlclose(driver);
  return driver != nullptr;
}

TEST(BackendLoader, ModuleCandidatesAreTheFlagThenTheEnvironmentThenBesideTheProgram) {
  ServerOptions options;
  options.cuda_module = "/flag/libm.so";
  {
    ScopedEnv env("GPUCOMPUTE_CUDA_MODULE", "/env/libm.so");
    EXPECT_EQ(CudaModuleCandidates(options), std::vector<std::string>{"/flag/libm.so"});
    options.cuda_module.clear();
    EXPECT_EQ(CudaModuleCandidates(options), std::vector<std::string>{"/env/libm.so"});
  }
  ScopedEnv env("GPUCOMPUTE_CUDA_MODULE", nullptr);
  const std::vector<std::string> candidates = CudaModuleCandidates(options);
  ASSERT_FALSE(candidates.empty());
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe");
  EXPECT_EQ(candidates[0], (program.parent_path() / "libgpucompute_cuda_backend.so").string());
#if defined(GPUCOMPUTE_CUDA_MODULE_PATH)
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[1], GPUCOMPUTE_CUDA_MODULE_PATH);
#endif
}

TEST(BackendLoader, CpuByNameAndUnknownNamesRejected) {
  ServerOptions options;
  options.backend = "cpu";
  options.cpu_threads = 1;
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeBackend(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  options.backend = "tpu";
  EXPECT_EQ(MakeBackend(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendLoader, AutoWithoutDriverIsTheCpuEvenWithoutModule) {
  if (DriverInstalled()) GTEST_SKIP() << "the NVIDIA driver is installed here";
  ServerOptions options;
  options.backend = "auto";
  options.cpu_threads = 1;
  options.cuda_module = "/nonexistent/libgpucompute_cuda_backend.so";
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  options.backend = "cuda";
  EXPECT_EQ(MakeBackend(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

// LoadCudaModule(options) fails with FAILED_PRECONDITION and a message containing `text`.
void ExpectModuleFailure(const ServerOptions& options, const std::string& text) {
  absl::StatusOr<const BackendModule*> module = LoadCudaModule(options);
  EXPECT_EQ(module.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(module.status().message().find(text), std::string::npos) << module.status();
}

TEST(BackendLoader, MissingOrBrokenModuleIsAFailedPreconditionNamingIt) {
  ServerOptions options;
  options.cuda_module = "/nonexistent/libgpucompute_cuda_backend.so";
  ExpectModuleFailure(options, "cannot find the CUDA backend module");
  ExpectModuleFailure(options, options.cuda_module);

  options.cuda_module = (std::filesystem::temp_directory_path() /
                         ("gpucompute_not_a_module_" + std::to_string(getpid()) + ".so"))
                            .string();
  std::ofstream(options.cuda_module) << "not a shared library";
  ExpectModuleFailure(options, "cannot load the CUDA backend module " + options.cuda_module);
  std::filesystem::remove(options.cuda_module);
}

#if defined(GPUCOMPUTE_CUDA_MODULE_PATH)
TEST(BackendLoader, TheModuleOfThisBuildLoadsAndExportsOnlyItsEntryPoint) {
  ServerOptions options;
  options.cuda_module = GPUCOMPUTE_CUDA_MODULE_PATH;
  absl::StatusOr<const BackendModule*> module = LoadCudaModule(options);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_STREQ((*module)->abi, kBackendModuleAbi);
  const int devices = (*module)->device_count();
  EXPECT_GE(devices, 0);
  if (devices == 0) {
    EXPECT_EQ((*module)->create_backend(options).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }

  // Its own copies of the CUDA backend and of the CPU code stay hidden, so that they
  // neither bind to this program's copies nor stand in for them.
  void* handle = dlopen(GPUCOMPUTE_CUDA_MODULE_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << dlerror();
  EXPECT_NE(dlsym(handle, kCudaModuleEntryPoint), nullptr);
  for (const char* hidden : {"_ZN10gpucompute4cuda15CudaDeviceCountEv",
                             "_ZN10gpucompute4cuda17CreateCudaBackendERKNS0_18CudaBackendOptionsE",
                             "_ZN10gpucompute4expr15CanCastSameKindENS_5DTypeES1_",
                             "_ZN10gpucompute13BackendHealth13ReportFailureEN4absl7debian36StatusE"}) {
    EXPECT_EQ(dlsym(handle, hidden), nullptr) << hidden;
  }
  dlclose(handle);  // drops the reference NOLOAD took; the loader's keeps it loaded
}
#endif

}  // namespace
}  // namespace gpucompute

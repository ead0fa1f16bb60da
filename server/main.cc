// gpucompute-server: serves gpucompute.v1 over gRPC.
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
#include "server/server.h"

namespace {

constexpr char kUsage[] = R"(usage: gpucompute-server [flags]

Serves gpucompute.v1: arrays resident in device memory, asynchronous kernels on them.

  --backend=auto|cpu|cuda   compute backend; auto takes CUDA when a GPU is present
                            (default auto)
  --listen=HOST:PORT        address to listen on (default 127.0.0.1:50051)
  --memory-limit=SIZE       bytes buffers may hold in all, e.g. 8GiB, 512MiB;
                            0 picks a default: half of the memory for the CPU,
                            each GPU's memory less max(5%, 256MiB) for CUDA
                            (default 0)
  --cpu-threads=N           CPU backend worker threads; 0 is one per hardware
                            thread (default 0)
  --default-device=N        device for buffers and streams whose request names
                            none (default 0)
  --pool-initial=SIZE       CUDA: bytes each device's memory pool reserves at
                            start (default 0)
  --pool-release-threshold=SIZE|keep
                            CUDA: bytes each pool keeps reserved when memory is
                            freed; keep (the default) keeps everything, 0 returns
                            freed memory to the device
  --kernel-cache-dir=DIR    CUDA: where compiled kernels are cached across
                            restarts; "" or none disables the cache (default
                            $GPUCOMPUTE_KERNEL_CACHE, else
                            $XDG_CACHE_HOME/gpucompute/kernels, else
                            ~/.cache/gpucompute/kernels)
  --cuda-module=PATH        the CUDA backend module, opened only to run on CUDA
                            (default $GPUCOMPUTE_CUDA_MODULE, else
                            libgpucompute_cuda_backend.so beside this program,
                            else the one of the build tree that built it)
  --metrics-listen=HOST:PORT
                            serve Prometheus metrics on http://HOST:PORT/metrics
                            (default: none)
  --allow-shared-memory     let clients register POSIX shared-memory regions and
                            copy between them and buffers (SharedMemoryService);
                            only for trusted clients on this host (default off)
  --allow-cuda-ipc          let clients export buffers as CUDA IPC handles and
                            register their own device memory as regions (CUDA
                            backend); only for trusted clients on this host
                            (default off)
  --region-idle-timeout=SECONDS
                            release a shared-memory region or export unused this
                            long; 0 never does (default 600)
  --help                    print this text

SIGTERM or SIGINT stops the server (exit status 0), also while it starts.
)";

// Blocks SIGINT and SIGTERM in the calling thread and returns them. Called first thing in
// main, before any thread exists: every thread started later (gRPC's, the backend's, the
// CUDA runtime's) inherits the mask, so none of them can take the signals' default action,
// and a signal that comes before the watcher below runs stays pending until it does.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Takes the blocked stop signals with sigwait on a thread of its own, so that nothing runs
// in a signal handler, and shuts the server down once it serves. A signal that comes while
// the server starts is remembered: main sees it when Server::Start returns and stops at
// once. Start is not interrupted (nor the process ended under it): on CUDA it sets up the
// devices and warms cuBLAS, seconds at most, and letting it finish means one way out, in
// which the backend releases the devices in order and the process exits 0.
class StopSignalWatcher {
 public:
  explicit StopSignalWatcher(const sigset_t& signals)
      : signals_(signals), thread_([this] { Run(); }) {}
  ~StopSignalWatcher() { Stop(); }

  // From now on a signal shuts `server` down; false, leaving it alone, when one has
  // already come.
  bool Serve(gpucompute::Server* server) {
    std::lock_guard lock(mu_);
    if (signalled_) return false;
    server_ = server;
    return true;
  }

  // Ends the watching thread; signals that come later are left pending. Called before the
  // server is destroyed.
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      server_ = nullptr;
    }
    // Blocked everywhere, the signal stays pending on the thread until its sigwait.
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

 private:
  void Run() {
    for (;;) {
      int signal = 0;
      if (sigwait(&signals_, &signal) != 0) continue;
      std::lock_guard lock(mu_);
      if (stopping_) return;
      if (signalled_) continue;  // the first one is already stopping the server
      signalled_ = true;
      std::fprintf(stderr, "gpucompute-server: %s, stopping\n",
                   signal == SIGINT ? "SIGINT" : "SIGTERM");
      // Under mu_, so that main cannot destroy the server meanwhile (it calls Stop first).
      if (server_ != nullptr) server_->Shutdown();
    }
  }

  const sigset_t signals_;
  std::mutex mu_;
  gpucompute::Server* server_ = nullptr;  // guarded by mu_
  bool signalled_ = false;                // guarded by mu_
  bool stopping_ = false;                 // guarded by mu_
  std::thread thread_;                    // last: it runs on the members above
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "gpucompute-server: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const sigset_t stop_signals = BlockStopSignals();
  gpucompute::ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
    // Switches: alone, or =true / =false.
    if (name == "--allow-shared-memory" || name == "--allow-cuda-ipc") {
      const std::string_view text = eq == std::string_view::npos ? "true" : arg.substr(eq + 1);
      bool on = false;
      if (!absl::SimpleAtob(absl::string_view(text.data(), text.size()), &on)) {
        return UsageError(std::string(name) + " takes no value, or =true or =false");
      }
      (name == "--allow-shared-memory" ? options.allow_shared_memory : options.allow_cuda_ipc) = on;
      continue;
    }
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return UsageError(std::string(name) + " needs a value");
    }
    if (name == "--backend") {
      options.backend = value;
    } else if (name == "--listen") {
      options.listen = value;
    } else if (name == "--memory-limit") {
      absl::StatusOr<uint64_t> limit = gpucompute::ParseByteSize(value);
      if (!limit.ok())
        return UsageError("--memory-limit: " + std::string(limit.status().message()));
      options.memory_limit_bytes = *limit;
    } else if (name == "--cpu-threads") {
      if (!absl::SimpleAtoi(value, &options.cpu_threads) || options.cpu_threads < 0) {
        return UsageError("--cpu-threads needs a non-negative integer");
      }
    } else if (name == "--default-device") {
      if (!absl::SimpleAtoi(value, &options.default_device) || options.default_device < 0) {
        return UsageError("--default-device needs a non-negative integer");
      }
    } else if (name == "--pool-initial") {
      absl::StatusOr<uint64_t> bytes = gpucompute::ParseByteSize(value);
      if (!bytes.ok())
        return UsageError("--pool-initial: " + std::string(bytes.status().message()));
      options.pool_initial_bytes = *bytes;
    } else if (name == "--pool-release-threshold") {
      if (value == "keep" || value == "max") {
        options.pool_release_threshold_bytes = UINT64_MAX;
      } else {
        absl::StatusOr<uint64_t> bytes = gpucompute::ParseByteSize(value);
        if (!bytes.ok()) {
          return UsageError("--pool-release-threshold: " + std::string(bytes.status().message()) +
                            " (or 'keep')");
        }
        options.pool_release_threshold_bytes = *bytes;
      }
    } else if (name == "--metrics-listen") {
      options.metrics_listen = value;
    } else if (name == "--kernel-cache-dir") {
      options.kernel_cache_dir = value == "none" ? std::string() : value;
    } else if (name == "--region-idle-timeout") {
      if (!absl::SimpleAtod(value, &options.region_idle_timeout_seconds) ||
          !(options.region_idle_timeout_seconds >= 0)) {
        return UsageError("--region-idle-timeout needs a non-negative number of seconds");
      }
    } else if (name == "--cuda-module") {
      options.cuda_module = value;
    } else {
      return UsageError("unknown flag " + std::string(name));
    }
  }

  StopSignalWatcher watcher(stop_signals);
  absl::StatusOr<std::unique_ptr<gpucompute::Server>> server = gpucompute::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gpucompute-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  if (!watcher.Serve(server->get())) return 0;  // stopped while it started
  std::fprintf(stderr, "gpucompute-server: %s backend, listening on port %d\n",
               (*server)->backend_name().c_str(), (*server)->port());
  if ((*server)->metrics_port() != 0) {
    std::fprintf(stderr, "gpucompute-server: metrics on port %d, path /metrics\n",
                 (*server)->metrics_port());
  }
  (*server)->Wait();
  watcher.Stop();
  return 0;
}

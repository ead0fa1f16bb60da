// gpucompute-server: serves gpucompute.v1 over gRPC.
#include <csignal>
#include <cstdio>
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
                            0 picks half of the device's memory (default 0)
  --cpu-threads=N           CPU backend worker threads; 0 is one per hardware
                            thread (default 0)
  --help                    print this text
)";

gpucompute::Server* g_server = nullptr;

void OnSignal(int) {
  // Shutdown takes locks, so it runs on a thread of its own, not in the handler.
  if (g_server != nullptr) std::thread([] { g_server->Shutdown(); }).detach();
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "gpucompute-server: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  gpucompute::ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
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
      if (!limit.ok()) return UsageError("--memory-limit: " + std::string(limit.status().message()));
      options.memory_limit_bytes = *limit;
    } else if (name == "--cpu-threads") {
      if (!absl::SimpleAtoi(value, &options.cpu_threads) || options.cpu_threads < 0) {
        return UsageError("--cpu-threads needs a non-negative integer");
      }
    } else {
      return UsageError("unknown flag " + std::string(name));
    }
  }

  absl::StatusOr<std::unique_ptr<gpucompute::Server>> server = gpucompute::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gpucompute-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  g_server = server->get();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::fprintf(stderr, "gpucompute-server: %s backend, listening on port %d\n", (*server)->backend_name().c_str(),
               (*server)->port());
  (*server)->Wait();
  g_server = nullptr;
  return 0;
}

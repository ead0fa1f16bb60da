// Assembles a gpucompute server: backend, executor, registry and the gRPC services,
// with the standard health checking service and server reflection.
#ifndef GPUCOMPUTE_SERVER_SERVER_H_
#define GPUCOMPUTE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gpucompute {

struct ServerOptions {
  // host:port; port 0 picks a free one (see Server::port).
  std::string listen = "127.0.0.1:50051";
  // "auto" (CUDA when a GPU is present), "cpu" or "cuda".
  std::string backend = "auto";
  // Bytes buffers may hold in all; 0 picks a default from the device's memory.
  uint64_t memory_limit_bytes = 0;
  // CPU backend worker threads; 0 means one per hardware thread.
  int cpu_threads = 0;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // shuts down, then waits for queued work

  int port() const;
  const std::string& backend_name() const;
  // Blocks until Shutdown is called from another thread.
  void Wait();
  void Shutdown();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses "1073741824", "512MiB", "8GiB", "1.5GB" and the like into bytes.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVER_H_

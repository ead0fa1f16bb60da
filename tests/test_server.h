// An in-process gpucompute server on a loopback port (CPU backend unless the environment's
// GPUCOMPUTE_TEST_BACKEND names another), and clients
// connected to it over a real socket, for end-to-end tests.
#ifndef GPUCOMPUTE_TESTS_TEST_SERVER_H_
#define GPUCOMPUTE_TESTS_TEST_SERVER_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "server/backend.h"
#include "server/server.h"

namespace gpucompute::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// Tests start and destroy their own servers and clients. When the last gRPC object goes,
// grpc_shutdown() joins gRPC's executor threads, which can sit in a poll for up to ~10 s
// (gRPC 1.51 under load: a teardown stalled 10-17 s in grpc_core::Executor::ShutdownAll).
// Holding one grpc_init() reference for the whole run keeps gRPC up between tests.
class GrpcLibraryHold : public ::testing::Environment {
 public:
  void SetUp() override { grpc_init(); }
  void TearDown() override { grpc_shutdown(); }
};
[[maybe_unused]] inline ::testing::Environment* const kGrpcHold =
    ::testing::AddGlobalTestEnvironment(new GrpcLibraryHold);

// The backend the end-to-end suites run on: GPUCOMPUTE_TEST_BACKEND, else "cpu".
inline std::string TestBackendName() {
  const char* name = std::getenv("GPUCOMPUTE_TEST_BACKEND");
  return name != nullptr && *name != '\0' ? name : "cpu";
}

class TestServer {
 public:
  // Starts a server on 127.0.0.1 with a free port. Returns null (after recording a
  // test failure) if it cannot start.
  static std::unique_ptr<TestServer> Start(uint64_t memory_limit_bytes = 256 * kMiB,
                                           int cpu_threads = 2) {
    return StartWith(nullptr, memory_limit_bytes, cpu_threads);
  }

  // As Start, serving `backend` when it is not null (e.g. a wrapper of the CPU backend
  // that injects failures).
  static std::unique_ptr<TestServer> StartWith(std::unique_ptr<Backend> backend,
                                               uint64_t memory_limit_bytes = 256 * kMiB,
                                               int cpu_threads = 2) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    // GPUCOMPUTE_TEST_BACKEND=cuda runs the end-to-end suites on a GPU.
    options.backend = TestBackendName();
    options.kernel_cache_dir = "";
    options.memory_limit_bytes = memory_limit_bytes;
    options.cpu_threads = cpu_threads;
    absl::StatusOr<std::unique_ptr<Server>> server =
        backend == nullptr ? Server::Start(options) : Server::Start(options, std::move(backend));
    if (!server.ok()) {
      ADD_FAILURE() << "cannot start the server: " << server.status();
      return nullptr;
    }
    return std::unique_ptr<TestServer>(
        new TestServer(*std::move(server), memory_limit_bytes, cpu_threads));
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", server_->port()); }
  Server& server() { return *server_; }
  uint64_t memory_limit_bytes() const { return memory_limit_bytes_; }
  int cpu_threads() const { return cpu_threads_; }

  // A client of the library. Unary calls get a generous deadline so a hung server
  // fails the test instead of hanging it.
  std::unique_ptr<Client> Connect(const std::string& client_name = "",
                                  size_t chunk_bytes = 0) const {
    ClientOptions options;
    options.target = target();
    options.client_name = client_name;
    options.chunk_bytes = chunk_bytes;
    options.timeout = absl::Seconds(120);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) {
      ADD_FAILURE() << "cannot connect: " << client.status();
      return nullptr;
    }
    return *std::move(client);
  }

  // A raw channel, for requests the client library would never send.
  std::shared_ptr<grpc::Channel> RawChannel() const {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(128 << 20);
    arguments.SetMaxSendMessageSize(128 << 20);
    return grpc::CreateCustomChannel(target(), grpc::InsecureChannelCredentials(), arguments);
  }

 private:
  TestServer(std::unique_ptr<Server> server, uint64_t limit, int threads)
      : server_(std::move(server)), memory_limit_bytes_(limit), cpu_threads_(threads) {}

  std::unique_ptr<Server> server_;
  uint64_t memory_limit_bytes_;
  int cpu_threads_;
};

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_TEST_SERVER_H_

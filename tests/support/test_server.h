// An in-process gpucompute server on a loopback port (CPU backend unless the environment's
// GPUCOMPUTE_TEST_BACKEND names another), clients connected to it over a real socket, and
// the helpers every end-to-end test uses: typed uploads and downloads, and the snapshot of
// what a rejected request must leave as it was.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_TEST_SERVER_H_
#define GPUCOMPUTE_TESTS_SUPPORT_TEST_SERVER_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "server/core/backend.h"
#include "server/server.h"
#include "tests/support/test_util.h"

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
  // that injects failures), with `configure` adjusting the options last (e.g. to enable a
  // service).
  static std::unique_ptr<TestServer> StartWith(
      std::unique_ptr<Backend> backend, uint64_t memory_limit_bytes = 256 * kMiB,
      int cpu_threads = 2, const std::function<void(ServerOptions&)>& configure = {}) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    // GPUCOMPUTE_TEST_BACKEND=cuda runs the end-to-end suites on a GPU.
    options.backend = TestBackendName();
    options.kernel_cache_dir = "";
    options.memory_limit_bytes = memory_limit_bytes;
    options.cpu_threads = cpu_threads;
    // A backend a test wraps counts or fails calls; the measurement would add some.
    options.measure_copy_ceiling = backend == nullptr;
    if (configure) configure(options);
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

  // A client of the library with `configure` adjusting its options last (a token, TLS).
  // Returns the error of Client::Connect, if any.
  absl::StatusOr<std::unique_ptr<Client>> ConnectWith(
      const std::function<void(ClientOptions&)>& configure) const {
    ClientOptions options;
    options.target = target();
    options.timeout = absl::Seconds(120);
    configure(options);
    return Client::Connect(options);
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

// The API's dtype of the C++ element type T; bool arrays are uint8_t.
template <typename T>
constexpr v1::DType ProtoDType() {
  if constexpr (std::is_same_v<T, float>) return v1::DTYPE_FLOAT32;
  if constexpr (std::is_same_v<T, double>) return v1::DTYPE_FLOAT64;
  if constexpr (std::is_same_v<T, int32_t>) return v1::DTYPE_INT32;
  if constexpr (std::is_same_v<T, int64_t>) return v1::DTYPE_INT64;
  if constexpr (std::is_same_v<T, uint8_t>) return v1::DTYPE_BOOL;
  return v1::DTYPE_UNSPECIFIED;
}

// Creates a buffer holding `data` with `shape` (default: 1-D) through Client::Upload.
template <typename T>
absl::StatusOr<v1::BufferInfo> UploadArray(Client& client, const std::vector<T>& data,
                                           std::vector<uint64_t> shape = {},
                                           v1::Layout layout = v1::LAYOUT_C,
                                           const std::string& name = "") {
  if (shape.empty()) shape = {data.size()};
  v1::UploadHeader header;
  v1::CreateBufferRequest* create = header.mutable_create();
  create->set_dtype(ProtoDType<T>());
  for (uint64_t d : shape) create->add_shape(d);
  create->set_layout(layout);
  create->set_name(name);
  absl::StatusOr<v1::UploadResponse> response =
      client.Upload(header, std::as_bytes(std::span<const T>(data)));
  if (!response.ok()) return response.status();
  return response->buffer();
}

// Downloads `size` bytes (0: to the end) of `buffer` from `offset`, in messages of at most
// `chunk_bytes` (0: the server's choice). An answer of another length than the range asked
// for is an INTERNAL error, so callers compare contents only.
inline absl::StatusOr<std::string> DownloadBytes(Client& client, std::string_view buffer,
                                                 uint64_t offset = 0, uint64_t size = 0,
                                                 uint32_t chunk_bytes = 0) {
  v1::DownloadRequest request;
  request.set_buffer(std::string(buffer));
  request.set_offset_bytes(offset);
  request.set_size_bytes(size);
  request.set_chunk_bytes(chunk_bytes);
  std::string data;
  absl::StatusOr<v1::DownloadResponse> response = client.Download(request, &data);
  if (!response.ok()) return response.status();
  const uint64_t total = response->buffer().size_bytes();
  const uint64_t want = size != 0 ? size : (offset <= total ? total - offset : 0);
  if (data.size() != want) {
    return absl::InternalError(absl::StrCat("downloaded ", data.size(), " bytes of ", want));
  }
  return data;
}

template <typename T>
absl::StatusOr<std::vector<T>> DownloadArray(Client& client, std::string_view buffer) {
  absl::StatusOr<std::string> bytes = DownloadBytes(client, buffer);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() % sizeof(T) != 0) {
    return absl::InternalError(
        absl::StrCat(bytes->size(), " bytes is no whole number of elements"));
  }
  std::vector<T> out(bytes->size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

// The header of an upload that creates a 1-D float64 buffer of `elements`, named `name`
// (empty: unnamed).
inline v1::UploadHeader CreateFloat64(uint64_t elements, const std::string& name = "") {
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  header.mutable_create()->add_shape(elements);
  if (!name.empty()) header.mutable_create()->set_name(name);
  return header;
}

// The bytes of `s`, as Client::Upload takes them.
inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// The server's memory in use (ServerInfo.memory_used_bytes); all ones if it cannot be read.
inline uint64_t MemoryUsed(Client& client) {
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  EXPECT_OK(info);
  return info.ok() ? info->memory_used_bytes() : ~uint64_t{0};
}

// Polls until the server's memory in use equals `expected` or `timeout` passes (memory a
// failed transfer held goes back once its last copy is done); returns the last value seen.
inline uint64_t WaitForMemoryUsed(Client& client, uint64_t expected,
                                  absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t used = MemoryUsed(client);
  while (used != expected && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    used = MemoryUsed(client);
  }
  return used;
}

// Polls `done` every 5 ms until it holds or `timeout` passes; then asks it once more.
inline bool Eventually(const std::function<bool()>& done,
                       absl::Duration timeout = absl::Seconds(10)) {
  for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

// What a rejected request must leave as it was: the calling client's buffers (id, name and
// size, in listing order) and the server-wide memory use and buffer count.
struct Snapshot {
  std::vector<std::string> buffers;  // "id/name/size_bytes"
  uint64_t total_bytes = 0;
  uint64_t memory_used_bytes = 0;
  uint64_t buffer_count = 0;
  bool operator==(const Snapshot&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  os << "{buffers:";
  for (const std::string& b : s.buffers) os << " " << b;
  return os << "; total_bytes " << s.total_bytes << "; memory_used " << s.memory_used_bytes
            << "; buffer_count " << s.buffer_count << "}";
}

inline Snapshot TakeSnapshot(Client& client) {
  Snapshot s;
  absl::StatusOr<v1::ListBuffersResponse> list = client.ListBuffers();
  EXPECT_OK(list);
  if (list.ok()) {
    for (const v1::BufferInfo& b : list->buffers()) {
      s.buffers.push_back(absl::StrCat(b.id(), "/", b.name(), "/", b.size_bytes()));
    }
    s.total_bytes = list->total_bytes();
  }
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  EXPECT_OK(info);
  if (info.ok()) {
    s.memory_used_bytes = info->memory_used_bytes();
    s.buffer_count = info->buffer_count();
  }
  return s;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_TEST_SERVER_H_

// A sticky CUDA error (an illegal address) in a real server on the CUDA backend: the
// health service turns NOT_SERVING, work is refused with UNAVAILABLE, and read-only calls
// still answer. A program of its own, because a sticky error ruins the CUDA context of
// the whole process. Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "server/core/backend.h"
#include "server/cuda/cuda_backend.h"
#include "server/server.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

// grpc.health.v1.Health/Check of the whole server: the serving status number
// (1 SERVING, 2 NOT_SERVING), or -1 when the call fails.
int HealthStatus(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status}: field 1, varint.
  if (bytes.size() != 2 || bytes[0] != '\x08') return -1;
  return bytes[1];
}

TEST(CudaFailure, StickyErrorStopsTheServerServing) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device here";
  // The backend of the static library, not the server's module: InjectIllegalAddressForTesting
  // recognises only backends of its own copy of the CUDA backend.
  cuda::CudaBackendOptions backend_options;
  backend_options.kernel_cache_dir = "";
  ASSIGN_OR_FAIL(std::unique_ptr<Backend> backend, cuda::CreateCudaBackend(backend_options));
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  ASSIGN_OR_FAIL(std::unique_ptr<Server> server, Server::Start(options, std::move(backend)));
  const std::string target = absl::StrCat("127.0.0.1:", server->port());

  ClientOptions client_options;
  client_options.target = target;
  client_options.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(client_options);
  ASSERT_OK(client);
  Client& c = **client;

  v1::SubmitRequest fill =
      Random(v1::DISTRIBUTION_UNIFORM, {1000}, v1::DTYPE_FLOAT32, 1, NewOutput("x"));
  fill.set_wait(true);
  absl::StatusOr<v1::Operation> op = c.Submit(fill);
  ASSERT_OK(op);
  ASSERT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED) << op->error_message();
  EXPECT_EQ(HealthStatus(target), 1);

  EXPECT_FALSE(cuda::InjectIllegalAddressForTesting(server->backend(), 0).ok());
  EXPECT_FALSE(server->backend().health().ok());

  EXPECT_EQ(HealthStatus(target), 2);
  v1::SubmitRequest sum = Reduce(v1::REDUCE_KIND_SUM, "x");
  sum.set_wait(true);
  EXPECT_EQ(c.Submit(sum).status().code(), absl::StatusCode::kUnavailable);
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_FLOAT32);
  create.add_shape(10);
  EXPECT_EQ(c.CreateBuffer(create).status().code(), absl::StatusCode::kUnavailable);
  v1::DownloadRequest download;
  download.set_buffer("x");
  EXPECT_EQ(c.Download(download, [](uint64_t, std::string_view) { return absl::OkStatus(); })
                .status()
                .code(),
            absl::StatusCode::kUnavailable);

  // Read-only calls still answer, and say why the server stopped serving.
  absl::StatusOr<v1::ServerInfo> info = c.GetServerInfo();
  ASSERT_OK(info);
  EXPECT_NE(info->backend_error().find("cudaErrorIllegalAddress"), std::string::npos)
      << info->backend_error();
  absl::StatusOr<v1::ListBuffersResponse> buffers = c.ListBuffers();
  ASSERT_OK(buffers);
  EXPECT_EQ(buffers->buffers_size(), 1);
}

}  // namespace
}  // namespace gpucompute

// CUDA IPC and pinned shared memory on a GPU, across two processes as CUDA IPC requires:
// the gpucompute-server program (on CUDA, with --allow-cuda-ipc and --allow-shared-memory)
// and this test, which maps the server's exported buffers and exports its own allocation.
// Skips where there is no GPU.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/shared_memory.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/cuda_check.h"
#include "tests/support/test_server.h"

extern char** environ;

namespace gpucompute::testing {
namespace {

#define ASSERT_CUDA(call) ASSERT_OK(cuda::CudaStatus((call), #call, __FILE__, __LINE__))

// The server program on CUDA; its stderr goes to a file the test reads the port from.
class ServerProgram {
 public:
  ServerProgram() {
    const char* bin = std::getenv("GPUCOMPUTE_SERVER_BIN");
    const std::string program = bin != nullptr && *bin != '\0' ? bin : GPUCOMPUTE_SERVER_BIN;
    log_ = "/tmp/gpucompute_cuda_ipc_test_" + std::to_string(getpid()) + ".log";
    std::vector<std::string> args = {program,
                                     "--backend=cuda",
                                     "--listen=127.0.0.1:0",
                                     "--allow-cuda-ipc",
                                     "--allow-shared-memory",
                                     "--kernel-cache-dir=none"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
         pid_ > 0 && absl::Now() < deadline && port_ == 0;) {
      std::ifstream in(log_);
      const std::string text(std::istreambuf_iterator<char>(in), {});
      const size_t at = text.find("listening on port ");
      if (at != std::string::npos) port_ = std::atoi(text.c_str() + at + 18);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  ~ServerProgram() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(log_.c_str());
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

class CudaIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device here";
    server_ = std::make_unique<ServerProgram>();
    ASSERT_NE(server_->port(), 0) << "the server did not start on CUDA";
    ClientOptions options;
    options.target = "127.0.0.1:" + std::to_string(server_->port());
    options.client_name = "ipc-test";
    options.timeout = absl::Seconds(120);
    ASSIGN_OR_FAIL(client_, Client::Connect(options));
    stub_ = v1::SharedMemoryService::NewStub(client_->channel());
  }

  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (v1::SharedMemoryService::Stub::*method)(
                                    grpc::ClientContext*, const Request&, Response*),
                                const Request& request) {
    Response response;
    grpc::Status status =
        (stub_.get()->*method)(client_->NewContext(true).get(), request, &response);
    if (!status.ok()) return StatusOf(status);
    return response;
  }

  std::unique_ptr<ServerProgram> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::SharedMemoryService::Stub> stub_;
};

TEST_F(CudaIpcTest, ExportedBufferMapsInAnotherProcess) {
  const size_t n = 1 << 20;
  v1::ExportBufferRequest request;
  v1::CreateBufferRequest* create = request.mutable_create();
  create->set_dtype(v1::DTYPE_FLOAT64);
  create->add_shape(n);
  create->set_name("exported");
  create->mutable_fill()->set_float_value(2.5);
  ASSIGN_OR_FAIL(v1::ExportBufferResponse exported,
                 Call(&v1::SharedMemoryService::Stub::ExportBuffer, request));
  ASSERT_EQ(exported.handle().size(), sizeof(cudaIpcMemHandle_t));
  EXPECT_EQ(exported.region().kind(), v1::REGION_KIND_EXPORT);
  EXPECT_EQ(exported.region().buffer(), exported.buffer().id());
  ASSERT_OK(client_->SynchronizeStream(""));  // the fill

  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, exported.handle().data(), sizeof(handle));
  ASSERT_CUDA(cudaSetDevice(exported.buffer().device()));
  void* mapped = nullptr;
  ASSERT_CUDA(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
  std::vector<double> seen(n);
  ASSERT_CUDA(cudaMemcpy(seen.data(), mapped, n * 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen, std::vector<double>(n, 2.5)) << "the mapping does not show the server's fill";

  // Written here, read by the server: the same memory, no copy.
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 1);
  ASSERT_CUDA(cudaMemcpy(mapped, x.data(), n * 8, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "exported"));
  EXPECT_EQ(back, x);
  ASSERT_CUDA(cudaIpcCloseMemHandle(mapped));

  // Pool buffers are not exportable.
  ASSIGN_OR_FAIL(v1::BufferInfo pooled, UploadArray(*client_, x));
  v1::ExportBufferRequest existing;
  existing.set_buffer(pooled.id());
  absl::Status status = Call(&v1::SharedMemoryService::Stub::ExportBuffer, existing).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;

  v1::UnregisterRegionRequest release;
  release.set_region_id(exported.region().id());
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::UnregisterRegion, release));
}

// An exported buffer created without fill is zeros by the time its handle is answered,
// though the memory last held a freed exported buffer's values: a process that maps it at
// once, with no SynchronizeStream, sees zeros, as a download does.
TEST_F(CudaIpcTest, ExportedBufferWithoutFillIsZerosWhenAnswered) {
  const size_t n = 1 << 22;
  auto export_new = [&](const char* name, bool fill) -> absl::StatusOr<v1::ExportBufferResponse> {
    v1::ExportBufferRequest request;
    v1::CreateBufferRequest* create = request.mutable_create();
    create->set_dtype(v1::DTYPE_FLOAT64);
    create->add_shape(n);
    create->set_name(name);
    if (fill) create->mutable_fill()->set_float_value(7.25);
    return Call(&v1::SharedMemoryService::Stub::ExportBuffer, request);
  };
  ASSIGN_OR_FAIL(v1::ExportBufferResponse freed, export_new("freed", true));
  ASSERT_OK(client_->SynchronizeStream(""));
  v1::UnregisterRegionRequest release;
  release.set_region_id(freed.region().id());
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::UnregisterRegion, release));
  ASSERT_OK(client_->DeleteBuffer("freed"));

  ASSIGN_OR_FAIL(v1::ExportBufferResponse exported, export_new("fresh", false));
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, exported.handle().data(), sizeof(handle));
  ASSERT_CUDA(cudaSetDevice(exported.buffer().device()));
  void* mapped = nullptr;
  ASSERT_CUDA(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
  std::vector<double> seen(n, -1.0);
  ASSERT_CUDA(cudaMemcpy(seen.data(), mapped, n * 8, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaIpcCloseMemHandle(mapped));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0.0), static_cast<std::ptrdiff_t>(n))
      << "the mapping shows " << seen.front() << " first";
  ASSIGN_OR_FAIL(std::vector<double> down, DownloadArray<double>(*client_, "fresh"));
  EXPECT_EQ(down, std::vector<double>(n, 0.0));
  release.set_region_id(exported.region().id());
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::UnregisterRegion, release));
}

TEST_F(CudaIpcTest, OwnAllocationIsSourceAndTargetOfCopies) {
  const size_t n = (1 << 20) + 3;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 2);
  ASSERT_CUDA(cudaSetDevice(0));
  void* mine = nullptr;
  ASSERT_CUDA(cudaMalloc(&mine, n * 8));
  ASSERT_CUDA(cudaMemcpy(mine, x.data(), n * 8, cudaMemcpyHostToDevice));
  cudaIpcMemHandle_t handle;
  ASSERT_CUDA(cudaIpcGetMemHandle(&handle, mine));

  v1::RegisterRegionRequest request;
  request.mutable_cuda_ipc()->set_handle(
      std::string(reinterpret_cast<char*>(&handle), sizeof(handle)));
  request.mutable_cuda_ipc()->set_device(0);
  // Larger than the allocation: the server asks the driver rather than trusting the size.
  request.mutable_cuda_ipc()->set_size_bytes(uint64_t{1} << 40);
  absl::Status too_big = Call(&v1::SharedMemoryService::Stub::RegisterRegion, request).status();
  EXPECT_TRUE(absl::IsInvalidArgument(too_big)) << too_big;
  request.mutable_cuda_ipc()->set_size_bytes(n * 8);
  ASSIGN_OR_FAIL(v1::RegionInfo region,
                 Call(&v1::SharedMemoryService::Stub::RegisterRegion, request));
  EXPECT_EQ(region.kind(), v1::REGION_KIND_CUDA_IPC);

  v1::CopyFromRegionRequest in;
  in.set_region_id(region.id());
  in.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  in.mutable_create()->add_shape(n);
  in.mutable_create()->set_name("imported");
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::CopyFromRegion, in));
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "imported"));
  EXPECT_EQ(back, x);

  // Not waited for: the copy out is ordered after it.
  ASSERT_OK(client_->Submit(
      Elementwise("x * 3", {{"x", BufferOperand("imported")}}, NewOutput("tripled"))));
  v1::CopyToRegionRequest out;
  out.set_buffer("tripled");
  out.set_region_id(region.id());
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::CopyToRegion, out));
  std::vector<double> tripled(n);
  ASSERT_CUDA(cudaMemcpy(tripled.data(), mine, n * 8, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(tripled[i], x[i] * 3) << "at " << i;

  v1::UnregisterRegionRequest release;
  release.set_region_id(region.id());
  ASSERT_OK(Call(&v1::SharedMemoryService::Stub::UnregisterRegion, release));
  ASSERT_CUDA(cudaFree(mine));
}

TEST_F(CudaIpcTest, SharedMemoryTransfersThroughPinnedRegions) {
  const size_t n = (8 << 20) + 5;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 3);
  SharedMemoryTransport shm(*client_);
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  header.mutable_create()->add_shape(n);
  header.mutable_create()->set_name("pinned");
  ASSERT_OK(shm.Upload(header, std::as_bytes(std::span<const double>(x))));
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "pinned"));
  EXPECT_EQ(back, x);
  std::string bytes;
  v1::DownloadRequest request;
  request.set_buffer("pinned");
  ASSERT_OK(shm.Download(request, &bytes));
  ASSERT_EQ(bytes.size(), n * 8);
  EXPECT_EQ(std::memcmp(bytes.data(), x.data(), n * 8), 0);
}

}  // namespace
}  // namespace gpucompute::testing

#include "server/server.h"

#include <cmath>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/cpu/cpu_backend.h"
#include "server/service/services.h"

namespace gpucompute {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  size_t split = t.find_first_not_of("0123456789.");
  const std::string number = t.substr(0, split);
  const std::string unit = split == std::string::npos ? "" : t.substr(split);
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !(value >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a byte size"));
  }
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"b", 1},          {"k", 1e3},        {"kb", 1e3},       {"kib", 1024.0},
      {"m", 1e6},       {"mb", 1e6},       {"mib", 1048576.0}, {"g", 1e9},       {"gb", 1e9},
      {"gib", 1073741824.0}, {"t", 1e12},  {"tb", 1e12},      {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = std::floor(value * scale);
      if (bytes >= 1.8e19) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
      return static_cast<uint64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' has an unknown unit (use B, KiB, MiB, GiB, KB, MB, GB)"));
}

struct Server::Impl {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryLimiter> limiter;
  std::unique_ptr<BufferRegistry> registry;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Timer> timer;
  std::unique_ptr<ServiceContext> ctx;
  std::unique_ptr<BufferServiceImpl> buffers;
  std::unique_ptr<StreamServiceImpl> streams;
  std::unique_ptr<OperationServiceImpl> operations;
  std::unique_ptr<ServerServiceImpl> server_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::string backend_name;
  int port = 0;
};

namespace {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ServerOptions& options) {
  if (options.backend == "cpu" || options.backend == "auto") {
    // This build has no CUDA backend, so "auto" means the CPU.
    return std::make_unique<cpu::CpuBackend>(static_cast<size_t>(std::max(0, options.cpu_threads)));
  }
  if (options.backend == "cuda") {
    return absl::FailedPreconditionError("this build has no CUDA backend; use --backend=cpu or auto");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown backend '", options.backend, "' (use auto, cpu or cuda)"));
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Shutdown();
  impl_->grpc_server->Wait();
  // Members go in reverse order of need: services, then the executor (which waits for
  // queued work), then the registry and the backend.
  impl_->grpc_server.reset();
  impl_->executor.reset();
  impl_->registry.reset();
  impl_->timer.reset();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(options);
  if (!backend.ok()) return backend.status();
  impl->backend = *std::move(backend);
  impl->backend_name = std::string(impl->backend->name());
  uint64_t limit = options.memory_limit_bytes;
  if (limit == 0) {
    // Leave room for everything else on the machine: half of it for the CPU backend.
    limit = impl->backend->devices().front().total_memory_bytes / 2;
  }
  impl->limiter = std::make_unique<MemoryLimiter>(limit);
  impl->registry = std::make_unique<BufferRegistry>(*impl->backend, *impl->limiter);
  impl->executor = std::make_unique<Executor>(*impl->backend);
  impl->timer = std::make_unique<Timer>();
  impl->ctx = std::make_unique<ServiceContext>(
      ServiceContext{*impl->backend, *impl->executor, *impl->registry, *impl->limiter, *impl->timer});
  impl->buffers = std::make_unique<BufferServiceImpl>(*impl->ctx);
  impl->streams = std::make_unique<StreamServiceImpl>(*impl->ctx);
  impl->operations = std::make_unique<OperationServiceImpl>(*impl->ctx);
  impl->server_service = std::make_unique<ServerServiceImpl>(*impl->ctx);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &impl->port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  builder.RegisterService(impl->buffers.get());
  builder.RegisterService(impl->streams.get());
  builder.RegisterService(impl->operations.get());
  builder.RegisterService(impl->server_service.get());
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  impl->grpc_server->GetHealthCheckService()->SetServingStatus(true);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }
const std::string& Server::backend_name() const { return impl_->backend_name; }
void Server::Wait() { impl_->grpc_server->Wait(); }

void Server::Shutdown() {
  if (impl_->grpc_server == nullptr) return;
  impl_->grpc_server->GetHealthCheckService()->SetServingStatus(false);
  // Calls in flight get a moment to finish, then are cancelled.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace gpucompute

// What every RPC handler shares: the backend, the executor, the buffer registry, the
// memory limiter and the timer, and the checks every handler makes of its call. The
// conversions to and from the API's messages are in proto_conversions.h; the wire
// limits the client shares are in gpucompute/v1/limits.h.
#ifndef GPUCOMPUTE_SERVER_SERVICE_SERVICE_CONTEXT_H_
#define GPUCOMPUTE_SERVER_SERVICE_SERVICE_CONTEXT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "gpucompute/v1/limits.h"
#include "server/backend.h"
#include "server/buffer_registry.h"
#include "server/executor.h"
#include "server/host_staging_pool.h"
#include "server/shared_memory/region_registry.h"
#include "server/timer.h"

namespace gpucompute {

inline constexpr char kVersion[] = "0.1.0";
inline constexpr char kApi[] = "gpucompute.v1";

struct ServiceContext {
  Backend& backend;
  Executor& executor;
  BufferRegistry& registry;
  MemoryLimiter& limiter;
  Timer& timer;
  std::chrono::steady_clock::time_point start_time = std::chrono::steady_clock::now();
  // SharedMemoryService: what it allows, and its regions (null while it allows nothing).
  SharedMemoryPolicy shared_memory = {};
  RegionRegistry* regions = nullptr;
  // Host memory the transfers stage chunks in (set by the server at start).
  std::unique_ptr<HostStagingPool> staging = nullptr;
  // The backend's copy ceiling on the default device, measured at start (GetServerInfo).
  Backend::CopyCeiling copy_ceiling = {};
  // How long a single-stream Upload may receive nothing before it fails; zero: forever.
  absl::Duration upload_idle_timeout = absl::ZeroDuration();
};

// OK while the backend is healthy; UNAVAILABLE once it has failed ("the cuda backend
// failed (INTERNAL: ...); this server refuses work until it is restarted"). Every RPC
// that would touch the device (CreateBuffer, Upload, Download, Submit, CreateStream,
// SynchronizeStream) checks this first; queries and deletes keep working.
absl::Status CheckBackendHealthy(const Backend& backend);

// The calling client's name (metadata "gpucompute-client"), or INVALID_ARGUMENT if it
// or the call's request id (CheckCallMetadata) is malformed. Clients that send none are
// "default". Every RPC calls it (or CheckCallMetadata) first.
absl::StatusOr<std::string> ClientName(const grpc::CallbackServerContext& context);

// INVALID_ARGUMENT unless `seconds` is a timeout a request may carry: >= 0 (0 meaning
// none), not NaN.
absl::Status CheckTimeout(double seconds);

// Waits in the callback style for whichever comes first, an event or a timeout, and
// runs done(timed_out) exactly once. `arm` registers the callback it is given with the
// event source; if it fails, done never runs and its status is returned.
// timeout_seconds == 0 means no timeout.
absl::Status FirstOfEventOrTimeout(
    ServiceContext& ctx, double timeout_seconds,
    absl::FunctionRef<absl::Status(absl::AnyInvocable<void() &&>)> arm,
    absl::AnyInvocable<void(bool timed_out) &&> done);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_SERVICE_CONTEXT_H_

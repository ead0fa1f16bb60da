// What every RPC handler shares: the backend, the executor, the buffer registry, the
// memory limiter and the timer, and the checks every handler makes of its call. The
// conversions to and from the API's messages are in proto_conversions.h; the wire
// limits the client shares are in gpucompute/v1/limits.h.
#ifndef GPUCOMPUTE_SERVER_SERVICE_SERVICE_CONTEXT_H_
#define GPUCOMPUTE_SERVER_SERVICE_SERVICE_CONTEXT_H_

#include <atomic>
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
#include "server/tenancy/admission.h"
#include "server/tenancy/auth.h"
#include "server/tenancy/placement.h"
#include "server/core/backend.h"
#include "server/expression/program_cache.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/host_staging_pool.h"
#include "server/tenancy/quotas.h"
#include "server/tenancy/request_limits.h"
#include "server/shared_memory/region_registry.h"
#include "server/util/timer.h"
#include "server/util/warm_lane.h"
#include "server/util/worker_threads.h"

namespace gpucompute {

// What a transfer could reach at best on one device: copies between pinned host memory
// and the device, in 1e9 bytes per second.
struct CopyCeiling {
  double host_to_device_gbps = 0;
  double device_to_host_gbps = 0;
  std::string description;  // what was measured, e.g. "pinned host-to-device copy"
};

// Times CopyFromPinnedHost and CopyToPinnedHost of a block of `bytes` of host staging on
// `device`, on the host (best of `repeats`). Waits for the copies: call it at start, not
// from a handler.
absl::StatusOr<CopyCeiling> MeasureCopyCeiling(Backend& backend, int device, uint64_t bytes,
                                               int repeats);

class ChainCache;
// A ChainCache (chain_replay.h) of `registry`'s buffers.
std::shared_ptr<ChainCache> MakeChainCache(BufferRegistry& registry);

// Calls refused by IdentifyCaller's routing checks, for /metrics.
struct RoutingCounters {
  std::atomic<uint64_t> redirects{0};             // FAILED_PRECONDITION: another replica's tenant
  std::atomic<uint64_t> tenant_header_refused{0};  // PERMISSION_DENIED: a spoofed tenant header
};

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
  CopyCeiling copy_ceiling = {};
  // The lease of unnamed operation results that ask for none (--default-result-ttl).
  int64_t default_result_ttl_nanos = 0;
  // Whether named buffers persist across restarts (--persist-dir).
  bool persistence_enabled = false;
  // Checks callers' credentials; null when the server has no authentication configured
  // (one tenant, whose every client is an admin).
  const Authenticator* auth = nullptr;
  // Which replica serves each tenant; null when this server is not one replica of
  // several (no --replica-name).
  const Placement* placement = nullptr;
  std::shared_ptr<RoutingCounters> routing = std::make_shared<RoutingCounters>();
  // The tenants' quotas; null without --quota-file.
  const Quotas* quotas = nullptr;
  // The tenants' places among calls in flight and uploads under way; null: no bounds.
  TenantAdmission* admission = nullptr;
  // How long a single-stream Upload may receive nothing before it fails; zero: forever.
  absl::Duration upload_idle_timeout = absl::ZeroDuration();
  // What one request may ask for (--max-message-bytes and the like).
  RequestLimits limits = {};
  // Elementwise expressions compiled before, for the planner.
  std::shared_ptr<expr::ProgramCache> programs = std::make_shared<expr::ProgramCache>();
  // Chains kept to run again (RunChain).
  std::shared_ptr<ChainCache> chains = MakeChainCache(registry);
  // Copies received upload chunks into staging memory (set by the server at start).
  // Last, so that it is destroyed first: its remaining jobs use the members above.
  std::unique_ptr<WorkerThreads> chunk_copiers = nullptr;
  // Plans and launches a Submit's operation and a chain's steps, on a thread kept warm
  // between calls (set by the server; this one runs every job on its caller).
  std::unique_ptr<WarmLane> lane = std::make_unique<WarmLane>(absl::ZeroDuration(), "");
};

// OK while the backend is healthy; UNAVAILABLE once it has failed ("the cuda backend
// failed (INTERNAL: ...); this server refuses work until it is restarted"). Every RPC
// that would touch the device (CreateBuffer, Upload, Download, Submit, CreateStream,
// SynchronizeStream) checks this once it knows its caller (an unauthenticated call learns
// nothing of the server's health); queries and deletes keep working.
absl::Status CheckBackendHealthy(const Backend& backend);

// The caller of a call: its tenant from a verified token or client certificate (never
// from metadata the caller chooses freely), its client name (metadata
// "gpucompute-client", "default" when absent) and the scope the registries key on.
// Every RPC of the API starts here (gRPC's health and reflection services do not), so
// these are also where a replica routes its calls, before anything else is done:
// UNAUTHENTICATED when authentication is configured and the call's credentials do not
// identify a tenant; PERMISSION_DENIED when metadata kTenantMetadataKey names another
// tenant; INVALID_ARGUMENT for a malformed client name; FAILED_PRECONDITION when
// ctx.placement places the tenant on another replica (whose name and address go into
// `context`'s trailing metadata) or nowhere; RESOURCE_EXHAUSTED when the tenant has all
// the calls in flight it may (Caller::admission).
absl::StatusOr<Caller> IdentifyCaller(const ServiceContext& ctx,
                                      grpc::ServerContextBase& context);

// PERMISSION_DENIED unless `caller` is an admin; `what` says what was refused.
absl::Status RequireAdmin(const Caller& caller, absl::string_view what);

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

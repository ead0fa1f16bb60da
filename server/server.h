// Assembles a gpucompute server: backend, executor, registry and the gRPC services,
// with the standard health checking service and server reflection.
#ifndef GPUCOMPUTE_SERVER_SERVER_H_
#define GPUCOMPUTE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/util/log.h"
#include "server/tenancy/request_limits.h"

namespace gpucompute {

class Backend;


// The warm lane's spin (ServerOptions::lane_spin) when none is set, on a machine where
// the server may use at least kLaneMinCpus CPUs. Long enough to stay awake between the
// calls of a client that waits for each answer: a shorter spin fell asleep between
// them, and each call then paid for waking the lane.
inline constexpr absl::Duration kDefaultLaneSpin = absl::Milliseconds(2);
inline constexpr int kLaneMinCpus = 8;

struct ServerOptions {
  // host:port; port 0 picks a free one (see Server::port).
  std::string listen = "127.0.0.1:50051";
  // "auto" (CUDA when a GPU is present), "cpu" or "cuda"; see server/core/backend_loader.h.
  std::string backend = "auto";
  // Bytes buffers may hold in all; 0 picks a default from the device's memory.
  uint64_t memory_limit_bytes = 0;
  // CPU backend worker threads; 0 means one per hardware thread.
  int cpu_threads = 0;
  // CUDA backend: bytes each device's memory pool reserves at start.
  uint64_t pool_initial_bytes = 0;
  // CUDA backend: bytes each pool keeps reserved when memory is freed; UINT64_MAX keeps
  // everything (fastest reuse), 0 returns freed memory to the device.
  uint64_t pool_release_threshold_bytes = UINT64_MAX;
  // CUDA backend: directory of the compiled-kernel cache that survives restarts.
  // Unset: the backend's default ($GPUCOMPUTE_KERNEL_CACHE, else
  // $XDG_CACHE_HOME/gpucompute/kernels, else ~/.cache/gpucompute/kernels); "" disables
  // the cache.
  std::optional<std::string> kernel_cache_dir;
  // Streams of all clients together, default streams included (idle default streams are
  // reclaimed to make room). On the CPU backend each stream is a thread.
  size_t max_streams = 1024;
  // Runs of at least this many kernel-only operations launched together on a stream (a
  // chain's steps, a session message's operations) are recorded and launched as one CUDA
  // graph; 0 never records. No effect on the CPU backend.
  size_t graph_min_ops = 4;
  // Calls in flight and uploads under way per tenant (server/tenancy/admission.h); 0: no bound.
  uint64_t max_calls_per_tenant = 1024;
  uint64_t max_uploads_per_tenant = 64;
  // With authentication, the fraction of the memory limit one tenant's uploads under way
  // may reserve together, in (0, 1]; 1 is no bound. Without it the server is one tenant,
  // whom a bound would protect from no one.
  double max_reserved_fraction_per_tenant = 0.5;
  // What one request may ask for: message size, dimensions, elements, expression length
  // and depth (server/tenancy/request_limits.h). Start refuses bounds outside their ranges.
  RequestLimits limits;
  // On Shutdown, how long calls in flight and queued operations get to finish before
  // the calls are cancelled and the operations not yet on the device fail.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // How long the warm lane that plans and launches Submit's operations and chains
  // (server/util/warm_lane.h) spins after each job before it sleeps; zero runs them on the
  // calls' own threads. Unset: kDefaultLaneSpin where the server may use at least
  // kLaneMinCpus CPUs (a container's quota counted), zero on smaller machines, where a
  // spinning thread would take the cores gRPC needs.
  std::optional<absl::Duration> lane_spin;
  // Device for buffers and streams whose request names none; must exist.
  int default_device = 0;
  // Path of the CUDA backend module (libgpucompute_cuda_backend.so). Empty: looked for as
  // server/core/backend_loader.h's CudaModuleCandidates says.
  std::string cuda_module;
  // HOST:PORT serving Prometheus metrics on /metrics (port 0 picks one, see
  // Server::metrics_port); empty serves none.
  std::string metrics_listen;
  // SharedMemoryService: system shared-memory regions (--allow-shared-memory) and CUDA IPC
  // regions and exports (--allow-cuda-ipc). Off by default: only trusted clients on the
  // server's host should be let in; without them the service answers FAILED_PRECONDITION.
  bool allow_shared_memory = false;
  bool allow_cuda_ipc = false;
  // Seconds a region may go unused before it is released; 0 keeps regions until they are
  // unregistered or the server stops.
  double region_idle_timeout_seconds = 600;
  // Seconds a single-stream Upload may go without receiving a chunk before it fails with
  // DEADLINE_EXCEEDED and its reservation is released; 0: no limit.
  double upload_idle_timeout_seconds = 60;
  // The form of the log lines (server/util/log.h); main applies it.
  LogFormat log_format = LogFormat::kJson;
  // Measure the backend's copy ceiling at start (a few copies of 32 MiB), which
  // GetServerInfo reports; off, it reports 0.
  bool measure_copy_ceiling = true;
  // Seconds of the lease an unnamed operation result gets when it asks for none; 0
  // gives none. At most kMaxTtlSeconds.
  double default_result_ttl_seconds = 0;
  // How often expired leases are looked for and their buffers reclaimed.
  absl::Duration lease_sweep_interval = absl::Seconds(1);
  // Directory named buffers are written to at shutdown and restored from at start;
  // empty: none persist. See server/persistence/persistence.h.
  std::string persist_dir;
  // With persist_dir: also write named buffers this often; zero only at shutdown.
  absl::Duration snapshot_interval = absl::ZeroDuration();
  // With persist_dir and authentication: the tenant that the buffers persisted without
  // authentication are restored into, each client keeping its name. Empty leaves them in
  // no tenant, where an admin lists and deletes them (kUnauthenticatedTenantName), and
  // the start logs how many there are.
  std::string unauthenticated_tenant;

  // TLS: PEM files of the server's certificate chain and private key; both or neither.
  // With tls_client_ca_file (PEM) set as well, clients must present a certificate it
  // verifies (mutual TLS), whose common name may name the caller's tenant.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Bearer tokens, one "TOKEN TENANT [admin]" a line (server/tenancy/auth.h); re-read by
  // Server::Reload (main calls it on SIGHUP).
  std::string tokens_file;
  // Without authentication (no tokens file, no client CA) the server refuses to listen on
  // anything but a loopback address, unless this is set.
  bool allow_insecure_remote = false;
  // Per-tenant quotas (server/tenancy/quotas.h gives the format); empty: none. Re-read by
  // Server::Reload.
  std::string quota_file;
  // One replica of several, each serving the tenants the placement table places on it
  // (server/tenancy/placement.h): this replica's name in the table, and the table's file
  // (re-read by Server::Reload). Both or neither; they need authentication. A call for a
  // tenant placed elsewhere is refused with FAILED_PRECONDITION naming the owner, whose
  // address comes from replica_addresses ("NAME=HOST:PORT,...") or, for a replica that
  // lists none, replica_address_template (HOST:PORT with "{replica}" in it).
  std::string replica_name;
  std::string placement_file;
  std::string replica_addresses;
  std::string replica_address_template;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  // Serves `backend` (for tests and embedding); options.backend, cpu_threads and the
  // CUDA options are not used.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       std::unique_ptr<Backend> backend);
  ~Server();  // shuts down, then waits for queued work

  int port() const;
  // The port /metrics is served on; 0 when ServerOptions::metrics_listen is empty.
  int metrics_port() const;
  const std::string& backend_name() const;
  // The backend the server runs on, for tests and embedding: e.g. to inspect its memory
  // pools, or to ReportFailure and see the server refuse work.
  Backend& backend();
  // Blocks until Shutdown is called from another thread.
  void Wait();
  // Reports NOT_SERVING, takes no new calls, and gives the calls in flight and the
  // queued operations ServerOptions::shutdown_grace to finish; then cancels the calls,
  // fails the operations not yet on the device (UNAVAILABLE) and stops the kernels the
  // backend can stop (Backend::StopKernels). With ServerOptions::persist_dir, it then
  // writes the named buffers there, once, after the work that writes them. Returns when
  // all of that is done; a second call waits for the first.
  void Shutdown();
  // With ServerOptions::persist_dir: writes the named buffers now, as the periodic
  // snapshot does; returns how many. FAILED_PRECONDITION without a persist_dir.
  absl::StatusOr<size_t> Snapshot();
  // Reads ServerOptions::tokens_file, quota_file and placement_file again, each that is
  // set. A file with an error (logged, and returned) leaves what it configures as it was;
  // the other files are still read.
  absl::Status Reload();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether `listen` (HOST:PORT, [V6]:PORT or unix:PATH) only takes connections from this
// host: a loopback address, "localhost" or a Unix socket.
bool IsLoopbackListenAddress(absl::string_view listen);

// OK if `listen` names somewhere to listen: HOST:PORT or [V6]:PORT with a host and a port
// in [0, 65535] (0: any free port), or unix:PATH / unix-abstract:NAME with a path. Else
// INVALID_ARGUMENT saying what is missing; gRPC itself would take "127.0.0.1:" as port 443.
absl::Status ValidateListenAddress(absl::string_view listen);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVER_H_

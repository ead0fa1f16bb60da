#include "server/server.h"


#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_tuning.h"
#include "server/tenancy/admission.h"
#include "server/tenancy/auth.h"
#include "server/tenancy/placement.h"
#include "server/core/backend_loader.h"
#include "server/cpu/cpu_backend.h"
#include "server/config/cgroup_limits.h"
#include "server/util/log.h"
#include "server/metrics/server_metrics.h"
#include "server/persistence/persistence.h"
#include "server/tenancy/quotas.h"
#include "server/util/request_id.h"
#include "server/service/services.h"
#include "server/util/status_macros.h"

namespace gpucompute {

namespace {

// A listen address taken apart: unix:PATH or unix-abstract:NAME (`scheme` set, `host` the
// rest), or HOST:PORT / [V6]:PORT (`port` set where a port follows the host).
struct ListenParts {
  absl::string_view scheme;
  absl::string_view host;
  std::optional<absl::string_view> port;
  bool bracketed = false;
};

ListenParts SplitListenAddress(absl::string_view listen) {
  ListenParts parts;
  for (absl::string_view scheme : {"unix:", "unix-abstract:"}) {
    if (absl::StartsWith(listen, scheme)) {
      parts.scheme = scheme;
      parts.host = listen.substr(scheme.size());
      return parts;
    }
  }
  absl::string_view rest = listen;
  if (absl::ConsumePrefix(&rest, "[")) {
    parts.bracketed = true;
    const size_t close = rest.find(']');
    parts.host = rest.substr(0, close);
    if (close != absl::string_view::npos && absl::StartsWith(rest.substr(close + 1), ":")) {
      parts.port = rest.substr(close + 2);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != absl::string_view::npos) {
    parts.host = rest.substr(0, colon);
    parts.port = rest.substr(colon + 1);
  } else {
    parts.host = rest;
  }
  return parts;
}

}  // namespace

bool IsLoopbackListenAddress(absl::string_view listen) {
  const ListenParts parts = SplitListenAddress(listen);
  if (!parts.scheme.empty()) return true;
  const absl::string_view host = parts.host;
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  int a = 0, b = 0, c = 0, d = 0;
  char extra = 0;
  const std::string h(host);
  return std::sscanf(h.c_str(), "%d.%d.%d.%d%c", &a, &b, &c, &d, &extra) == 4 && a == 127 &&
         b >= 0 && b < 256 && c >= 0 && c < 256 && d >= 0 && d < 256;
}

absl::Status ValidateListenAddress(absl::string_view listen) {
  const auto refuse = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen '", listen, "' ", what,
                     "; write HOST:PORT (e.g. 127.0.0.1:50051), [V6]:PORT or unix:PATH"));
  };
  const ListenParts parts = SplitListenAddress(listen);
  if (!parts.scheme.empty()) {
    return parts.host.empty() ? refuse("names no socket") : absl::OkStatus();
  }
  if (!parts.port.has_value()) {
    return refuse(parts.bracketed ? "has no port after the bracketed host" : "has no port");
  }
  if (parts.host.empty()) return refuse("has no host");
  const absl::string_view port = *parts.port;
  uint32_t number = 0;
  if (port.empty()) return refuse("has no port");
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      port.size() > 5 || !absl::SimpleAtoi(port, &number) || number > 65535) {
    return refuse(absl::StrCat("has no port in [0, 65535] ('", port, "')"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::string> ReadPemFile(absl::string_view what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not a PEM file"));
  }
  return text.str();
}

// The first PEM object of `pem` that `read` parses (PEM_read_bio_X509, ...), or null.
// Never asks for a passphrase: gRPC takes the key as it is, so an encrypted one is of no
// use, and OpenSSL's default would prompt on the terminal.
template <typename T, typename Read>
std::unique_ptr<T, void (*)(T*)> ReadPem(const std::string& pem, Read read, void (*free)(T*)) {
  std::unique_ptr<T, void (*)(T*)> object(nullptr, free);
  if (pem.size() > static_cast<size_t>(INT_MAX)) return object;
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())),
                                          &BIO_free);
  if (bio == nullptr) return object;
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  object.reset(read(bio.get(), nullptr, no_passphrase, nullptr));
  ERR_clear_error();  // the caller says what failed; leave no error queued for gRPC's TLS
  return object;
}

// OK when `key` is the private key of the first (the server's own) certificate of
// `cert_chain`. gRPC finds out only when it builds the listener, and says no more than
// that the server cannot listen.
absl::Status CheckKeyMatchesCertificate(const ServerOptions& options, const std::string& cert_chain,
                                        const std::string& key) {
  auto cert = ReadPem<X509>(cert_chain, PEM_read_bio_X509, X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS certificate ", options.tls_cert_file,
                                                   " holds no certificate in PEM"));
  }
  auto private_key = ReadPem<EVP_PKEY>(key, PEM_read_bio_PrivateKey, EVP_PKEY_free);
  if (private_key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS key ", options.tls_key_file,
                                                   " holds no unencrypted private key in PEM"));
  }
  const bool match = X509_check_private_key(cert.get(), private_key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS certificate ", options.tls_cert_file, " and the TLS key ", options.tls_key_file,
        " do not match: the key is not the certificate's private key (--tls-cert and --tls-key "
        "must be one pair)"));
  }
  return absl::OkStatus();
}

// The listening port's credentials: TLS (mutual with a client CA) or none.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const ServerOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (options.tls_cert_file.empty()) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile("the TLS certificate", options.tls_cert_file));
  ASSIGN_OR_RETURN(pair.private_key, ReadPemFile("the TLS key", options.tls_key_file));
  RETURN_IF_ERROR(CheckKeyMatchesCertificate(options, pair.cert_chain, pair.private_key));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile("the TLS client CA", options.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// The services the health service reports on, besides the server as a whole ("").
std::vector<std::string> ServiceNames() {
  return {v1::BufferService::service_full_name(),       v1::StreamService::service_full_name(),
          v1::OperationService::service_full_name(),    v1::ServerService::service_full_name(),
          v1::SharedMemoryService::service_full_name(), v1::SessionService::service_full_name()};
}

void SetServing(grpc::HealthCheckServiceInterface& health, bool serving) {
  health.SetServingStatus(serving);  // "" and every service it knows
  for (const std::string& name : ServiceNames()) health.SetServingStatus(name, serving);
}

// Where the backend's failure listener reaches the health service: attached while the gRPC
// server lives. Shared with the listener, which may run on a backend thread at any time.
// It also keeps why the server is not ready, for the metrics port's /readyz.
class HealthSink {
 public:
  // From now on, reports go to `health`, which starts serving when `status` is OK.
  void Attach(grpc::HealthCheckServiceInterface* health, absl::Status status) {
    absl::MutexLock lock(&mu_);
    health_ = health;
    ready_ = std::move(status);
    SetServing(*health_, ready_.ok());
  }
  // A failure reported from now on is only logged.
  void Detach() {
    absl::MutexLock lock(&mu_);
    health_ = nullptr;
    ready_ = absl::UnavailableError("the server has stopped");
  }
  // Not serving from now on, for `why`; the attached health service says so too.
  void Report(absl::Status why) {
    absl::MutexLock lock(&mu_);
    ready_ = std::move(why);
    if (health_ != nullptr) SetServing(*health_, false);
  }
  // OK while the gRPC server serves; otherwise why not.
  absl::Status Ready() const {
    absl::MutexLock lock(&mu_);
    return ready_;
  }

 private:
  mutable absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status ready_ ABSL_GUARDED_BY(mu_) = absl::UnavailableError("the server is starting");
};

// The calls in flight, counted by an interceptor that lives as long as its call: the
// shutdown's grace waits for these, not for gRPC's own count, which also waits for idle
// connections to close.
class CallCount {
 public:
  void Add(int64_t delta) {
    absl::MutexLock lock(&mu_);
    calls_ += delta;
  }
  // Whether no call is in flight, waiting until `deadline` for that.
  bool WaitNone(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(
        absl::Condition(+[](int64_t* calls) { return *calls == 0; }, &calls_), deadline);
  }

 private:
  absl::Mutex mu_;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class CallCountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CallCountingInterceptor(std::shared_ptr<CallCount> count) : count_(std::move(count)) {
    count_->Add(1);
  }
  ~CallCountingInterceptor() override { count_->Add(-1); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  const std::shared_ptr<CallCount> count_;
};

class CallCountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCountingFactory(std::shared_ptr<CallCount> count) : count_(std::move(count)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new CallCountingInterceptor(count_);
  }

 private:
  const std::shared_ptr<CallCount> count_;
};

}  // namespace

struct Server::Impl {
  std::shared_ptr<HealthSink> health_sink = std::make_shared<HealthSink>();
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryLimiter> limiter;
  // Before the timer and the services: what they hold gives places back to it.
  std::unique_ptr<TenantAdmission> admission;
  std::unique_ptr<BufferRegistry> registry;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Timer> timer;
  std::unique_ptr<Authenticator> auth;  // null without authentication
  std::unique_ptr<Quotas> quotas;       // null without a quota file
  std::string quota_file;
  std::unique_ptr<Placement> placement;  // null unless one replica of several
  std::unique_ptr<ServiceContext> ctx;
  std::unique_ptr<BufferServiceImpl> buffers;
  std::unique_ptr<StreamServiceImpl> streams;
  std::unique_ptr<OperationServiceImpl> operations;
  std::unique_ptr<ServerServiceImpl> server_service;
  // Only while SharedMemoryService allows something; the service itself always answers.
  std::unique_ptr<RegionRegistry> regions;
  std::unique_ptr<SharedMemoryServiceImpl> shared_memory;
  std::unique_ptr<SessionServiceImpl> sessions;
  // Outlives the executor, which calls it as operations complete.
  std::unique_ptr<metrics::ServerMetrics> metrics;
  std::unique_ptr<grpc::Server> grpc_server;
  std::string backend_name;
  int port = 0;
  absl::Duration shutdown_grace;
  absl::Duration lease_sweep_interval;
  std::unique_ptr<BufferPersister> persister;
  std::shared_ptr<CallCount> calls = std::make_shared<CallCount>();
  // Held by the one Shutdown that runs; a later call waits for it, then returns.
  absl::Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;

  // Reclaims expired leases now and then, on the timer thread, until the timer is gone.
  // A sweep schedules the next one through the Timer it runs on, never through `timer`:
  // ~Server clears that pointer while the timer thread may still be in a sweep.
  void ScheduleLeaseSweep(Timer& on) {
    on.Schedule(Timer::Clock::now() + absl::ToChronoNanoseconds(lease_sweep_interval), [this, &on] {
      registry->ReclaimExpired();
      ScheduleLeaseSweep(on);
    });
  }
};

namespace {

// The memory limit when none is given. CPU: half of the machine's memory, leaving the
// rest to everything else on it. GPU: each device's memory less max(5%, 256 MiB) of it,
// summed over the devices; the headroom is for what the device needs besides buffers
// (the CUDA context, cuBLAS workspaces, reduction scratch, pool fragmentation). The
// limit is one for all devices together; a device that fills up first answers
// RESOURCE_EXHAUSTED from its own allocator.
uint64_t DefaultMemoryLimit(const Backend& backend) {
  if (backend.name() == "cpu") return backend.devices().front().total_memory_bytes / 2;
  constexpr uint64_t kMinHeadroom = uint64_t{256} << 20;
  uint64_t limit = 0;
  for (const DeviceDescription& d : backend.devices()) {
    const uint64_t headroom = std::max(d.total_memory_bytes / 20, kMinHeadroom);
    limit += d.total_memory_bytes > headroom ? d.total_memory_bytes - headroom
                                             : d.total_memory_bytes / 2;
  }
  return limit;
}

// Host staging kept for reuse between transfers, and the block the copy ceiling is
// measured with.
constexpr uint64_t kStagingCacheBytes = uint64_t{256} << 20;
constexpr uint64_t kCeilingProbeBytes = uint64_t{32} << 20;

absl::Duration LaneSpin(const ServerOptions& options) {
  if (options.lane_spin.has_value()) return *options.lane_spin;
  const int cpus = LimitedThreadCount(AvailableProcessors(), ReadCgroupLimits());
  return cpus >= kLaneMinCpus ? kDefaultLaneSpin : absl::ZeroDuration();
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (impl_->metrics != nullptr) impl_->metrics->StopServing();
  Shutdown();
  impl_->grpc_server->Wait();
  impl_->health_sink->Detach();
  // Members go in reverse order of need: services, then the executor (which waits for
  // queued work), then the registry and the backend.
  impl_->grpc_server.reset();
  // No call is left to hand it work; it stops polling the backend's completions.
  if (impl_->ctx != nullptr) impl_->ctx->lane.reset();
  impl_->executor.reset();
  // Kept chains hold buffers and recordings, and listen to the registry: they go before
  // the registry and the backend.
  if (impl_->ctx != nullptr) impl_->ctx->chains.reset();
  // Before the registry: the lease sweep runs on the timer.
  impl_->timer.reset();
  // Regions are released at shutdown; the copies that used them are done.
  impl_->regions.reset();
  impl_->persister.reset();
  impl_->registry.reset();
}

namespace {

// The placement of a replica (ServerOptions::replica_name), or null for a server that is
// not one.
absl::StatusOr<std::unique_ptr<Placement>> MakePlacement(const ServerOptions& options,
                                                         bool authenticated) {
  const bool addressed =
      !options.replica_addresses.empty() || !options.replica_address_template.empty();
  if (options.replica_name.empty() && options.placement_file.empty()) {
    if (!addressed) return nullptr;
    return absl::InvalidArgumentError(
        "--replica-addresses and --replica-address-template tell a replica where the others "
        "are; they need --replica-name and --placement-file");
  }
  if (!authenticated) {
    // The table places tenants, and without authentication every call is in the one
    // unnamed tenant: no row could name it.
    return absl::InvalidArgumentError(
        "a replica (--replica-name, --placement-file) serves the tenants of the tokens file "
        "or client certificates; configure --tokens-file or --tls-client-ca");
  }
  ReplicaAddresses addresses;
  RETURN_IF_ERROR(addresses.ParseList(options.replica_addresses));
  addresses.address_template = options.replica_address_template;
  return Placement::Create(options.replica_name, options.placement_file, std::move(addresses));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(options));
  return Start(options, std::move(backend));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      std::unique_ptr<Backend> backend) {
  RETURN_IF_ERROR(ValidateRequestLimits(options.limits));
  if (backend == nullptr || backend->devices().empty()) {
    return absl::FailedPreconditionError("the backend has no devices");
  }
  if (absl::Status s = CheckDeviceIndex(*backend, options.default_device); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("default device: ", s.message()));
  }
  RETURN_IF_ERROR(ValidateListenAddress(options.listen));
  const bool authenticated = !options.tokens_file.empty() || !options.tls_client_ca_file.empty();
  if (!authenticated && !options.allow_insecure_remote &&
      !IsLoopbackListenAddress(options.listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", options.listen,
        " without authentication: anyone who reaches it could use and read every buffer; "
        "configure --tokens-file or --tls-client-ca, listen on a loopback address, or pass "
        "--allow-insecure-remote to serve without authentication anyway"));
  }
  if (!options.unauthenticated_tenant.empty()) {
    if (absl::Status s = ValidateTenantName(options.unauthenticated_tenant); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("unauthenticated tenant '",
                                                     options.unauthenticated_tenant,
                                                     "': ", s.message()));
    }
    if (!authenticated || options.persist_dir.empty()) {
      return absl::InvalidArgumentError(
          "an unauthenticated tenant applies to buffers restored from --persist-dir by a server "
          "with authentication (--tokens-file or --tls-client-ca); this server has no " +
          std::string(options.persist_dir.empty() ? "--persist-dir" : "authentication"));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   ListenCredentials(options));
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->placement, MakePlacement(options, authenticated));
  if (authenticated) {
    ASSIGN_OR_RETURN(impl->auth, Authenticator::Create(options.tokens_file,
                                                       !options.tls_client_ca_file.empty()));
  }
  if (!options.quota_file.empty()) {
    ASSIGN_OR_RETURN(QuotaTable quotas, QuotaTable::Load(options.quota_file));
    impl->quotas = std::make_unique<Quotas>(std::move(quotas));
    impl->quota_file = options.quota_file;
  }
  impl->backend = std::move(backend);
  impl->backend_name = std::string(impl->backend->name());
  impl->shutdown_grace = options.shutdown_grace;
  impl->lease_sweep_interval = options.lease_sweep_interval > absl::ZeroDuration()
                                   ? options.lease_sweep_interval
                                   : absl::Seconds(1);
  absl::StatusOr<int64_t> default_ttl = TtlNanos(options.default_result_ttl_seconds);
  if (!default_ttl.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("default result ttl: ", default_ttl.status().message()));
  }
  // A failure after which the device cannot be trusted: logged once, and the health
  // service goes NOT_SERVING (the services refuse work themselves, through
  // CheckBackendHealthy).
  impl->backend->SetFailureListener(
      [sink = impl->health_sink, name = impl->backend_name](const absl::Status& status) {
        Log(LogLevel::kError, "the backend failed; refusing work until the server is restarted",
            {{"backend", name}, {"error", status.ToString()}});
        sink->Report(absl::UnavailableError(
            absl::StrCat("the backend failed: ", status.message())));
      });
  const uint64_t limit = options.memory_limit_bytes != 0 ? options.memory_limit_bytes
                                                         : DefaultMemoryLimit(*impl->backend);
  impl->limiter = std::make_unique<MemoryLimiter>(limit);
  impl->registry = std::make_unique<BufferRegistry>(*impl->backend, *impl->limiter);
  ASSIGN_OR_RETURN(impl->executor,
                   Executor::Create(*impl->backend, options.default_device, options.max_streams));
  impl->timer = std::make_unique<Timer>();
  impl->ctx = std::make_unique<ServiceContext>(ServiceContext{
      *impl->backend, *impl->executor, *impl->registry, *impl->limiter, *impl->timer});
  impl->ctx->auth = impl->auth.get();
  impl->ctx->quotas = impl->quotas.get();
  impl->ctx->placement = impl->placement.get();
  const double fraction = options.max_reserved_fraction_per_tenant;
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-reserved-fraction-per-tenant must be greater than 0 and at most 1, not ", fraction));
  }
  TenantAdmission::Limits admission{options.max_calls_per_tenant, options.max_uploads_per_tenant};
  if (impl->auth != nullptr && fraction < 1) {
    // At least a byte: 0 would be no bound.
    admission.reserved_bytes =
        std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(limit) * fraction));
    admission.reserved_fraction = fraction;
  }
  impl->admission = std::make_unique<TenantAdmission>(admission);
  impl->ctx->admission = impl->admission.get();
  impl->registry->SetQuotas(impl->quotas.get());
  impl->executor->SetQuotas(impl->quotas.get());
  impl->executor->SetCaptureMinOps(options.graph_min_ops);
  impl->ctx->staging = std::make_unique<HostStagingPool>(*impl->backend, kStagingCacheBytes);
  // Half the cores, 2 to 8: enough for 8 concurrent upload streams, each copying at most
  // two chunks at a time at several GB/s.
  impl->ctx->chunk_copiers = std::make_unique<WorkerThreads>(
      std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 2, 8), "chunk-copy");
  impl->ctx->lane =
      std::make_unique<WarmLane>(LaneSpin(options), "warm-lane",
                                 [backend = impl->backend.get()] { backend->PollCompletions(); });
  impl->ctx->default_result_ttl_nanos = *default_ttl;
  impl->ctx->limits = options.limits;
  if (!options.persist_dir.empty()) {
    // Restored before the server serves: clients that come back find their buffers.
    impl->persister = std::make_unique<BufferPersister>(*impl->backend, *impl->executor,
                                                        *impl->registry, options.persist_dir);
    ASSIGN_OR_RETURN(const BufferPersister::Restored restored,
                     impl->persister->Restore(authenticated, options.unauthenticated_tenant));
    Log(LogLevel::kInfo,
        absl::StrCat("restored ", restored.buffers, " buffers from ", options.persist_dir));
    if (restored.stranded != 0) {
      Log(LogLevel::kWarning,
          absl::StrCat("buffers persisted without authentication and restored into no tenant, "
                       "which no token reaches: ",
                       restored.stranded,
                       ". An admin lists and deletes them with ListBuffers and DeleteBuffer "
                       "naming tenant '",
                       kUnauthenticatedTenantName,
                       "'; or restart with --unauthenticated-tenant=NAME to restore them into "
                       "tenant NAME"));
    }
    impl->ctx->persistence_enabled = true;
  }
  if (options.measure_copy_ceiling) {
    // Cheap (a few copies of 32 MiB); a backend that cannot measure reports 0.
    absl::StatusOr<CopyCeiling> ceiling =
        MeasureCopyCeiling(*impl->backend, options.default_device, kCeilingProbeBytes, 2);
    if (ceiling.ok()) impl->ctx->copy_ceiling = *std::move(ceiling);
  }
  {
    const double timeout = options.upload_idle_timeout_seconds;
    if (!(timeout >= 0) || timeout > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("upload idle timeout must be 0 to 1e9 seconds, got ", timeout));
    }
    impl->ctx->upload_idle_timeout = absl::Seconds(timeout);
  }
  impl->buffers = std::make_unique<BufferServiceImpl>(*impl->ctx);
  impl->streams = std::make_unique<StreamServiceImpl>(*impl->ctx);
  impl->operations = std::make_unique<OperationServiceImpl>(*impl->ctx);
  impl->server_service = std::make_unique<ServerServiceImpl>(*impl->ctx);
  {
    const double timeout = options.region_idle_timeout_seconds;
    if (!(timeout >= 0) || timeout > 1e9) {
      return absl::InvalidArgumentError(
          absl::StrCat("region idle timeout must be 0 to 1e9 seconds, got ", timeout));
    }
    SharedMemoryPolicy& policy = impl->ctx->shared_memory;
    policy.allow_system = options.allow_shared_memory;
    policy.allow_cuda_ipc = options.allow_cuda_ipc;
    policy.idle_timeout = absl::Seconds(timeout);
    if (policy.allow_system || policy.allow_cuda_ipc) {
      impl->regions = std::make_unique<RegionRegistry>(policy.idle_timeout);
      impl->ctx->regions = impl->regions.get();
    }
    impl->shared_memory =
        std::make_unique<SharedMemoryServiceImpl>(*impl->ctx, impl->buffers->uploads());
  }
  impl->sessions = std::make_unique<SessionServiceImpl>(*impl->ctx);
  if (!options.metrics_listen.empty()) {
    impl->metrics = std::make_unique<metrics::ServerMetrics>(*impl->ctx);
    RETURN_IF_ERROR(impl->metrics->Serve(options.metrics_listen,
                                         [sink = impl->health_sink] { return sink->Ready(); }));
    impl->executor->SetObserver(impl->metrics.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ASSIGN_OR_RETURN(const GrpcIntArgs grpc_args, GrpcArgsFromEnvironment());
  // gRPC lets a second server bind a port that one already listens on (SO_REUSEPORT),
  // and the kernel then splits connections between them: a stale replica would serve
  // half the calls. Off, the second server is refused at start. The environment may
  // turn it back on.
  if (std::none_of(grpc_args.begin(), grpc_args.end(),
                   [](const auto& arg) { return arg.first == GRPC_ARG_ALLOW_REUSEPORT; })) {
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  }
  for (const auto& [name, value] : grpc_args) builder.AddChannelArgument(name, value);
  builder.AddListeningPort(options.listen, credentials, &impl->port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.limits.max_message_bytes));
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
    factories.push_back(MakeRequestIdInterceptorFactory(impl->auth.get()));
    factories.push_back(std::make_unique<CallCountingFactory>(impl->calls));
    builder.experimental().SetInterceptorCreators(std::move(factories));
  }
  builder.RegisterService(impl->buffers.get());
  builder.RegisterService(impl->streams.get());
  builder.RegisterService(impl->operations.get());
  builder.RegisterService(impl->server_service.get());
  builder.RegisterService(impl->shared_memory.get());
  builder.RegisterService(impl->sessions.get());
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  // A failure reported before this point found no health service to update.
  impl->health_sink->Attach(impl->grpc_server->GetHealthCheckService(),
                            impl->backend->health());
  if (impl->persister != nullptr && options.snapshot_interval > absl::ZeroDuration()) {
    impl->persister->StartPeriodic(options.snapshot_interval);
  }
  impl->ScheduleLeaseSweep(*impl->timer);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }
int Server::metrics_port() const { return impl_->metrics == nullptr ? 0 : impl_->metrics->port(); }
const std::string& Server::backend_name() const { return impl_->backend_name; }
Backend& Server::backend() { return *impl_->backend; }
void Server::Wait() { impl_->grpc_server->Wait(); }

absl::Status Server::Reload() {
  absl::Status result;
  if (impl_->auth != nullptr) {
    absl::Status status = impl_->auth->Reload();
    if (status.ok()) {
      Log(LogLevel::kInfo,
          absl::StrCat("reloaded the tokens file: ", impl_->auth->token_count(), " tokens"));
    } else {
      Log(LogLevel::kError, absl::StrCat("kept the tokens in use: ", status.message()));
    }
    result.Update(status);
  }
  if (impl_->quotas != nullptr) {
    absl::StatusOr<QuotaTable> table = QuotaTable::Load(impl_->quota_file);
    if (table.ok()) {
      impl_->quotas->Replace(*std::move(table));
      Log(LogLevel::kInfo, "reloaded the quota file", {{"path", impl_->quota_file}});
    } else {
      Log(LogLevel::kError, absl::StrCat("kept the quotas in use: ", table.status().message()));
    }
    result.Update(table.status());
  }
  if (impl_->placement != nullptr) {
    absl::Status status = impl_->placement->Reload();
    if (status.ok()) {
      Log(LogLevel::kInfo,
          absl::StrCat("reloaded the placement file: ", impl_->placement->row_count(), " rows"),
          {{"path", impl_->placement->table_file()}});
    } else {
      Log(LogLevel::kError, absl::StrCat("kept the placement in use: ", status.message()));
    }
    result.Update(status);
  }
  return result;
}

void Server::Shutdown() {
  if (impl_->grpc_server == nullptr) return;
  absl::MutexLock once(&impl_->shutdown_mu);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + impl_->shutdown_grace;
  impl_->health_sink->Report(absl::UnavailableError("the server is shutting down"));
  // New calls and connections are refused from here on. gRPC's own Shutdown(deadline)
  // would also wait for every connection to close, and an idle channel or a connection
  // that never sends the HTTP/2 preface holds it to the deadline: the grace is counted
  // here on the calls and the operations alone, and gRPC is told to stop at once after.
  grpc_completion_queue* shut_down = grpc_completion_queue_create_for_pluck(nullptr);
  int shut_down_tag = 0;
  grpc_server_shutdown_and_notify(impl_->grpc_server->c_server(), shut_down, &shut_down_tag);
  // The grace: calls in flight and operations queued or running (waited for or not) may
  // finish.
  const bool calls_done = impl_->calls->WaitNone(deadline);
  if (!impl_->executor->WaitIdle(deadline) || !calls_done) {
    const absl::Status stopping = absl::UnavailableError("the server is shutting down");
    const size_t cancelled = impl_->executor->CancelQueued(stopping);
    // A running CPU operation stops between chunks; a launched CUDA kernel cannot be
    // stopped, and what the executor already handed the device runs.
    impl_->backend->StopKernels(stopping);
    Log(LogLevel::kWarning,
        absl::StrCat(cancelled,
                     " queued operations did not start within the shutdown grace; cancelled"),
        {{"grace", absl::FormatDuration(impl_->shutdown_grace)},
         {"calls", calls_done ? "done" : "cancelled"}});
  }
  // Multi-range uploads that no call carries any more free their memory now.
  impl_->buffers->uploads()->FailAll(absl::UnavailableError("the server is shutting down"));
  // Cancels the calls left and closes every connection, idle ones included.
  impl_->grpc_server->Shutdown(absl::ToChronoTime(absl::Now()));
  // Shut down by now: the notice is there to take.
  grpc_completion_queue_pluck(shut_down, &shut_down_tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                              nullptr);
  grpc_completion_queue_shutdown(shut_down);
  grpc_completion_queue_destroy(shut_down);
  if (impl_->persister != nullptr) {
    // After the cancellation, however long the write takes: the named buffers are the
    // promise that outlives the process. It waits for the work that writes them.
    impl_->persister->StopPeriodic();
    const absl::Time write_start = absl::Now();
    absl::StatusOr<size_t> written = impl_->persister->Snapshot();
    const std::string took = absl::FormatDuration(absl::Now() - write_start);
    if (written.ok()) {
      Log(LogLevel::kInfo, absl::StrCat("wrote ", *written, " named buffers to ",
                                        impl_->persister->dir(), " in ", took));
    } else {
      Log(LogLevel::kError, absl::StrCat("writing the named buffers to ", impl_->persister->dir(),
                                         " failed after ", took, ": ", written.status().message()));
    }
  }
  Log(LogLevel::kInfo, "shut down",
      {{"took", absl::FormatDuration(absl::Now() - start)},
       {"grace", absl::FormatDuration(impl_->shutdown_grace)}});
}

absl::StatusOr<size_t> Server::Snapshot() {
  if (impl_->persister == nullptr) {
    return absl::FailedPreconditionError("the server has no persist directory");
  }
  return impl_->persister->Snapshot();
}

}  // namespace gpucompute

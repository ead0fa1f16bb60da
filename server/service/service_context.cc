#include "server/service/service_context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/util/request_id.h"
#include "server/util/status_macros.h"

namespace gpucompute {

absl::Status CheckBackendHealthy(const Backend& backend) {
  const absl::Status health = backend.health();
  if (health.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the ", backend.name(), " backend failed (",
                                             health.ToString(),
                                             "); this server refuses work until it is restarted"));
}

namespace {

// What the ceiling's copies are on each backend, for GetServerInfo's answer.
std::string CopyCeilingDescription(absl::string_view backend) {
  if (backend == "cuda") return "pinned host-to-device and device-to-host DMA copy";
  return absl::StrCat("the ", backend, " backend's copy from and to host staging");
}

}  // namespace

absl::StatusOr<CopyCeiling> MeasureCopyCeiling(Backend& backend, int device, uint64_t bytes,
                                               int repeats) {
  ASSIGN_OR_RETURN(DeviceMemory host, backend.AllocateHostStaging(bytes));
  ASSIGN_OR_RETURN(DeviceMemory dev, backend.Allocate(device, bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(device));
  // Touch the host block first, so that page faults are not timed.
  std::memset(host.data(), 1, static_cast<size_t>(bytes));
  auto time_one = [&](bool to_device) -> absl::StatusOr<double> {
    // Shared with the completion callback, which may still be unlocking it when this
    // function returns.
    struct Completion {
      absl::Mutex mu;
      bool done ABSL_GUARDED_BY(mu) = false;
      absl::Status result ABSL_GUARDED_BY(mu);
    };
    auto completion = std::make_shared<Completion>();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = to_device ? backend.CopyFromPinnedHost(*stream, host.data(), dev, 0, bytes)
                               : backend.CopyToPinnedHost(*stream, dev, 0, host.data(), bytes);
    if (s.ok()) {
      s = stream->OnComplete([completion](absl::Status st) {
        absl::MutexLock lock(&completion->mu);
        completion->result = st;
        completion->done = true;
      });
    }
    if (!s.ok()) return s;
    absl::MutexLock lock(&completion->mu);
    completion->mu.Await(absl::Condition(&completion->done));
    if (!completion->result.ok()) return completion->result;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  CopyCeiling ceiling;
  ceiling.description = CopyCeilingDescription(backend.name());
  for (bool to_device : {true, false}) {
    double best = 0;
    for (int i = 0; i < std::max(repeats, 1) + 1; ++i) {  // the first run warms up
      ASSIGN_OR_RETURN(const double seconds, time_one(to_device));
      if (i > 0 && seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds / 1e9);
    }
    (to_device ? ceiling.host_to_device_gbps : ceiling.device_to_host_gbps) = best;
  }
  return ceiling;
}

namespace {

absl::StatusOr<std::string> ClientName(const grpc::ServerContextBase& context) {
  RETURN_IF_ERROR(CheckCallMetadata(context));
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientMetadataKey);
  if (it == metadata.end()) return std::string(kDefaultClient);
  std::string name(it->second.data(), it->second.size());
  // Printable ASCII only: the scope separator, a control byte, must not occur in it.
  const bool printable =
      std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  if (name.empty() || name.size() > kMaxClientNameBytes || !printable) {
    return absl::InvalidArgumentError(absl::StrCat("metadata '", kClientMetadataKey,
                                                   "' must be 1 to ", kMaxClientNameBytes,
                                                   " printable ASCII characters"));
  }
  return name;
}

// PERMISSION_DENIED when the call names a tenant (kTenantMetadataKey) other than
// `tenant`, the one its credentials name: a proxy routes on the header, so a call whose
// header disagrees would be served by the wrong replica's rules.
absl::Status CheckTenantHeader(const ServiceContext& ctx, const grpc::ServerContextBase& context,
                               absl::string_view tenant) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTenantMetadataKey);
  if (it == metadata.end()) return absl::OkStatus();
  const absl::string_view named(it->second.data(), it->second.size());
  if (named == tenant) return absl::OkStatus();
  ctx.routing->tenant_header_refused.fetch_add(1, std::memory_order_relaxed);
  // The name sent is not echoed: it is whatever the caller wrote.
  if (tenant.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "metadata '", kTenantMetadataKey,
        "' names a tenant, but this server has no authentication and serves its one unnamed "
        "tenant; send no '", kTenantMetadataKey, "'"));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "metadata '", kTenantMetadataKey, "' names another tenant than this call's credentials (",
      tenant, "); send '", kTenantMetadataKey, ": ", tenant, "' or none"));
}

// FAILED_PRECONDITION, with the owner in `context`'s trailing metadata, when ctx.placement
// does not place `tenant` on this replica.
absl::Status CheckPlacement(const ServiceContext& ctx, grpc::ServerContextBase& context,
                            absl::string_view tenant) {
  if (ctx.placement == nullptr) return absl::OkStatus();
  std::optional<Redirect> redirect;
  absl::Status placed = ctx.placement->Check(tenant, &redirect);
  if (redirect.has_value()) {
    ctx.routing->redirects.fetch_add(1, std::memory_order_relaxed);
    context.AddTrailingMetadata(kRedirectReplicaKey, redirect->replica);
    if (redirect->address.has_value()) {
      context.AddTrailingMetadata(kRedirectAddressKey, *redirect->address);
    }
  }
  return placed;
}

}  // namespace

absl::StatusOr<Caller> IdentifyCaller(const ServiceContext& ctx,
                                      grpc::ServerContextBase& context) {
  Caller caller;
  if (ctx.auth == nullptr) {
    caller.admin = true;  // one tenant: every caller has the whole server, as before
  } else {
    ASSIGN_OR_RETURN(Identity identity, ctx.auth->AuthenticateCall(context));
    caller.tenant = std::move(identity.tenant);
    caller.admin = identity.admin;
    caller.credential = std::move(identity.credential);
  }
  RETURN_IF_ERROR(CheckTenantHeader(ctx, context, caller.tenant));
  ASSIGN_OR_RETURN(caller.client, ClientName(context));
  RETURN_IF_ERROR(CheckPlacement(ctx, context, caller.tenant));
  caller.scope = ScopeOf(caller.tenant, caller.client);
  if (ctx.admission != nullptr) {
    ASSIGN_OR_RETURN(caller.admission,
                     ctx.admission->Admit(TenantAdmission::Kind::kCall, caller.tenant));
  }
  return caller;
}

absl::Status RequireAdmin(const Caller& caller, absl::string_view what) {
  if (caller.admin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " needs an admin token; tenant '", caller.tenant, "' is not an admin"));
}

absl::Status CheckTimeout(double seconds) {
  if (!(seconds >= 0)) {  // also rejects NaN
    return absl::InvalidArgumentError(absl::StrCat("timeout must be >= 0 seconds, got ", seconds));
  }
  return absl::OkStatus();
}

absl::Status FirstOfEventOrTimeout(
    ServiceContext& ctx, double timeout_seconds,
    absl::FunctionRef<absl::Status(absl::AnyInvocable<void() &&>)> arm,
    absl::AnyInvocable<void(bool timed_out) &&> done) {
  struct Once {
    absl::Mutex mu;
    bool fired ABSL_GUARDED_BY(mu) = false;
    uint64_t timer_key ABSL_GUARDED_BY(mu) = 0;
    // Run by whoever claims `fired`, once; not touched by anyone else.
    absl::AnyInvocable<void(bool) &&> done;
  };
  auto once = std::make_shared<Once>();
  once->done = std::move(done);
  // Claims the right to run `done`; the loser of the race does nothing.
  auto claim = [once]() -> bool {
    absl::MutexLock lock(&once->mu);
    return !std::exchange(once->fired, true);
  };
  if (timeout_seconds > 0) {
    const auto when = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::min(timeout_seconds, 1e7)));
    const uint64_t key = ctx.timer.Schedule(when, [once, claim] {
      if (claim()) std::move(once->done)(true);
    });
    absl::MutexLock lock(&once->mu);
    once->timer_key = key;
  }
  absl::Status armed = arm([once, claim, &timer = ctx.timer] {
    if (!claim()) return;
    uint64_t key;
    {
      absl::MutexLock lock(&once->mu);
      key = once->timer_key;
    }
    if (key != 0) timer.Cancel(key);
    std::move(once->done)(false);
  });
  if (!armed.ok()) {
    claim();
    absl::MutexLock lock(&once->mu);
    if (once->timer_key != 0) ctx.timer.Cancel(once->timer_key);
  }
  return armed;
}

}  // namespace gpucompute

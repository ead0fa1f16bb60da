// Per-tenant bounds on calls in flight and on uploads under way (--max-calls-per-tenant,
// --max-uploads-per-tenant), so that one tenant cannot take all of the server's call
// handling or hold memory reservations open for others to be refused.
//
// A call takes its place when IdentifyCaller admits it and keeps it while the server
// serves it: a streaming call or a call that waits (WaitOperation, SynchronizeStream, a
// Submit that waits, a region copy) until it ends. An upload (a single-stream Upload or a
// BeginUpload and its ranges) takes a place of its own from its header until it completes
// or fails, and the device memory it reserves counts against the tenant's bound on
// reservations (--max-reserved-fraction-per-tenant) for as long.
#ifndef GPUCOMPUTE_SERVER_TENANCY_ADMISSION_H_
#define GPUCOMPUTE_SERVER_TENANCY_ADMISSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

class TenantAdmission {
 public:
  struct Limits {
    uint64_t calls = 0;    // calls in flight per tenant; 0: no bound
    uint64_t uploads = 0;  // uploads under way per tenant; 0: no bound
    // Bytes the uploads under way of one tenant may reserve together; 0: no bound. The
    // fraction of the memory limit it stands for, for the message that names the flag.
    uint64_t reserved_bytes = 0;
    double reserved_fraction = 1;
  };
  enum class Kind { kCall, kUpload };

  // A place held until the ticket is destroyed. Shared so that it can ride along with
  // whatever keeps the call going (a Caller, a reactor, an upload).
  using Ticket = std::shared_ptr<const void>;

  explicit TenantAdmission(Limits limits) : limits_(limits) {}
  // The last ticket must be gone before the admission is destroyed. It may have gone on
  // another thread (a reactor's OnDone) just before: the destructor takes the mutex that
  // its release held, so that the map is read after that release in every sense.
  ~TenantAdmission() { absl::MutexLock lock(&mu_); }
  TenantAdmission(const TenantAdmission&) = delete;
  TenantAdmission& operator=(const TenantAdmission&) = delete;

  // A place of `kind` for `tenant`, or RESOURCE_EXHAUSTED naming the flag that bounds
  // them when the tenant holds all it may.
  absl::StatusOr<Ticket> Admit(Kind kind, absl::string_view tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts `bytes` of device memory that an upload of `tenant` reserves until the ticket
  // is destroyed; RESOURCE_EXHAUSTED, naming the bound and its flag, when the tenant's
  // reservations would pass Limits::reserved_bytes.
  absl::StatusOr<Ticket> Reserve(absl::string_view tenant, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The places of `kind` `tenant` holds now.
  uint64_t InUse(Kind kind, absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  const Limits& limits() const { return limits_; }

 private:
  struct Held {
    uint64_t calls = 0;
    uint64_t uploads = 0;
    uint64_t reserved_bytes = 0;
    uint64_t& of(Kind kind) { return kind == Kind::kCall ? calls : uploads; }
    uint64_t of(Kind kind) const { return kind == Kind::kCall ? calls : uploads; }
  };
  void Release(Kind kind, const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  void Unreserve(const std::string& tenant, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `it` once it holds nothing.
  void EraseIfIdleLocked(absl::flat_hash_map<std::string, Held>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TENANCY_ADMISSION_H_

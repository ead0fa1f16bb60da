#include "server/tenancy/admission.h"

#include "absl/strings/str_cat.h"

namespace gpucompute {

absl::StatusOr<TenantAdmission::Ticket> TenantAdmission::Admit(Kind kind,
                                                               absl::string_view tenant) {
  const uint64_t limit = kind == Kind::kCall ? limits_.calls : limits_.uploads;
  {
    absl::MutexLock lock(&mu_);
    uint64_t& held = held_[tenant].of(kind);
    if (limit != 0 && held >= limit) {
      const absl::string_view what = kind == Kind::kCall ? "calls in flight" : "uploads under way";
      const absl::string_view flag =
          kind == Kind::kCall ? "--max-calls-per-tenant" : "--max-uploads-per-tenant";
      const std::string who =
          tenant.empty() ? std::string("the server") : absl::StrCat("tenant '", tenant, "'");
      return absl::ResourceExhaustedError(absl::StrCat(who, " has ", held, " ", what, ", the most ",
                                                       flag, " allows; wait for some to finish"));
    }
    ++held;
  }
  // The ticket points at the admission; its deleter gives the place back.
  return Ticket(this,
                [this, kind, tenant = std::string(tenant)](const void*) { Release(kind, tenant); });
}

absl::StatusOr<TenantAdmission::Ticket> TenantAdmission::Reserve(absl::string_view tenant,
                                                                 uint64_t bytes) {
  const uint64_t limit = limits_.reserved_bytes;
  {
    absl::MutexLock lock(&mu_);
    uint64_t& held = held_[tenant].reserved_bytes;
    // held <= limit always, so the subtraction cannot wrap.
    if (limit != 0 && bytes > limit - held) {
      const std::string who =
          tenant.empty() ? std::string("the server") : absl::StrCat("tenant '", tenant, "'");
      absl::Status refused = absl::ResourceExhaustedError(absl::StrCat(
          who, " has ", held, " bytes reserved by uploads under way; this upload's ", bytes,
          " more would pass the ", limit,
          " bytes one tenant may reserve while others share the server "
          "(--max-reserved-fraction-per-tenant=",
          limits_.reserved_fraction,
          " of the memory limit); wait for those uploads to finish, or upload in parts"));
      EraseIfIdleLocked(held_.find(tenant));
      return refused;
    }
    held += bytes;
  }
  return Ticket(
      this, [this, bytes, tenant = std::string(tenant)](const void*) { Unreserve(tenant, bytes); });
}

void TenantAdmission::Release(Kind kind, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  --it->second.of(kind);
  EraseIfIdleLocked(it);
}

void TenantAdmission::Unreserve(const std::string& tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  it->second.reserved_bytes -= bytes;
  EraseIfIdleLocked(it);
}

void TenantAdmission::EraseIfIdleLocked(absl::flat_hash_map<std::string, Held>::iterator it) {
  const Held& h = it->second;
  if (h.calls == 0 && h.uploads == 0 && h.reserved_bytes == 0) held_.erase(it);
}

uint64_t TenantAdmission::InUse(Kind kind, absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second.of(kind);
}

}  // namespace gpucompute

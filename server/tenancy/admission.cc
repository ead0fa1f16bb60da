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

void TenantAdmission::Release(Kind kind, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  --it->second.of(kind);
  if (it->second.calls == 0 && it->second.uploads == 0) held_.erase(it);
}

uint64_t TenantAdmission::InUse(Kind kind, absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second.of(kind);
}

}  // namespace gpucompute

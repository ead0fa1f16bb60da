#include "server/core/buffer_registry.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/tenancy/auth.h"
#include "server/util/ids.h"
#include "server/tenancy/quotas.h"
#include "server/util/status_macros.h"

namespace gpucompute {

absl::StatusOr<MemoryLimiter::Charge> MemoryLimiter::TryCharge(uint64_t bytes,
                                                               absl::string_view tenant,
                                                               uint64_t tenant_quota) {
  // Nothing to count (an empty buffer): a tenant's entry goes once its bytes are back,
  // so a charge of nothing must not give anything back to it later.
  if (bytes == 0) return Charge();
  absl::MutexLock lock(&mu_);
  if (bytes > limit_ - std::min(used_, limit_)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", bytes, " bytes would exceed the server's memory limit: ", used_,
                     " of ", limit_, " bytes are in use"));
  }
  auto it = tenant_used_.find(tenant);
  const uint64_t held = it == tenant_used_.end() ? 0 : it->second;
  if (tenant_quota != 0 && bytes > tenant_quota - std::min(held, tenant_quota)) {
    return QuotaExceeded(tenant, "device_bytes", tenant_quota,
                         absl::StrCat(held, " bytes held, ", bytes, " more asked for"));
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  if (it == tenant_used_.end()) {
    tenant_used_.emplace(tenant, bytes);
  } else {
    it->second += bytes;
  }
  return Charge(this, bytes, std::string(tenant));
}

void MemoryLimiter::Return(absl::string_view tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
  auto it = tenant_used_.find(tenant);
  it->second -= bytes;
  if (it->second == 0) tenant_used_.erase(it);
}

uint64_t MemoryLimiter::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t MemoryLimiter::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

uint64_t MemoryLimiter::TenantUsed(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenant_used_.find(tenant);
  return it == tenant_used_.end() ? 0 : it->second;
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<int64_t> TtlNanos(double seconds) {
  if (!(seconds >= 0) || !(seconds <= kMaxTtlSeconds)) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_seconds must be a finite number from 0 to ",
                                                   static_cast<int64_t>(kMaxTtlSeconds),
                                                   " (30 days); got ", seconds));
  }
  return static_cast<int64_t>(seconds * 1e9);
}

uint64_t BufferMeta::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<uint64_t> CheckedElementCount(const std::vector<uint64_t>& shape, size_t itemsize) {
  if (shape.size() > kMaxDimensions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape has ", shape.size(), " dimensions; at most ", kMaxDimensions, " are supported"));
  }
  constexpr uint64_t kMaxBytes = std::numeric_limits<int64_t>::max();
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > kMaxBytes / itemsize / d) {
      return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "),
                                                     "] is too large: its size overflows"));
    }
    n *= d;
  }
  return n;
}

absl::Status ValidateBufferName(absl::string_view name) {
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "buffer name is ", name.size(), " bytes; at most ", kMaxNameBytes, " are allowed"));
  }
  if (name.rfind("buf-", 0) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer name '", name, "' may not start with 'buf-', which marks buffer ids"));
  }
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError("buffer name contains a control character");
    }
  }
  return absl::OkStatus();
}

std::string BufferRegistry::NameKey(absl::string_view client, absl::string_view name) {
  // The client name cannot contain a NUL byte (metadata values are printable).
  return absl::StrCat(client, absl::string_view("\0", 1), name);
}

absl::StatusOr<BufferHandle> BufferRegistry::Allocate(absl::string_view client,
                                                      absl::string_view name, DType dtype,
                                                      std::vector<uint64_t> shape, Layout layout,
                                                      int device, bool exportable) {
  RETURN_IF_ERROR(ValidateBufferName(name));
  ASSIGN_OR_RETURN(uint64_t n, CheckedElementCount(shape, DTypeSize(dtype)));
  if (device < 0 || device >= static_cast<int>(backend_.devices().size())) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device,
                                                   " does not exist; the server has ",
                                                   backend_.devices().size(), " device(s)"));
  }
  const uint64_t bytes = n * DTypeSize(dtype);
  {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckCanAddLocked(client, name));
  }
  ASSIGN_OR_RETURN(MemoryLimiter::Charge charge, ChargeFor(client, bytes));
  ASSIGN_OR_RETURN(DeviceMemory memory, exportable ? backend_.AllocateExportable(device, bytes)
                                                   : backend_.Allocate(device, bytes));

  auto entry = std::make_shared<BufferEntry>();
  entry->id = NewId("buf-");
  entry->name = std::string(name);
  entry->client = std::string(client);
  entry->dtype = dtype;
  entry->shape = std::move(shape);
  entry->layout = entry->shape.size() >= 2 ? layout : Layout::kC;
  entry->create_time_unix_nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count();
  entry->device = device;
  entry->memory = std::move(memory);
  entry->exportable = exportable;
  entry->charge = std::move(charge);
  entry->live_lease = std::shared_ptr<const Lease>(entry, &entry->lease);
  return entry;
}

absl::StatusOr<MemoryLimiter::Charge> BufferRegistry::ChargeFor(absl::string_view scope,
                                                                uint64_t bytes) const {
  const absl::string_view tenant = TenantOfScope(scope);
  return limiter_.TryCharge(bytes, tenant,
                            quotas_ != nullptr ? quotas_->For(tenant).device_bytes : 0);
}

absl::Status BufferRegistry::CheckCanAddLocked(absl::string_view client,
                                               absl::string_view name) const {
  if (quotas_ != nullptr) {
    const absl::string_view tenant = TenantOfScope(client);
    const uint64_t quota = quotas_->For(tenant).buffers;
    auto it = tenant_buffers_.find(tenant);
    const uint64_t held = it == tenant_buffers_.end() ? 0 : it->second;
    if (quota != 0 && held >= quota) {
      return QuotaExceeded(tenant, "buffers", quota, absl::StrCat(held, " buffers held"));
    }
  }
  auto count = count_by_client_.find(client);
  if (count != count_by_client_.end() && count->second >= kMaxBuffersPerClient) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a client may hold at most ", kMaxBuffersPerClient, " buffers; delete some first"));
  }
  if (!name.empty() && id_by_name_.contains(NameKey(client, name))) {
    return absl::AlreadyExistsError(absl::StrCat("a buffer named '", name, "' already exists"));
  }
  return absl::OkStatus();
}

absl::Status BufferRegistry::Register(const BufferHandle& entry) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ReserveLocked(entry));
  by_id_.emplace(entry->id, entry);
  return absl::OkStatus();
}

absl::Status BufferRegistry::ReserveLocked(const BufferHandle& entry) {
  // Checked again: other requests may have taken the name or the room since Allocate.
  RETURN_IF_ERROR(CheckCanAddLocked(entry->client, entry->name));
  if (by_id_.contains(entry->id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a buffer with id ", entry->id, " already exists"));
  }
  if (!entry->name.empty()) id_by_name_.emplace(NameKey(entry->client, entry->name), entry->id);
  ++count_by_client_[entry->client];
  ++tenant_buffers_[TenantOfScope(entry->client)];
  return absl::OkStatus();
}

absl::Status BufferRegistry::Reserve(const BufferHandle& entry) {
  absl::MutexLock lock(&mu_);
  return ReserveLocked(entry);
}

void BufferRegistry::Publish(const BufferHandle& entry) {
  absl::MutexLock lock(&mu_);
  by_id_.emplace(entry->id, entry);
}

void BufferRegistry::Unreserve(const BufferHandle& entry) {
  absl::MutexLock lock(&mu_);
  UnreserveLocked(*entry);
}

void BufferRegistry::UnreserveLocked(const BufferEntry& entry) {
  if (!entry.name.empty()) id_by_name_.erase(NameKey(entry.client, entry.name));
  auto count = count_by_client_.find(entry.client);
  if (--count->second == 0) count_by_client_.erase(count);
  auto held = tenant_buffers_.find(TenantOfScope(entry.client));
  if (--held->second == 0) tenant_buffers_.erase(held);
}

absl::StatusOr<BufferHandle> BufferRegistry::LookupLocked(absl::string_view client,
                                                          absl::string_view ref) const {
  if (ref.empty()) return absl::InvalidArgumentError("no buffer given");
  // An expired buffer the sweep has not reclaimed yet is already gone.
  const int64_t now = SteadyNanos();
  if (ref.rfind("buf-", 0) == 0) {
    auto it = by_id_.find(ref);
    // Another tenant's buffer is not found, exactly as an unknown id is.
    if (it == by_id_.end() || !SameTenant(it->second->client, client) ||
        it->second->lease.ExpiredAt(now)) {
      return absl::NotFoundError(absl::StrCat("buffer ", ref, " not found"));
    }
    return it->second;
  }
  auto name = id_by_name_.find(NameKey(client, ref));
  // A reserved name (Reserve) does not resolve until it is published.
  auto it = name == id_by_name_.end() ? by_id_.end() : by_id_.find(name->second);
  if (it == by_id_.end() || it->second->lease.ExpiredAt(now)) {
    return absl::NotFoundError(absl::StrCat("no buffer named '", ref, "'"));
  }
  return it->second;
}

absl::StatusOr<BufferHandle> BufferRegistry::Lookup(absl::string_view client,
                                                    absl::string_view ref) const {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(BufferHandle entry, LookupLocked(client, ref));
  // Under the lock, so that the sweep (which takes it exclusively) cannot reclaim the
  // buffer between the check and the renewal.
  entry->lease.Renew(SteadyNanos());
  return entry;
}

size_t BufferRegistry::ReclaimExpired() {
  // Their handles are dropped after the lock: a last handle frees device memory.
  std::vector<BufferHandle> expired;
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = SteadyNanos();
    for (const auto& [id, entry] : by_id_) {
      if (entry->lease.ExpiredAt(now)) expired.push_back(entry);
    }
    for (const BufferHandle& entry : expired) {
      by_id_.erase(entry->id);
      UnreserveLocked(*entry);
    }
  }
  for (const BufferHandle& entry : expired) NotifyRemoved(*entry);
  leases_expired_.fetch_add(expired.size());
  return expired.size();
}

absl::StatusOr<BufferHandle> BufferRegistry::Remove(absl::string_view client,
                                                    absl::string_view ref) {
  BufferHandle entry;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(entry, LookupLocked(client, ref));
    by_id_.erase(entry->id);
    UnreserveLocked(*entry);
  }
  NotifyRemoved(*entry);
  return entry;
}

void BufferRegistry::SetRemovalListener(RemovalListener listener) {
  absl::MutexLock lock(&listener_mu_);
  removal_listener_ = std::move(listener);
}

void BufferRegistry::NotifyRemoved(const BufferEntry& entry) {
  absl::ReaderMutexLock lock(&listener_mu_);
  if (removal_listener_) removal_listener_(entry);
}

std::vector<BufferHandle> BufferRegistry::List(absl::string_view client) const {
  return ListWhere([client](const BufferEntry& entry) { return entry.client == client; });
}

std::vector<BufferHandle> BufferRegistry::ListTenant(absl::string_view tenant) const {
  return ListWhere(
      [tenant](const BufferEntry& entry) { return TenantOfScope(entry.client) == tenant; });
}

std::vector<BufferHandle> BufferRegistry::ListWhere(
    absl::FunctionRef<bool(const BufferEntry&)> keep) const {
  std::vector<BufferHandle> out;
  {
    absl::ReaderMutexLock lock(&mu_);
    const int64_t now = SteadyNanos();
    for (const auto& [id, entry] : by_id_) {
      if (keep(*entry) && !entry->lease.ExpiredAt(now)) out.push_back(entry);
    }
  }
  std::sort(out.begin(), out.end(), [](const BufferHandle& a, const BufferHandle& b) {
    return std::tie(a->create_time_unix_nanos, a->id) < std::tie(b->create_time_unix_nanos, b->id);
  });
  return out;
}

std::vector<BufferHandle> BufferRegistry::ListNamed() const {
  std::vector<BufferHandle> out;
  absl::ReaderMutexLock lock(&mu_);
  const int64_t now = SteadyNanos();
  for (const auto& [id, entry] : by_id_) {
    if (!entry->name.empty() && !entry->lease.ExpiredAt(now)) out.push_back(entry);
  }
  return out;
}

size_t BufferRegistry::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return by_id_.size();
}

void BufferRegistry::ForEach(absl::FunctionRef<void(const BufferMeta&)> fn) const {
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [id, entry] : by_id_) fn(*entry);
}

}  // namespace gpucompute

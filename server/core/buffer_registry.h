// Resident buffers: their metadata, their device memory, the memory limit they are
// charged against, and the per-client names that refer to them.
#ifndef GPUCOMPUTE_SERVER_CORE_BUFFER_REGISTRY_H_
#define GPUCOMPUTE_SERVER_CORE_BUFFER_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gpucompute/v1/limits.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/tenancy/quotas.h"
#include "server/tenancy/request_limits.h"

namespace gpucompute {

enum class Layout : uint8_t { kC, kF };

// Buffers one client may hold: empty buffers cost no memory, so the memory limit alone
// would not bound them.
inline constexpr size_t kMaxBuffersPerClient = 1 << 16;
inline constexpr size_t kMaxNameBytes = 256;

// Bytes charged against the server's memory limit and against the tenant that holds
// them; returned on destruction. Every device allocation a request makes is charged from
// the moment it is made (a buffer being uploaded, staging for an overwrite, an output an
// operation has yet to write) until the memory is freed, so a tenant's quota of bytes
// covers what it holds in fact, not only its registered buffers.
class MemoryLimiter {
 public:
  class Charge {
   public:
    Charge() = default;
    Charge(Charge&& o) noexcept
        : limiter_(std::exchange(o.limiter_, nullptr)),
          bytes_(o.bytes_),
          tenant_(std::move(o.tenant_)) {}
    Charge& operator=(Charge&& o) noexcept {
      if (this != &o) {
        Release();
        limiter_ = std::exchange(o.limiter_, nullptr);
        bytes_ = o.bytes_;
        tenant_ = std::move(o.tenant_);
      }
      return *this;
    }
    ~Charge() { Release(); }

   private:
    friend class MemoryLimiter;
    Charge(MemoryLimiter* limiter, uint64_t bytes, std::string tenant)
        : limiter_(limiter), bytes_(bytes), tenant_(std::move(tenant)) {}
    void Release() {
      if (limiter_ != nullptr) limiter_->Return(tenant_, bytes_);
      limiter_ = nullptr;
    }
    MemoryLimiter* limiter_ = nullptr;
    uint64_t bytes_ = 0;
    std::string tenant_;
  };

  explicit MemoryLimiter(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Charges `bytes` to the server and to `tenant`. RESOURCE_EXHAUSTED, saying how much is
  // in use, when they pass the server's limit or the tenant's `tenant_quota` bytes
  // (0: none; the message names the quota 'device_bytes').
  absl::StatusOr<Charge> TryCharge(uint64_t bytes, absl::string_view tenant = "",
                                   uint64_t tenant_quota = 0) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t limit() const { return limit_; }
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t peak() const ABSL_LOCKS_EXCLUDED(mu_);
  // What `tenant` holds now.
  uint64_t TenantUsed(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Return(absl::string_view tenant, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const uint64_t limit_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> tenant_used_ ABSL_GUARDED_BY(mu_);
};

struct Lease;

// What a buffer is, without its memory: cheap to copy into results.
struct BufferMeta {
  std::string id;
  std::string name;    // may be empty
  std::string client;  // owner of the name
  DType dtype = DType::kFloat32;
  std::vector<uint64_t> shape;
  Layout layout = Layout::kC;
  int device = 0;
  int64_t create_time_unix_nanos = 0;
  // The buffer's lease (BufferEntry::lease), so that a copy reports the lease as it is
  // when read, not as it was when copied; weak, so that a copy keeps nothing alive. Set
  // by BufferRegistry::Allocate.
  std::weak_ptr<const Lease> live_lease;

  uint64_t num_elements() const;
  uint64_t size_bytes() const { return num_elements() * DTypeSize(dtype); }
};

// A buffer's lease: a time-to-live, and the steady-clock deadline at which the buffer
// expires unless something renews it first. Atomic because lookups renew it under the
// registry's shared lock; a ttl of 0 means no lease.
//
// While operations that write the buffer are queued or running, the lease does not run:
// a result cannot expire before it exists, however long its operation waits or runs.
// The Executor holds the lease from the submission of each such operation and lets go
// at its completion, which starts the lease afresh.
struct Lease {
  std::atomic<int64_t> ttl_nanos{0};
  std::atomic<int64_t> deadline_nanos{0};  // steady clock, since its epoch
  std::atomic<int32_t> writers{0};         // operations holding it (Hold)

  // Sets the ttl (0 ends the lease) and renews it from `now`.
  void Set(int64_t ttl, int64_t now) {
    ttl_nanos.store(ttl);
    Renew(now);
  }
  void Renew(int64_t now) {
    const int64_t ttl = ttl_nanos.load();
    if (ttl > 0) deadline_nanos.store(now + ttl);
  }
  void Hold() { writers.fetch_add(1); }
  // Renews first: a sweep that finds no writer left then finds the new deadline too.
  void Unhold(int64_t now) {
    Renew(now);
    writers.fetch_sub(1);
  }
  // Whether an operation that writes the buffer is queued or running: the deadline is
  // not known yet.
  bool held() const { return writers.load() > 0; }
  bool ExpiredAt(int64_t now) const {
    return ttl_nanos.load() > 0 && writers.load() == 0 && deadline_nanos.load() <= now;
  }
};

// Nanoseconds on the steady clock, the clock of lease deadlines.
int64_t SteadyNanos();

// INVALID_ARGUMENT unless `seconds` is a lease a request may ask for: finite, >= 0 and
// at most kMaxTtlSeconds (0: no lease). Returns it in nanoseconds.
absl::StatusOr<int64_t> TtlNanos(double seconds);

// One resident array. Metadata is immutable after creation, except the lease. The order
// of the work on it (its hazards) is the Executor's, kept under the executor's own lock.
struct BufferEntry : BufferMeta {
  Lease lease;
  DeviceMemory memory;
  // The memory came from Backend::AllocateExportable: it can be exported as a CUDA IPC
  // handle (SharedMemoryService.ExportBuffer).
  bool exportable = false;
  MemoryLimiter::Charge charge;
};

using BufferHandle = std::shared_ptr<BufferEntry>;

// Returns the element count of `shape`, or INVALID_ARGUMENT if it has more than
// kMaxDimensions dimensions or its byte size (at `itemsize` bytes an element) overflows 63
// bits. These are the ceilings of every buffer, restored ones included; the shapes
// requests ask for are held to the server's RequestLimits first (CheckShape).
absl::StatusOr<uint64_t> CheckedElementCount(const std::vector<uint64_t>& shape, size_t itemsize);

// Validates a client-chosen buffer name (empty is allowed: no name).
absl::Status ValidateBufferName(absl::string_view name);

class BufferRegistry {
 public:
  BufferRegistry(Backend& backend, MemoryLimiter& limiter) : backend_(backend), limiter_(limiter) {}

  // Allocates an entry that is not yet visible to lookups. Checks the shape, the name
  // (and that the client does not already use it) and the memory limit. `exportable`
  // takes the memory from Backend::AllocateExportable.
  absl::StatusOr<BufferHandle> Allocate(absl::string_view client, absl::string_view name,
                                        DType dtype, std::vector<uint64_t> shape, Layout layout,
                                        int device, bool exportable = false);
  // Makes an allocated entry visible. ALREADY_EXISTS if its name was taken meanwhile,
  // or its id is taken (a restored buffer keeps the id it had).
  absl::Status Register(const BufferHandle& entry);
  // Register in two steps, for a buffer that an operation creates: Reserve takes the
  // entry's name and its place among the client's buffers (ALREADY_EXISTS or
  // RESOURCE_EXHAUSTED as Register) without making it visible; Publish then makes it
  // visible, or Unreserve gives the name back. Between the two the name is taken but
  // does not resolve.
  absl::Status Reserve(const BufferHandle& entry);
  void Publish(const BufferHandle& entry);
  void Unreserve(const BufferHandle& entry);
  // Resolves a buffer id, or else one of the client's names, and renews its lease.
  // NOT_FOUND says which; a buffer whose lease has expired is not found. `client` is the
  // caller's scope (server/tenancy/auth.h): another tenant's buffer id is NOT_FOUND with the
  // message an unknown id gets.
  absl::StatusOr<BufferHandle> Lookup(absl::string_view client, absl::string_view ref) const;
  // Called with each buffer unregistered by Remove or ReclaimExpired, after the
  // registry's lock is released, so that what keeps buffers for later (prepared chains)
  // lets them go. Null: none. It must not call into the registry.
  using RemovalListener = std::function<void(const BufferEntry&)>;
  void SetRemovalListener(RemovalListener listener) ABSL_LOCKS_EXCLUDED(listener_mu_);
  // Unregisters every buffer whose lease has expired (memory as Remove); returns how many.
  size_t ReclaimExpired();
  // Buffers reclaimed by ReclaimExpired since the registry was made.
  uint64_t leases_expired() const { return leases_expired_.load(); }
  // Unregisters; the memory lives on while queued work holds the handle.
  absl::StatusOr<BufferHandle> Remove(absl::string_view client, absl::string_view ref);
  // The client's buffers, oldest first.
  std::vector<BufferHandle> List(absl::string_view client) const;
  // The buffers of every client of `tenant` ("": the scopes of no tenant), oldest first.
  std::vector<BufferHandle> ListTenant(absl::string_view tenant) const;
  // Every client's named buffers, in no particular order (for persistence).
  std::vector<BufferHandle> ListNamed() const;
  size_t size() const;
  // Calls fn for every registered buffer, under the registry's lock (for metrics): fn
  // must be quick and must not call into the registry.
  void ForEach(absl::FunctionRef<void(const BufferMeta&)> fn) const ABSL_LOCKS_EXCLUDED(mu_);
  // Enforces the tenants' buffers and device_bytes quotas from now on (null: none). Set
  // before any buffer is allocated; `quotas` must outlive the registry.
  void SetQuotas(const Quotas* quotas) { quotas_ = quotas; }
  // Charges `bytes` of device memory to the server's limit and to the tenant of `scope`,
  // within the tenant's device_bytes quota: every allocation a request makes on a
  // tenant's behalf goes through here.
  absl::StatusOr<MemoryLimiter::Charge> ChargeFor(absl::string_view scope, uint64_t bytes) const;

 private:
  // RESOURCE_EXHAUSTED if the client holds the most buffers it may or its tenant its
  // quota of buffers, ALREADY_EXISTS if it already uses `name`.
  absl::Status CheckCanAddLocked(absl::string_view client, absl::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status ReserveLocked(const BufferHandle& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnreserveLocked(const BufferEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<BufferHandle> LookupLocked(absl::string_view client, absl::string_view ref) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static std::string NameKey(absl::string_view client, absl::string_view name);
  // The unexpired buffers `keep` picks, oldest first.
  std::vector<BufferHandle> ListWhere(absl::FunctionRef<bool(const BufferEntry&)> keep) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void NotifyRemoved(const BufferEntry& entry) ABSL_LOCKS_EXCLUDED(mu_, listener_mu_);

  Backend& backend_;
  MemoryLimiter& limiter_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, BufferHandle> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> id_by_name_ ABSL_GUARDED_BY(mu_);  // NameKey -> id
  absl::flat_hash_map<std::string, size_t> count_by_client_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> leases_expired_{0};
  // Registered (and reserved) buffers by tenant, for the quotas.
  absl::flat_hash_map<std::string, uint64_t> tenant_buffers_ ABSL_GUARDED_BY(mu_);
  const Quotas* quotas_ = nullptr;
  absl::Mutex listener_mu_ ABSL_ACQUIRED_AFTER(mu_);
  RemovalListener removal_listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_BUFFER_REGISTRY_H_

// Per-tenant quotas: device bytes, buffers, streams and operations in flight, from a
// quota file. The registry and the executor enforce them where they count.
//
// The file has one entry a line, '#' starting a comment:
//   default  device_bytes=8GiB buffers=1000 streams=16 operations=256
//   tenant   alice device_bytes=32GiB streams=64
// "default" sets the quotas of every tenant (the one tenant "" of a server without
// authentication included); a "tenant" line overrides the keys it names for that tenant
// and takes the defaults for the rest. A key left out everywhere, or set to 0, is no
// quota. Sizes take the units of --memory-limit (KiB, MiB, GiB, ...).
//
// SIGHUP re-reads the file (Quotas::Replace). New quotas apply to requests from then on:
// a tenant already above a lowered quota keeps what it holds, and is refused more.
#ifndef GPUCOMPUTE_SERVER_TENANCY_QUOTAS_H_
#define GPUCOMPUTE_SERVER_TENANCY_QUOTAS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

// What one tenant may hold at once; 0 is no quota.
struct TenantQuota {
  uint64_t device_bytes = 0;  // bytes of its registered buffers
  uint64_t buffers = 0;       // its registered buffers
  uint64_t streams = 0;       // its streams, default streams included
  uint64_t operations = 0;    // its operations submitted and not yet done
};

class QuotaTable {
 public:
  // INVALID_ARGUMENT naming the line for a malformed one.
  static absl::StatusOr<QuotaTable> Parse(absl::string_view text);
  static absl::StatusOr<QuotaTable> Load(const std::string& path);

  const TenantQuota& For(absl::string_view tenant) const;

 private:
  TenantQuota defaults_;
  absl::flat_hash_map<std::string, TenantQuota> tenants_;
};

// The quotas in force, read by every request and replaced whole by a reload.
class Quotas {
 public:
  explicit Quotas(QuotaTable table) : table_(std::move(table)) {}

  TenantQuota For(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  void Replace(QuotaTable table) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  QuotaTable table_ ABSL_GUARDED_BY(mu_);
};

// RESOURCE_EXHAUSTED naming the quota `key` of `tenant`, which allows `quota`.
absl::Status QuotaExceeded(absl::string_view tenant, absl::string_view key, uint64_t quota,
                           absl::string_view what);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TENANCY_QUOTAS_H_

// Reuses host staging blocks (Backend::AllocateHostStaging) across transfers: pinned
// allocations cost far more than a chunk's copy, and fresh plain memory costs its page
// faults. Blocks come in power-of-two sizes from 64 KiB; a released block is kept for the
// next transfer while the pool holds less than its cap, and freed otherwise.
#ifndef GPUCOMPUTE_SERVER_CORE_HOST_STAGING_POOL_H_
#define GPUCOMPUTE_SERVER_CORE_HOST_STAGING_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/backend.h"

namespace gpucompute {

class HostStagingPool {
 public:
  // A block of at least the size asked for; it goes back to the pool when the last
  // copy of the pointer does, which may be after the pool is gone (it is freed then).
  using Block = std::shared_ptr<DeviceMemory>;

  HostStagingPool(Backend& backend, uint64_t max_cached_bytes);
  ~HostStagingPool();
  HostStagingPool(const HostStagingPool&) = delete;
  HostStagingPool& operator=(const HostStagingPool&) = delete;

  absl::StatusOr<Block> Acquire(uint64_t bytes);
  // Bytes of free blocks kept for reuse.
  uint64_t cached_bytes() const;

 private:
  struct Shared {
    absl::Mutex mu;
    bool open ABSL_GUARDED_BY(mu) = true;
    uint64_t max_cached_bytes;
    uint64_t cached_bytes ABSL_GUARDED_BY(mu) = 0;
    std::map<uint64_t, std::vector<DeviceMemory>> free ABSL_GUARDED_BY(mu);  // by size
  };
  static void Return(const std::shared_ptr<Shared>& shared, DeviceMemory* block);

  Backend& backend_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_CORE_HOST_STAGING_POOL_H_

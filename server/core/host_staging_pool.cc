#include "server/core/host_staging_pool.h"

#include <bit>
#include <utility>

#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

constexpr uint64_t kMinBlockBytes = uint64_t{64} << 10;

}  // namespace

HostStagingPool::HostStagingPool(Backend& backend, uint64_t max_cached_bytes)
    : backend_(backend), shared_(std::make_shared<Shared>()) {
  shared_->max_cached_bytes = max_cached_bytes;
}

HostStagingPool::~HostStagingPool() {
  absl::MutexLock lock(&shared_->mu);
  shared_->open = false;
  shared_->free.clear();
  shared_->cached_bytes = 0;
}

absl::StatusOr<HostStagingPool::Block> HostStagingPool::Acquire(uint64_t bytes) {
  const uint64_t size = std::bit_ceil(std::max(bytes, kMinBlockBytes));
  DeviceMemory memory;
  {
    absl::MutexLock lock(&shared_->mu);
    auto it = shared_->free.find(size);
    if (it != shared_->free.end() && !it->second.empty()) {
      memory = std::move(it->second.back());
      it->second.pop_back();
      shared_->cached_bytes -= size;
    }
  }
  if (memory.data() == nullptr) {
    ASSIGN_OR_RETURN(memory, backend_.AllocateHostStaging(size));
  }
  return Block(new DeviceMemory(std::move(memory)),
               [shared = shared_](DeviceMemory* block) { Return(shared, block); });
}

void HostStagingPool::Return(const std::shared_ptr<Shared>& shared, DeviceMemory* block) {
  std::unique_ptr<DeviceMemory> owned(block);
  absl::MutexLock lock(&shared->mu);
  if (!shared->open || shared->cached_bytes + block->size() > shared->max_cached_bytes) return;
  shared->cached_bytes += block->size();
  shared->free[block->size()].push_back(std::move(*block));
}

uint64_t HostStagingPool::cached_bytes() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->cached_bytes;
}

}  // namespace gpucompute

#include "server/cuda/pinned_staging.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/cuda/cuda_check.h"
#include "server/util/log.h"

namespace gpucompute::cuda {

PinnedStaging::PinnedStaging(uint64_t block_bytes, size_t max_blocks)
    : block_bytes_(block_bytes), max_blocks_(max_blocks < 1 ? 1 : max_blocks) {}

PinnedStaging::~PinnedStaging() {
  absl::MutexLock lock(&mu_);
  if (free_.size() != all_.size()) {
    Log(LogLevel::kWarning, "pinned staging blocks still in use at shutdown",
        {{"blocks", absl::StrCat(all_.size() - free_.size())}});
  }
  for (void* block : free_) LogIfFailed(cudaFreeHost(block), "cudaFreeHost");
}

absl::StatusOr<void*> PinnedStaging::Acquire(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  if (free_.empty() && all_.size() < max_blocks_) {
    void* block = nullptr;
    // Portable: the block may stage copies to any device.
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&block, block_bytes_, cudaHostAllocPortable));
    all_.push_back(block);
    return block;
  }
  if (!mu_.AwaitWithTimeout(absl::Condition(this, &PinnedStaging::HasFreeBlock),
                            absl::FromChrono(timeout))) {
    return absl::DeadlineExceededError(
        "no pinned staging block came back: the device is not completing copies");
  }
  void* block = free_.back();
  free_.pop_back();
  return block;
}

void PinnedStaging::Release(void* block) {
  absl::MutexLock lock(&mu_);
  free_.push_back(block);
}

uint64_t PinnedStaging::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return all_.size() * block_bytes_;
}

}  // namespace gpucompute::cuda

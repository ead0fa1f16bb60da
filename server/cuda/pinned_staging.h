// Reusable pinned (page-locked) host blocks through which the CUDA backend stages every
// transfer: a DMA engine reads and writes pinned memory at full link speed and without
// making the host wait, so a chunk can be copied to the device while the next one is
// still arriving from the network.
#ifndef GPUCOMPUTE_SERVER_CUDA_PINNED_STAGING_H_
#define GPUCOMPUTE_SERVER_CUDA_PINNED_STAGING_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute::cuda {

class PinnedStaging {
 public:
  // Up to `max_blocks` blocks of `block_bytes`, allocated on first need and kept.
  PinnedStaging(uint64_t block_bytes, size_t max_blocks);
  ~PinnedStaging();  // every block must have been released
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  uint64_t block_bytes() const { return block_bytes_; }
  // A free block. When all are in use, waits for a release: blocks go back as soon as the
  // DMA copy that uses them completes, so the wait is bounded by copies already queued.
  // DEADLINE_EXCEEDED if none comes back within `timeout` (a stuck device).
  absl::StatusOr<void*> Acquire(std::chrono::milliseconds timeout = std::chrono::seconds(60))
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns a block. Makes no CUDA call, so CUDA host functions may call it.
  void Release(void* block) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of pinned memory held.
  uint64_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool HasFreeBlock() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  const uint64_t block_bytes_;
  const size_t max_blocks_;
  mutable absl::Mutex mu_;
  std::vector<void*> all_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_PINNED_STAGING_H_

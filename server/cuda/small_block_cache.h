// Small device blocks the CUDA backend keeps for reuse once freed. Taking memory from the
// stream-ordered pool costs a driver call and a wait for the allocation stream, longer
// than it takes to plan one of a session's or a chain's temporaries of a few kilobytes. A freed small block therefore goes to a list for its size and the
// next allocation of that size takes it back without a CUDA call. Pure bookkeeping: the
// backend allocates and frees the blocks.
#ifndef GPUCOMPUTE_SERVER_CUDA_SMALL_BLOCK_CACHE_H_
#define GPUCOMPUTE_SERVER_CUDA_SMALL_BLOCK_CACHE_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute::cuda {

class SmallBlockCache {
 public:
  static constexpr uint64_t kMinBlockBytes = 256;  // the pool's own alignment
  static constexpr uint64_t kMaxBlockBytes = 1 << 20;

  // Keeps at most `capacity_bytes` of blocks; past that a freed block goes to the caller.
  explicit SmallBlockCache(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  SmallBlockCache(const SmallBlockCache&) = delete;
  SmallBlockCache& operator=(const SmallBlockCache&) = delete;

  // The size of the block that serves an allocation of `bytes`: the next power of two,
  // at least kMinBlockBytes. 0 when `bytes` is beyond kMaxBlockBytes: not cached.
  static uint64_t BlockBytes(uint64_t bytes);

  // A kept block of `block_bytes` (a BlockBytes result), or null when there is none.
  void* Take(uint64_t block_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps a block of `block_bytes` whose every use has completed. False when that would
  // pass the capacity: the block stays the caller's to free.
  bool Keep(void* block, uint64_t block_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every kept block, with its size, for the caller to free.
  std::vector<std::pair<void*, uint64_t>> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t kept_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr int kMinLog2 = 8;
  static constexpr int kMaxLog2 = 20;
  static_assert(kMinBlockBytes == uint64_t{1} << kMinLog2);
  static_assert(kMaxBlockBytes == uint64_t{1} << kMaxLog2);
  // The list of blocks of `block_bytes`, a power of two in [kMinBlockBytes, kMaxBlockBytes].
  static int ClassOf(uint64_t block_bytes);

  const uint64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  std::array<std::vector<void*>, kMaxLog2 - kMinLog2 + 1> free_ ABSL_GUARDED_BY(mu_);
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_SMALL_BLOCK_CACHE_H_

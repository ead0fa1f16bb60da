// Freed large blocks of the CPU backend, kept for the next allocation of the same size.
// Fresh memory pays a page fault per page on first touch: on a 2-core machine an upload
// into a new 256 MiB buffer ran at a third of the speed of the same copy into memory
// touched before. A service that keeps arrays of a few shapes asks for the same sizes
// again and again, as the CUDA backend's stream-ordered pool serves them from memory it
// keeps.
#ifndef GPUCOMPUTE_SERVER_CPU_BLOCK_CACHE_H_
#define GPUCOMPUTE_SERVER_CPU_BLOCK_CACHE_H_

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute::cpu {

class BlockCache {
 public:
  // Blocks smaller than this are left to malloc, which keeps small blocks by itself.
  static constexpr uint64_t kMinBytes = uint64_t{1} << 20;

  // Keeps at most `max_bytes` of freed blocks; 0 keeps none.
  explicit BlockCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // Frees every kept block.
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A kept block of exactly `bytes` (the most recently freed one), or null.
  void* Take(uint64_t bytes);
  // Keeps `block` (from std::aligned_alloc, of `bytes`), freeing the longest kept blocks
  // to stay within the cap; frees `block` itself when it is small or larger than the cap.
  void Give(void* block, uint64_t bytes);
  // Frees the longest kept blocks until at most `keep_bytes` remain; returns what remains.
  uint64_t Trim(uint64_t keep_bytes);
  uint64_t cached_bytes() const;

 private:
  struct Block {
    void* data;
    uint64_t bytes;
  };
  void TrimLocked(uint64_t keep_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::deque<Block> blocks_ ABSL_GUARDED_BY(mu_);  // oldest freed first
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_BLOCK_CACHE_H_

#include "server/cpu/block_cache.h"

#include <cstdlib>

namespace gpucompute::cpu {

BlockCache::~BlockCache() { Trim(0); }

void* BlockCache::Take(uint64_t bytes) {
  if (bytes < kMinBytes) return nullptr;
  absl::MutexLock lock(&mu_);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    if (it->bytes != bytes) continue;
    void* data = it->data;
    cached_bytes_ -= bytes;
    blocks_.erase(std::next(it).base());
    return data;
  }
  return nullptr;
}

void BlockCache::Give(void* block, uint64_t bytes) {
  if (bytes < kMinBytes || bytes > max_bytes_) {
    std::free(block);
    return;
  }
  absl::MutexLock lock(&mu_);
  TrimLocked(max_bytes_ - bytes);
  blocks_.push_back({block, bytes});
  cached_bytes_ += bytes;
}

uint64_t BlockCache::Trim(uint64_t keep_bytes) {
  absl::MutexLock lock(&mu_);
  TrimLocked(keep_bytes);
  return cached_bytes_;
}

void BlockCache::TrimLocked(uint64_t keep_bytes) {
  while (cached_bytes_ > keep_bytes) {
    std::free(blocks_.front().data);
    cached_bytes_ -= blocks_.front().bytes;
    blocks_.pop_front();
  }
}

uint64_t BlockCache::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

}  // namespace gpucompute::cpu

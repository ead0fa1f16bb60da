#include "server/cuda/small_block_cache.h"

#include <algorithm>
#include <bit>
#include <cassert>

namespace gpucompute::cuda {

uint64_t SmallBlockCache::BlockBytes(uint64_t bytes) {
  if (bytes > kMaxBlockBytes) return 0;
  return std::max(kMinBlockBytes, std::bit_ceil(bytes));
}

int SmallBlockCache::ClassOf(uint64_t block_bytes) {
  assert(std::has_single_bit(block_bytes) && block_bytes >= kMinBlockBytes &&
         block_bytes <= kMaxBlockBytes);
  return std::countr_zero(block_bytes) - kMinLog2;
}

void* SmallBlockCache::Take(uint64_t block_bytes) {
  absl::MutexLock lock(&mu_);
  std::vector<void*>& list = free_[ClassOf(block_bytes)];
  if (list.empty()) return nullptr;
  void* block = list.back();
  list.pop_back();
  kept_bytes_ -= block_bytes;
  return block;
}

bool SmallBlockCache::Keep(void* block, uint64_t block_bytes) {
  absl::MutexLock lock(&mu_);
  if (kept_bytes_ + block_bytes > capacity_bytes_) return false;
  free_[ClassOf(block_bytes)].push_back(block);
  kept_bytes_ += block_bytes;
  return true;
}

std::vector<std::pair<void*, uint64_t>> SmallBlockCache::TakeAll() {
  std::vector<std::pair<void*, uint64_t>> taken;
  absl::MutexLock lock(&mu_);
  for (size_t c = 0; c < free_.size(); ++c) {
    for (void* block : free_[c]) taken.emplace_back(block, kMinBlockBytes << c);
    free_[c].clear();
  }
  kept_bytes_ = 0;
  return taken;
}

uint64_t SmallBlockCache::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace gpucompute::cuda

// The CUDA backend's cache of small freed blocks, as bookkeeping alone (no GPU needed):
// size classes, reuse by class, the capacity, and handing everything back.
#include "server/cuda/small_block_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpucompute::cuda {
namespace {

// Distinct fake addresses; the cache never dereferences them.
void* Fake(uintptr_t n) { return reinterpret_cast<void*>(n * 4096); }

TEST(SmallBlockCacheTest, BlockSizesArePowersOfTwoFrom256UpTo1MiB) {
  EXPECT_EQ(SmallBlockCache::BlockBytes(0), 256u);
  EXPECT_EQ(SmallBlockCache::BlockBytes(1), 256u);
  EXPECT_EQ(SmallBlockCache::BlockBytes(256), 256u);
  EXPECT_EQ(SmallBlockCache::BlockBytes(257), 512u);
  EXPECT_EQ(SmallBlockCache::BlockBytes(4096), 4096u);
  EXPECT_EQ(SmallBlockCache::BlockBytes(4097), 8192u);
  EXPECT_EQ(SmallBlockCache::BlockBytes((1 << 20) - 1), 1u << 20);
  EXPECT_EQ(SmallBlockCache::BlockBytes(1 << 20), 1u << 20);
  EXPECT_EQ(SmallBlockCache::BlockBytes((1 << 20) + 1), 0u);  // not cached
  EXPECT_EQ(SmallBlockCache::BlockBytes(UINT64_MAX), 0u);
}

TEST(SmallBlockCacheTest, ABlockIsTakenBackOnlyForItsOwnSize) {
  SmallBlockCache cache(1 << 20);
  EXPECT_EQ(cache.Take(4096), nullptr);
  ASSERT_TRUE(cache.Keep(Fake(1), 4096));
  ASSERT_TRUE(cache.Keep(Fake(2), 4096));
  ASSERT_TRUE(cache.Keep(Fake(3), 256));
  EXPECT_EQ(cache.kept_bytes(), 4096u * 2 + 256);
  EXPECT_EQ(cache.Take(8192), nullptr);
  EXPECT_EQ(cache.Take(512), nullptr);
  std::vector<void*> taken = {cache.Take(4096), cache.Take(4096)};
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<void*>{Fake(1), Fake(2)}));
  EXPECT_EQ(cache.Take(4096), nullptr);
  EXPECT_EQ(cache.kept_bytes(), 256u);
  EXPECT_EQ(cache.Take(256), Fake(3));
  EXPECT_EQ(cache.kept_bytes(), 0u);
}

TEST(SmallBlockCacheTest, ABlockPastTheCapacityStaysTheCallers) {
  SmallBlockCache cache(8192);
  ASSERT_TRUE(cache.Keep(Fake(1), 4096));
  ASSERT_TRUE(cache.Keep(Fake(2), 4096));
  EXPECT_FALSE(cache.Keep(Fake(3), 256));
  EXPECT_EQ(cache.kept_bytes(), 8192u);
  // Taking one makes room again.
  ASSERT_NE(cache.Take(4096), nullptr);
  EXPECT_TRUE(cache.Keep(Fake(3), 256));
  EXPECT_EQ(cache.kept_bytes(), 4096u + 256);
}

TEST(SmallBlockCacheTest, TakeAllHandsBackEveryBlockWithItsSize) {
  SmallBlockCache cache(1 << 22);
  ASSERT_TRUE(cache.Keep(Fake(1), 256));
  ASSERT_TRUE(cache.Keep(Fake(2), 1 << 20));
  ASSERT_TRUE(cache.Keep(Fake(3), 1 << 20));
  std::vector<std::pair<void*, uint64_t>> all = cache.TakeAll();
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::pair<void*, uint64_t>>{
                     {Fake(1), 256}, {Fake(2), 1 << 20}, {Fake(3), 1 << 20}}));
  EXPECT_EQ(cache.kept_bytes(), 0u);
  EXPECT_EQ(cache.Take(256), nullptr);
  EXPECT_TRUE(cache.TakeAll().empty());
}

}  // namespace
}  // namespace gpucompute::cuda

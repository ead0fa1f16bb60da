#include "server/cpu/block_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "server/cpu/cpu_backend.h"
#include "tests/support/test_util.h"

namespace gpucompute::cpu {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

void* NewBlock(uint64_t bytes) { return std::aligned_alloc(256, bytes); }

TEST(BlockCacheTest, KeepsFreedBlocksBySizeWithinTheCap) {
  BlockCache cache(5 * kMiB);
  void* a = NewBlock(2 * kMiB);
  void* b = NewBlock(2 * kMiB);
  void* c = NewBlock(kMiB);
  cache.Give(a, 2 * kMiB);
  cache.Give(b, 2 * kMiB);
  cache.Give(c, kMiB);
  EXPECT_EQ(cache.cached_bytes(), 5 * kMiB);
  // Exact sizes only, the last freed first.
  EXPECT_EQ(cache.Take(3 * kMiB), nullptr);
  EXPECT_EQ(cache.Take(2 * kMiB), b);
  EXPECT_EQ(cache.cached_bytes(), 3 * kMiB);
  // Over the cap: the longest kept block (a) goes.
  void* d = NewBlock(3 * kMiB);
  cache.Give(d, 3 * kMiB);
  EXPECT_EQ(cache.cached_bytes(), 4 * kMiB);
  EXPECT_EQ(cache.Take(2 * kMiB), nullptr);
  EXPECT_EQ(cache.Take(kMiB), c);
  std::free(b);
  std::free(c);
  // Small blocks and blocks over the cap are not kept.
  cache.Give(NewBlock(kMiB - 256), kMiB - 256);
  cache.Give(NewBlock(6 * kMiB), 6 * kMiB);
  EXPECT_EQ(cache.cached_bytes(), 3 * kMiB);
  EXPECT_EQ(cache.Trim(kMiB), 0u);
  EXPECT_EQ(cache.Take(3 * kMiB), nullptr);
}

TEST(BlockCacheTest, CpuBackendReusesFreedBuffersAndTrimReturnsThem) {
  CpuBackend backend(1);
  const uint64_t bytes = 8 * kMiB + 100;
  void* first = nullptr;
  {
    ASSIGN_OR_FAIL(DeviceMemory memory, backend.Allocate(0, bytes));
    first = memory.data();
    std::memset(memory.data(), 7, bytes);
    EXPECT_EQ(backend.MemoryPoolUsage(0).used_bytes, bytes);
    EXPECT_EQ(backend.MemoryPoolUsage(0).reserved_bytes, bytes);
  }
  PoolUsage freed = backend.MemoryPoolUsage(0);
  EXPECT_EQ(freed.used_bytes, 0u);
  EXPECT_EQ(freed.reserved_bytes, 8 * kMiB + 256);  // the block, at its allocated size
  {
    ASSIGN_OR_FAIL(DeviceMemory again, backend.Allocate(0, bytes));
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(backend.MemoryPoolUsage(0).reserved_bytes, bytes);
    // What live allocations use is never trimmed.
    ASSIGN_OR_FAIL(const PoolUsage kept, backend.TrimMemoryPool(0, 0));
    EXPECT_EQ(kept.used_bytes, bytes);
    EXPECT_EQ(kept.reserved_bytes, bytes);
  }
  ASSIGN_OR_FAIL(const PoolUsage trimmed, backend.TrimMemoryPool(0, 0));
  EXPECT_EQ(trimmed.reserved_bytes, 0u);
  EXPECT_EQ(trimmed.used_bytes, 0u);
  EXPECT_EQ(backend.TrimMemoryPool(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpucompute::cpu

// The buffer registry: names, lookups, the memory limit and the per-client buffer bound.
#include "server/core/buffer_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/tenancy/auth.h"
#include "server/cpu/cpu_backend.h"
#include "server/util/ids.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

class BufferRegistryTest : public ::testing::Test {
 protected:
  BufferRegistryTest() : backend_(1), limiter_(1 << 20), registry_(backend_, limiter_) {}

  absl::StatusOr<BufferHandle> Add(const std::string& client, const std::string& name, uint64_t n) {
    absl::StatusOr<BufferHandle> b =
        registry_.Allocate(client, name, DType::kFloat32, {n}, Layout::kC, 0);
    if (!b.ok()) return b;
    if (absl::Status s = registry_.Register(*b); !s.ok()) return s;
    return b;
  }

  cpu::CpuBackend backend_;
  MemoryLimiter limiter_;
  BufferRegistry registry_;
};

TEST_F(BufferRegistryTest, MemoryLimitIsExactAndReturnedOnRelease) {
  absl::StatusOr<BufferHandle> a = Add("c", "", (1 << 20) / 4);  // exactly the limit
  ASSERT_OK(a);
  EXPECT_EQ(limiter_.used(), 1u << 20);
  absl::StatusOr<BufferHandle> b = Add("c", "", 1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.size(), 1u);
  ASSERT_OK(registry_.Remove("c", (*a)->id));
  EXPECT_EQ(limiter_.used(), 1u << 20) << "the caller still holds the handle";
  a->reset();
  EXPECT_EQ(limiter_.used(), 0u);
  EXPECT_EQ(limiter_.peak(), 1u << 20);
}

TEST(MemoryLimiterTest, ChargesTenantsWithinTheirQuotaAndTheServersLimit) {
  MemoryLimiter limiter(1000);
  absl::StatusOr<MemoryLimiter::Charge> a = limiter.TryCharge(300, "alice", 500);
  ASSERT_OK(a);
  // Empty charges come and go in any order, also between others of the same tenant.
  absl::StatusOr<MemoryLimiter::Charge> empty = limiter.TryCharge(0, "alice", 500);
  ASSERT_OK(empty);
  absl::StatusOr<MemoryLimiter::Charge> b = limiter.TryCharge(200, "alice", 500);
  ASSERT_OK(b);
  *empty = MemoryLimiter::Charge();
  EXPECT_EQ(limiter.TenantUsed("alice"), 500u);
  const absl::Status over = limiter.TryCharge(1, "alice", 500).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "tenant 'alice' is at its quota 'device_bytes' of 500 (500 bytes held, 1 more asked "
            "for); free some first or ask for a larger quota");
  // bob is held to the server's limit, which alice's bytes count against.
  absl::StatusOr<MemoryLimiter::Charge> c = limiter.TryCharge(500, "bob");
  ASSERT_OK(c);
  const absl::Status full = limiter.TryCharge(1, "bob").status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("server's memory limit: 1000 of 1000"), std::string::npos) << full;
  EXPECT_EQ(limiter.used(), 1000u);
  // A moved charge is returned once, by its last owner.
  MemoryLimiter::Charge moved = *std::move(a);
  *a = MemoryLimiter::Charge();
  EXPECT_EQ(limiter.TenantUsed("alice"), 500u);
  moved = MemoryLimiter::Charge();
  EXPECT_EQ(limiter.TenantUsed("alice"), 200u);
  *b = MemoryLimiter::Charge();
  *c = MemoryLimiter::Charge();
  EXPECT_EQ(limiter.TenantUsed("alice"), 0u);
  EXPECT_EQ(limiter.TenantUsed("bob"), 0u);
  EXPECT_EQ(limiter.used(), 0u);
  EXPECT_EQ(limiter.peak(), 1000u);
}

TEST_F(BufferRegistryTest, EmptyBuffersOutliveTheirTenantsBytes) {
  // Either order of release: the empty buffer's charge of nothing must not touch the
  // tenant's count, which is gone once the other buffer's bytes are back.
  for (const bool empty_first : {false, true}) {
    SCOPED_TRACE(empty_first);
    absl::StatusOr<BufferHandle> full = Add("c", "", 4);
    absl::StatusOr<BufferHandle> empty = Add("c", "", 0);
    ASSERT_OK(full);
    ASSERT_OK(empty);
    EXPECT_EQ(limiter_.TenantUsed(TenantOfScope("c")), 16u);
    for (absl::StatusOr<BufferHandle>* b :
         empty_first ? std::vector{&empty, &full} : std::vector{&full, &empty}) {
      ASSERT_OK(registry_.Remove("c", (**b)->id));
      b->value().reset();
    }
    EXPECT_EQ(limiter_.used(), 0u);
    EXPECT_EQ(limiter_.TenantUsed(TenantOfScope("c")), 0u);
  }
}

TEST_F(BufferRegistryTest, NamesArePerClientAndResolveBeforeIds) {
  absl::StatusOr<BufferHandle> a = Add("c", "x", 4);
  ASSERT_OK(a);
  EXPECT_EQ(Add("c", "x", 4).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_OK(Add("d", "x", 4));
  EXPECT_EQ(registry_.Lookup("c", "x").value(), *a);
  EXPECT_EQ(registry_.Lookup("d", (*a)->id).value(), *a) << "ids are global capabilities";
  EXPECT_EQ(registry_.Lookup("e", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Lookup("c", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Add("c", "buf-1", 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Add("c", std::string(kMaxNameBytes + 1, 'n'), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Add("c", "tab\there", 4).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(registry_.Remove("c", "x"));
  EXPECT_OK(Add("c", "x", 4)) << "a deleted buffer's name is free again";
}

TEST_F(BufferRegistryTest, ShapesAreChecked) {
  EXPECT_EQ(CheckedElementCount({1, 2, 3}, 8).value(), 6u);
  EXPECT_EQ(CheckedElementCount({}, 8).value(), 1u);
  EXPECT_EQ(CheckedElementCount({0, 1u << 31}, 8).value(), 0u);
  EXPECT_EQ(CheckedElementCount(std::vector<uint64_t>(kMaxDimensions + 1, 1), 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedElementCount({1ull << 32, 1ull << 32}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedElementCount({1ull << 61}, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Allocate("c", "", DType::kFloat32, {4}, Layout::kC, 1).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "device 1 does not exist";
}

TEST_F(BufferRegistryTest, BuffersPerClientAreBounded) {
  for (size_t i = 0; i < kMaxBuffersPerClient; ++i) ASSERT_OK(Add("c", "", 0)) << i;
  absl::StatusOr<BufferHandle> over = Add("c", "", 0);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_OK(Add("d", "", 0)) << "the bound is per client";
  std::vector<BufferHandle> mine = registry_.List("c");
  ASSERT_EQ(mine.size(), kMaxBuffersPerClient);
  ASSERT_OK(registry_.Remove("c", mine.front()->id));
  EXPECT_OK(Add("c", "", 0));
}

TEST_F(BufferRegistryTest, TheRemovalListenerHearsOfEveryBufferUnregistered) {
  std::vector<std::string> heard;
  registry_.SetRemovalListener([&](const BufferEntry& entry) { heard.push_back(entry.id); });
  ASSIGN_OR_FAIL(BufferHandle removed, Add("c", "a", 4));
  ASSIGN_OR_FAIL(BufferHandle expiring, Add("c", "b", 4));
  ASSIGN_OR_FAIL(BufferHandle kept, Add("c", "k", 4));
  // A failed removal is not heard of.
  EXPECT_EQ(registry_.Remove("c", "nothing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(heard.empty());
  ASSERT_OK(registry_.Remove("c", "a"));
  EXPECT_EQ(heard, std::vector<std::string>{removed->id});
  expiring->lease.Set(1, SteadyNanos() - 10);  // expired already
  EXPECT_EQ(registry_.ReclaimExpired(), 1u);
  EXPECT_EQ(heard, (std::vector<std::string>{removed->id, expiring->id}));
  // Once cleared, nothing more is heard.
  registry_.SetRemovalListener(nullptr);
  ASSERT_OK(registry_.Remove("c", "k"));
  EXPECT_EQ(heard.size(), 2u);
}

TEST(NewIdTest, IdsAreThePrefixAnd32HexDigitsAndNeverRepeat) {
  // More ids than one block of randomness serves, on two threads.
  std::vector<std::string> a, b;
  std::thread other([&] {
    for (int i = 0; i < 3000; ++i) b.push_back(NewId("buf-"));
  });
  for (int i = 0; i < 3000; ++i) a.push_back(NewId("buf-"));
  other.join();
  std::set<std::string> seen;
  for (const auto* ids : {&a, &b}) {
    for (const std::string& id : *ids) {
      ASSERT_EQ(id.size(), 4u + 32u) << id;
      EXPECT_EQ(id.substr(0, 4), "buf-");
      EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
      EXPECT_TRUE(seen.insert(id).second) << "repeated: " << id;
    }
  }
  // Every hex digit shows up in each position over so many ids (not a constant tail).
  for (size_t pos = 4; pos < 36; ++pos) {
    std::set<char> digits;
    for (const std::string& id : a) digits.insert(id[pos]);
    EXPECT_EQ(digits.size(), 16u) << "position " << pos;
  }
}

}  // namespace
}  // namespace gpucompute

// The executor's ordering guarantees, on the CPU backend: stream order, the three
// cross-stream hazards, host accesses, deletion while in use, failures and retention.
#include "server/executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "server/buffer_registry.h"
#include "server/cpu/cpu_backend.h"

namespace gpucompute {
namespace {

using std::chrono::milliseconds;

class ExecutorTest : public ::testing::Test {
 protected:
  ExecutorTest() : backend_(2), limiter_(1ull << 30), registry_(backend_, limiter_), executor_(backend_) {}

  BufferHandle NewBuffer(uint64_t n) {
    absl::StatusOr<BufferHandle> b = registry_.Allocate("c", "", DType::kInt64, {n}, Layout::kC, 0);
    EXPECT_TRUE(b.ok()) << b.status();
    std::memset((*b)->memory.data(), 0, (*b)->size_bytes());
    return *b;
  }

  static int64_t At(const BufferHandle& b, size_t i) { return static_cast<const int64_t*>(b->memory.data())[i]; }

  // An operation that holds its stream for `delay`, then sets every element to `value`.
  // The delay runs on the stream like device work would, so a missing dependency shows.
  Executor::OpSpec SlowFill(const BufferHandle& b, int64_t value, milliseconds delay) {
    Executor::OpSpec spec;
    spec.kind = OpKind::kFill;
    spec.accesses = {{b, true}};
    spec.launch = [this, b, value, delay](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
      absl::Status st = s.OnComplete([delay](absl::Status) { std::this_thread::sleep_for(delay); });
      if (!st.ok()) return st;
      uint64_t bits;
      std::memcpy(&bits, &value, 8);
      st = backend_.Fill(s, b->memory, DType::kInt64, bits, static_cast<int64_t>(b->num_elements()));
      if (!st.ok()) return st;
      return LaunchInfo{};
    };
    return spec;
  }

  // dst = src, whole buffer.
  Executor::OpSpec CopyOp(const BufferHandle& src, const BufferHandle& dst) {
    Executor::OpSpec spec;
    spec.kind = OpKind::kCopy;
    spec.accesses = {{src, false}, {dst, true}};
    spec.launch = [this, src, dst](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
      absl::Status st = backend_.Copy(s, src->memory, 0, dst->memory, 0, src->size_bytes());
      if (!st.ok()) return st;
      return LaunchInfo{};
    };
    return spec;
  }

  std::shared_ptr<Operation> Submit(const std::string& stream, Executor::OpSpec spec) {
    absl::StatusOr<std::shared_ptr<Operation>> op = executor_.Submit("c", stream, std::move(spec));
    EXPECT_TRUE(op.ok()) << op.status();
    return *op;
  }

  OperationStatus Wait(const std::shared_ptr<Operation>& op) {
    std::promise<void> done;
    executor_.OnDone(op, [&] { done.set_value(); });
    done.get_future().wait();
    return executor_.GetStatus(*op);
  }

  std::string NewStream() {
    absl::StatusOr<StreamInfo> s = executor_.CreateStream("c", 0);
    EXPECT_TRUE(s.ok()) << s.status();
    return s->id;
  }

  cpu::CpuBackend backend_;
  MemoryLimiter limiter_;
  BufferRegistry registry_;
  Executor executor_;
};

TEST_F(ExecutorTest, OneStreamRunsInOrder) {
  BufferHandle b = NewBuffer(1000);
  std::shared_ptr<Operation> last;
  for (int i = 1; i <= 20; ++i) last = Submit("", SlowFill(b, i, milliseconds(i % 3)));
  EXPECT_TRUE(Wait(last).error.ok());
  EXPECT_EQ(At(b, 0), 20);
  EXPECT_EQ(At(b, 999), 20);
}

TEST_F(ExecutorTest, ReadAfterWriteAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  Submit(NewStream(), SlowFill(x, 7, milliseconds(100)));
  OperationStatus copy = Wait(Submit(NewStream(), CopyOp(x, y)));
  ASSERT_TRUE(copy.error.ok());
  EXPECT_EQ(At(y, 0), 7);
  EXPECT_EQ(At(y, (1 << 16) - 1), 7);
}

TEST_F(ExecutorTest, WriteAfterReadAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  Wait(Submit("", SlowFill(x, 1, milliseconds(0))));
  const std::string a = NewStream();
  // The reader is held up behind a slow operation on its own stream...
  BufferHandle other = NewBuffer(16);
  Submit(a, SlowFill(other, 0, milliseconds(100)));
  std::shared_ptr<Operation> read = Submit(a, CopyOp(x, y));
  // ...and the later writer on another stream must not overtake it.
  std::shared_ptr<Operation> write = Submit(NewStream(), SlowFill(x, 2, milliseconds(0)));
  Wait(write);
  Wait(read);
  EXPECT_EQ(At(y, 0), 1);
  EXPECT_EQ(At(x, 0), 2);
}

TEST_F(ExecutorTest, WriteAfterWriteAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  std::shared_ptr<Operation> first = Submit(NewStream(), SlowFill(x, 1, milliseconds(100)));
  std::shared_ptr<Operation> second = Submit(NewStream(), SlowFill(x, 2, milliseconds(0)));
  Wait(second);
  Wait(first);
  EXPECT_EQ(At(x, 0), 2);
}

TEST_F(ExecutorTest, IndependentStreamsOverlap) {
  BufferHandle x = NewBuffer(16);
  BufferHandle y = NewBuffer(16);
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Operation> a = Submit(NewStream(), SlowFill(x, 1, milliseconds(300)));
  std::shared_ptr<Operation> b = Submit(NewStream(), SlowFill(y, 1, milliseconds(300)));
  Wait(a);
  Wait(b);
  // Serialised they would take 600 ms; the bound leaves ample room for a slow machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(550));
}

TEST_F(ExecutorTest, HostAccessWaitsForWritersAndHoldsBackLaterWriters) {
  BufferHandle x = NewBuffer(1 << 16);
  Submit(NewStream(), SlowFill(x, 5, milliseconds(100)));
  std::promise<int64_t> seen;
  std::shared_ptr<HostAccess> access =
      executor_.AcquireHostAccess({{x, false}}, [&](const std::shared_ptr<HostAccess>&) { seen.set_value(At(x, 0)); });
  EXPECT_EQ(seen.get_future().get(), 5);
  std::shared_ptr<Operation> write = Submit(NewStream(), SlowFill(x, 6, milliseconds(0)));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(executor_.GetStatus(*write).done()) << "a writer overtook an active host read";
  EXPECT_EQ(At(x, 0), 5);
  executor_.Release(access);
  Wait(write);
  EXPECT_EQ(At(x, 0), 6);
}

TEST_F(ExecutorTest, BufferDroppedWhileQueuedStaysAliveUntilDone) {
  const uint64_t before = limiter_.used();
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  Submit("", SlowFill(x, 3, milliseconds(100)));
  std::shared_ptr<Operation> copy = Submit("", CopyOp(x, y));
  x.reset();  // as DeleteBuffer does: the registry and the caller let go
  EXPECT_GT(limiter_.used(), before + (1 << 16) * 8) << "x was freed while queued work uses it";
  Wait(copy);
  EXPECT_EQ(At(y, 0), 3);
  EXPECT_EQ(limiter_.used(), before + (1 << 16) * 8) << "x was not freed after its work finished";
}

TEST_F(ExecutorTest, FailedLaunchFailsOnlyThatOperation) {
  BufferHandle x = NewBuffer(16);
  Executor::OpSpec bad;
  bad.kind = OpKind::kElementwise;
  bad.accesses = {{x, true}};
  bad.launch = [](Stream&, OpResult&) -> absl::StatusOr<LaunchInfo> {
    return absl::ResourceExhaustedError("no scratch memory");
  };
  OperationStatus failed = Wait(Submit("", std::move(bad)));
  EXPECT_EQ(failed.state, OperationStatus::State::kFailed);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed.error.message(), "no scratch memory");
  OperationStatus next = Wait(Submit("", SlowFill(x, 4, milliseconds(0))));
  EXPECT_EQ(next.state, OperationStatus::State::kSucceeded);
  EXPECT_EQ(At(x, 15), 4);
}

TEST_F(ExecutorTest, SynchronizeWaitsForEverythingSubmitted) {
  BufferHandle x = NewBuffer(16);
  const std::string s = NewStream();
  for (int i = 1; i <= 5; ++i) Submit(s, SlowFill(x, i, milliseconds(20)));
  std::promise<int64_t> at_sync;
  ASSERT_TRUE(executor_.Synchronize(s, [&] { at_sync.set_value(At(x, 0)); }).ok());
  EXPECT_EQ(at_sync.get_future().get(), 5);
}

TEST_F(ExecutorTest, StreamErrors) {
  EXPECT_EQ(executor_.Submit("c", "str-0000", SlowFill(NewBuffer(1), 1, milliseconds(0))).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<StreamInfo> def = executor_.DefaultStream("c", 0);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(executor_.DeleteStream("c", def->id, [] {}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(executor_.CreateStream("c", 1).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string s = NewStream();
  BufferHandle x = NewBuffer(16);
  Submit(s, SlowFill(x, 9, milliseconds(50)));
  std::promise<int64_t> deleted;
  ASSERT_TRUE(executor_.DeleteStream("c", s, [&] { deleted.set_value(At(x, 0)); }).ok());
  EXPECT_EQ(deleted.get_future().get(), 9) << "a stream was deleted before its work finished";
  EXPECT_EQ(executor_.Submit("c", s, SlowFill(x, 1, milliseconds(0))).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ExecutorTest, StreamsPerClientAreLimited) {
  for (size_t i = 0; i + 1 < Executor::kMaxStreamsPerClient; ++i) NewStream();  // +1: the default stream
  ASSERT_TRUE(executor_.DefaultStream("c", 0).ok());
  EXPECT_EQ(executor_.CreateStream("c", 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(executor_.CreateStream("other", 0).ok());
}

TEST_F(ExecutorTest, FinishedOperationsAreRetainedWithinBounds) {
  // Each operation leaves 1 MiB of inline values: the byte bound evicts before the count.
  auto with_values = [&] {
    Executor::OpSpec spec = SlowFill(NewBuffer(1), 0, milliseconds(0));
    auto fill = std::move(spec.launch);
    spec.launch = [fill = std::move(fill)](Stream& s, OpResult& r) mutable -> absl::StatusOr<LaunchInfo> {
      r.values_dtype = DType::kFloat64;
      r.values.assign(1 << 20, 0);
      return fill(s, r);
    };
    return Submit("", std::move(spec));
  };
  const size_t fit = Executor::kRetainedValueBytes >> 20;
  std::shared_ptr<Operation> first = with_values();
  std::shared_ptr<Operation> last;
  for (size_t i = 0; i < fit; ++i) last = with_values();
  Wait(last);
  EXPECT_EQ(executor_.FindOperation(first->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(executor_.FindOperation(last->id()).ok());
}

TEST_F(ExecutorTest, TimingIsRecorded) {
  BufferHandle x = NewBuffer(16);
  Executor::OpSpec spec = SlowFill(x, 1, milliseconds(30));
  spec.bytes_written = 128;
  spec.flops = 16;
  OperationStatus st = Wait(Submit("", std::move(spec)));
  EXPECT_GE(st.timing.device_seconds, 0.025);
  EXPECT_GE(st.timing.queued_seconds, 0.0);
  EXPECT_EQ(st.timing.bytes_written, 128u);
  EXPECT_EQ(executor_.Stats()[static_cast<int>(OpKind::kFill)].count, 1u);
}

}  // namespace
}  // namespace gpucompute

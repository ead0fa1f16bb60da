// The executor's ordering guarantees: stream order, the three cross-stream hazards, host
// accesses, deletion while in use, failures, retention and timing. The backend is scripted
// (tests/support/scripted_backend.h): each operation's device work is one named kernel that the
// test finishes itself, so every test states what must not have started yet, and why,
// before it lets the work it waits for finish. No sleeps, no timing.
#include "server/core/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/tenancy/auth.h"
#include "server/core/buffer_registry.h"
#include "server/tenancy/quotas.h"
#include "server/util/status_macros.h"
#include "tests/support/scripted_backend.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

using ::gpucompute::testing::ScriptedBackend;
using State = OperationStatus::State;

class ExecutorTest : public ::testing::Test {
 protected:
  ExecutorTest() : limiter_(1ull << 30), registry_(backend_, limiter_) {
    absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(backend_);
    EXPECT_OK(executor);
    if (executor.ok()) executor_ = *std::move(executor);
  }
  // Lets all submitted work finish, so that the executor's destructor has none to wait for.
  ~ExecutorTest() override { backend_.RunUntilIdle(); }

  BufferHandle NewBuffer(uint64_t n) {
    absl::StatusOr<BufferHandle> b = registry_.Allocate("c", "", DType::kInt64, {n}, Layout::kC, 0);
    EXPECT_OK(b);
    std::memset((*b)->memory.data(), 0, (*b)->size_bytes());
    return *b;
  }

  static int64_t At(const BufferHandle& b, size_t i) {
    return static_cast<const int64_t*>(b->memory.data())[i];
  }

  // An operation whose device work is kernel `name`, which sets every element of `b` to
  // `value` when the test finishes it.
  Executor::OpSpec Write(const std::string& name, const BufferHandle& b, int64_t value) {
    Executor::OpSpec spec;
    spec.kind = OperationKind::kFill;
    spec.accesses = {{b, true}};
    spec.launch = [this, name, data = static_cast<int64_t*>(b->memory.data()),
                   n = b->num_elements(),
                   value](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
      RETURN_IF_ERROR(backend_.Launch(s, name, [=] { std::fill(data, data + n, value); }));
      return LaunchInfo{};
    };
    return spec;
  }

  // dst = src (whole buffers), as kernel `name`.
  Executor::OpSpec CopyOp(const std::string& name, const BufferHandle& src,
                          const BufferHandle& dst) {
    Executor::OpSpec spec;
    spec.kind = OperationKind::kCopy;
    spec.accesses = {{src, false}, {dst, true}};
    spec.launch = [this, name, from = src->memory.data(), to = dst->memory.data(),
                   bytes = src->size_bytes()](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
      RETURN_IF_ERROR(backend_.Launch(s, name, [=] { std::memcpy(to, from, bytes); }));
      return LaunchInfo{};
    };
    return spec;
  }

  std::shared_ptr<Operation> Submit(const std::string& stream, Executor::OpSpec spec) {
    absl::StatusOr<std::shared_ptr<Operation>> op = executor_->Submit("c", stream, std::move(spec));
    EXPECT_OK(op);
    return op.ok() ? *op : nullptr;
  }

  State StateOf(const std::shared_ptr<Operation>& op) { return executor_->GetStatus(*op).state; }

  std::string NewStream(const std::string& client = "c") {
    absl::StatusOr<StreamInfo> s = executor_->CreateStream(client, 0);
    EXPECT_OK(s);
    return s.ok() ? s->id : std::string();
  }

  // Enforces the tenants' quotas in `table` (QuotaTable's syntax) from now on.
  void SetQuotas(absl::string_view table) {
    absl::StatusOr<QuotaTable> parsed = QuotaTable::Parse(table);
    ASSERT_OK(parsed);
    quotas_ = std::make_unique<Quotas>(*std::move(parsed));
    executor_->SetQuotas(quotas_.get());
  }

  // Declared first: the executor's streams and the buffers' memory belong to it.
  ScriptedBackend backend_;
  MemoryLimiter limiter_;
  BufferRegistry registry_;
  std::unique_ptr<Quotas> quotas_;  // outlives the executor, which reads it
  std::unique_ptr<Executor> executor_;
};

TEST_F(ExecutorTest, OneStreamRunsInOrder) {
  BufferHandle b = NewBuffer(1000);
  std::vector<std::shared_ptr<Operation>> ops;
  for (int i = 1; i <= 20; ++i) ops.push_back(Submit("", Write(absl::StrCat("w", i), b, i)));
  backend_.RunReady();
  for (int i = 1; i <= 20; ++i) {
    SCOPED_TRACE(i);
    const std::string name = absl::StrCat("w", i);
    ASSERT_TRUE(backend_.Started(name));
    if (i < 20) {
      EXPECT_FALSE(backend_.Started(absl::StrCat("w", i + 1)))
          << "started before its predecessor finished";
      EXPECT_EQ(StateOf(ops[i]), State::kQueued);
    }
    backend_.Finish(name);
    EXPECT_EQ(StateOf(ops[i - 1]), State::kSucceeded);
    EXPECT_EQ(At(b, 0), i);
  }
  std::vector<std::string> order;
  for (int i = 1; i <= 20; ++i) order.push_back(absl::StrCat("w", i));
  EXPECT_EQ(backend_.started_order(), order);
  EXPECT_EQ(At(b, 999), 20);
}

TEST_F(ExecutorTest, SubmitAllQueuesInOrderAndStopsAtTheFirstRefused) {
  BufferHandle x = NewBuffer(8);
  BufferHandle y = NewBuffer(8);
  const std::string s = NewStream();
  // A copy of x into y, then a write of y, then one on a stream that does not exist,
  // then one that is never looked at.
  std::vector<Executor::OpSpec> specs;
  specs.push_back(Write("x1", x, 1));
  specs.push_back(CopyOp("copy", x, y));
  specs.push_back(Write("y2", y, 2));
  specs.push_back(Write("never", x, 9));
  int done = 0;
  for (Executor::OpSpec& spec : specs) {
    spec.on_done = [&done](const std::shared_ptr<Operation>& op) {
      EXPECT_TRUE(Executor::FinalStatus(*op).done());
      ++done;
    };
  }
  std::vector<Executor::SubmitItem> items = {
      {s, &specs[0]}, {s, &specs[1]}, {"str-missing", &specs[2]}, {s, &specs[3]}};
  Executor::Submitted submitted = executor_->SubmitAll("c", items);
  ASSERT_EQ(submitted.operations.size(), 2u);
  EXPECT_EQ(submitted.refused.code(), absl::StatusCode::kNotFound) << submitted.refused;
  // The refused and the later items keep their specs; the accepted ones gave theirs.
  EXPECT_NE(specs[2].launch, nullptr);
  EXPECT_NE(specs[2].on_done, nullptr);
  EXPECT_NE(specs[3].launch, nullptr);
  EXPECT_EQ(specs[0].launch, nullptr);
  EXPECT_EQ(specs[1].on_done, nullptr);
  // Neither the refused item nor the one after it can be found; the queued ones can.
  for (const auto& op : submitted.operations) {
    EXPECT_OK(executor_->FindOperation("c", op->id()));
    EXPECT_EQ(op->stream_id(), s);
  }
  backend_.RunUntilIdle();
  EXPECT_EQ(backend_.started_order(), (std::vector<std::string>{"x1", "copy"}));
  EXPECT_EQ(At(y, 7), 1);
  EXPECT_EQ(done, 2);
  EXPECT_EQ(executor_->ListStreams("c").front().pending_operations, 0u);
}

TEST_F(ExecutorTest, ReadAfterWriteAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  std::shared_ptr<Operation> write = Submit(NewStream(), Write("write x", x, 7));
  std::shared_ptr<Operation> read = Submit(NewStream(), CopyOp("read x", x, y));
  backend_.RunReady();
  EXPECT_TRUE(backend_.Started("write x"));
  EXPECT_FALSE(backend_.Started("read x")) << "the reader started before the writer finished";
  EXPECT_EQ(StateOf(read), State::kQueued);

  backend_.Finish("write x");
  EXPECT_EQ(StateOf(write), State::kSucceeded);
  EXPECT_TRUE(backend_.Started("read x"));
  backend_.Finish("read x");
  EXPECT_EQ(StateOf(read), State::kSucceeded);
  EXPECT_EQ(At(y, 0), 7);
  EXPECT_EQ(At(y, (1 << 16) - 1), 7);
}

TEST_F(ExecutorTest, WriteAfterReadAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  BufferHandle other = NewBuffer(16);
  Submit("", Write("x = 1", x, 1));
  backend_.Finish("x = 1");
  const std::string a = NewStream();
  // The reader is held up behind other work on its own stream...
  Submit(a, Write("hold a", other, 0));
  std::shared_ptr<Operation> read = Submit(a, CopyOp("read x", x, y));
  // ...and the later writer on another stream must not overtake it.
  std::shared_ptr<Operation> write = Submit(NewStream(), Write("x = 2", x, 2));
  backend_.RunReady();
  EXPECT_TRUE(backend_.Started("hold a"));
  EXPECT_FALSE(backend_.Started("read x"));
  EXPECT_FALSE(backend_.Started("x = 2")) << "the writer started before the earlier reader";

  backend_.Finish("hold a");
  EXPECT_TRUE(backend_.Started("read x"));
  EXPECT_FALSE(backend_.Started("x = 2"))
      << "the writer started before the earlier reader finished";
  backend_.Finish("read x");
  EXPECT_TRUE(backend_.Started("x = 2"));
  backend_.Finish("x = 2");
  EXPECT_EQ(StateOf(read), State::kSucceeded);
  EXPECT_EQ(StateOf(write), State::kSucceeded);
  EXPECT_EQ(At(y, 0), 1);
  EXPECT_EQ(At(x, 0), 2);
}

TEST_F(ExecutorTest, WriteAfterWriteAcrossStreams) {
  BufferHandle x = NewBuffer(1 << 16);
  std::shared_ptr<Operation> first = Submit(NewStream(), Write("x = 1", x, 1));
  std::shared_ptr<Operation> second = Submit(NewStream(), Write("x = 2", x, 2));
  backend_.RunReady();
  EXPECT_TRUE(backend_.Started("x = 1"));
  EXPECT_FALSE(backend_.Started("x = 2"))
      << "the later writer started before the earlier one finished";
  backend_.Finish("x = 1");
  EXPECT_TRUE(backend_.Started("x = 2"));
  backend_.Finish("x = 2");
  EXPECT_EQ(StateOf(first), State::kSucceeded);
  EXPECT_EQ(StateOf(second), State::kSucceeded);
  EXPECT_EQ(At(x, 0), 2);
}

TEST_F(ExecutorTest, IndependentStreamsOverlap) {
  BufferHandle x = NewBuffer(16);
  BufferHandle y = NewBuffer(16);
  std::shared_ptr<Operation> a = Submit(NewStream(), Write("x = 1", x, 1));
  std::shared_ptr<Operation> b = Submit(NewStream(), Write("y = 1", y, 1));
  backend_.RunReady();
  // Both run at once: neither waits for the other.
  EXPECT_TRUE(backend_.Started("x = 1"));
  EXPECT_TRUE(backend_.Started("y = 1"));
  EXPECT_EQ(StateOf(a), State::kRunning);
  EXPECT_EQ(StateOf(b), State::kRunning);
  backend_.Finish("y = 1");
  EXPECT_EQ(StateOf(b), State::kSucceeded);
  EXPECT_EQ(StateOf(a), State::kRunning);
  backend_.Finish("x = 1");
  EXPECT_EQ(StateOf(a), State::kSucceeded);
}

TEST_F(ExecutorTest, HostAccessWaitsForWritersAndHoldsBackLaterWriters) {
  BufferHandle x = NewBuffer(1 << 16);
  Submit(NewStream(), Write("x = 5", x, 5));
  std::optional<int64_t> seen;
  std::shared_ptr<HostAccess> access = executor_->AcquireHostAccess(
      {{x, false}}, [&](const std::shared_ptr<HostAccess>&) { seen = At(x, 0); });
  backend_.RunReady();
  EXPECT_FALSE(seen.has_value()) << "a host read started before the writer finished";
  backend_.Finish("x = 5");
  EXPECT_EQ(seen, 5);

  std::shared_ptr<Operation> write = Submit(NewStream(), Write("x = 6", x, 6));
  backend_.RunReady();
  EXPECT_FALSE(backend_.Launched("x = 6")) << "a writer was dispatched during an active host read";
  EXPECT_EQ(StateOf(write), State::kQueued);
  executor_->Release(access);
  backend_.RunReady();
  EXPECT_TRUE(backend_.Started("x = 6"));
  backend_.Finish("x = 6");
  EXPECT_EQ(StateOf(write), State::kSucceeded);
  EXPECT_EQ(At(x, 0), 6);
}

TEST_F(ExecutorTest, BufferDroppedWhileQueuedStaysAliveUntilDone) {
  const uint64_t before = limiter_.used();
  BufferHandle x = NewBuffer(1 << 16);
  BufferHandle y = NewBuffer(1 << 16);
  Submit("", Write("x = 3", x, 3));
  std::shared_ptr<Operation> copy = Submit("", CopyOp("y = x", x, y));
  x.reset();  // as DeleteBuffer does: the registry and the caller let go
  backend_.RunReady();
  EXPECT_GT(limiter_.used(), before + (1 << 16) * 8) << "x was freed while queued work uses it";
  backend_.Finish("x = 3");
  EXPECT_GT(limiter_.used(), before + (1 << 16) * 8) << "x was freed while queued work uses it";
  backend_.Finish("y = x");
  EXPECT_EQ(StateOf(copy), State::kSucceeded);
  EXPECT_EQ(At(y, 0), 3);
  EXPECT_EQ(limiter_.used(), before + (1 << 16) * 8) << "x was not freed after its work finished";
}

TEST_F(ExecutorTest, FailedLaunchFailsOnlyThatOperation) {
  BufferHandle x = NewBuffer(16);
  Executor::OpSpec bad;
  bad.kind = OperationKind::kElementwise;
  bad.accesses = {{x, true}};
  bad.launch = [](Stream&, OpResult&) -> absl::StatusOr<LaunchInfo> {
    return absl::ResourceExhaustedError("no scratch memory");
  };
  std::shared_ptr<Operation> failed_op = Submit("", std::move(bad));
  backend_.RunReady();
  const OperationStatus failed = executor_->GetStatus(*failed_op);
  EXPECT_EQ(failed.state, State::kFailed);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed.error.message(), "no scratch memory");
  std::shared_ptr<Operation> next = Submit("", Write("x = 4", x, 4));
  backend_.RunReady();
  EXPECT_TRUE(backend_.Started("x = 4"));
  backend_.Finish("x = 4");
  EXPECT_EQ(StateOf(next), State::kSucceeded);
  EXPECT_EQ(At(x, 15), 4);
}

TEST_F(ExecutorTest, SynchronizeWaitsForEverythingSubmitted) {
  BufferHandle x = NewBuffer(16);
  const std::string s = NewStream();
  for (int i = 1; i <= 5; ++i) Submit(s, Write(absl::StrCat("x = ", i), x, i));
  std::optional<int64_t> at_sync;
  ASSERT_OK(executor_->Synchronize("", s, [&] { at_sync = At(x, 0); }));
  for (int i = 1; i <= 4; ++i) {
    backend_.Finish(absl::StrCat("x = ", i));
    EXPECT_FALSE(at_sync.has_value()) << "synchronized with only " << i << " of 5 done";
  }
  backend_.Finish("x = 5");
  EXPECT_EQ(at_sync, 5);
}

TEST_F(ExecutorTest, StreamErrors) {
  EXPECT_EQ(executor_->Submit("c", "str-0000", Write("never", NewBuffer(1), 1)).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<StreamInfo> def = executor_->DefaultStream("c", 0);
  ASSERT_OK(def);
  EXPECT_EQ(executor_->DeleteStream("c", def->id, [] {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(executor_->CreateStream("c", 1).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string s = NewStream();
  BufferHandle x = NewBuffer(16);
  Submit(s, Write("x = 9", x, 9));
  std::optional<int64_t> deleted;
  ASSERT_OK(executor_->DeleteStream("c", s, [&] { deleted = At(x, 0); }));
  backend_.RunReady();
  EXPECT_FALSE(deleted.has_value()) << "a stream was deleted before its work finished";
  EXPECT_EQ(executor_->Submit("c", s, Write("never either", x, 1)).status().code(),
            absl::StatusCode::kNotFound);
  backend_.Finish("x = 9");
  EXPECT_EQ(deleted, 9);
}

// One rule for a request that must name a stream or an operation and names none: it is
// malformed (INVALID_ARGUMENT, naming the field), not an unknown id (NOT_FOUND), and it
// touches nothing; an empty stream id still means the default stream where one may be
// empty (a submission).
TEST_F(ExecutorTest, AnEmptyStreamOrOperationIdIsInvalidAndChangesNothing) {
  const std::string s = NewStream();
  BufferHandle x = NewBuffer(16);
  std::shared_ptr<Operation> on_default = Submit("", Write("x = 4", x, 4));
  ASSERT_NE(on_default, nullptr);
  absl::StatusOr<StreamInfo> def = executor_->DefaultStream("c", 0);
  ASSERT_OK(def);
  EXPECT_EQ(executor_->GetStatus(*on_default).stream_id, def->id);
  const auto streams = [&] {
    std::vector<std::string> out;
    for (const StreamInfo& info : executor_->ListStreams("c"))
      out.push_back(absl::StrCat(info.id, " ", info.is_default, " ", info.pending_operations));
    return out;
  };
  const std::vector<std::string> before = streams();
  ASSERT_EQ(before.size(), 2u);

  bool ran = false;
  const absl::Status deleted = executor_->DeleteStream("c", "", [&] { ran = true; });
  EXPECT_EQ(deleted.code(), absl::StatusCode::kInvalidArgument) << deleted;
  EXPECT_EQ(std::string(deleted.message()), "the request names no stream: set 'stream_id'");
  const absl::Status synced = executor_->Synchronize("c", "", [&] { ran = true; });
  EXPECT_EQ(synced.code(), absl::StatusCode::kInvalidArgument) << synced;
  EXPECT_EQ(std::string(synced.message()), "the request names no stream: set 'stream_id'");
  const absl::Status found = executor_->FindOperation("c", "").status();
  EXPECT_EQ(found.code(), absl::StatusCode::kInvalidArgument) << found;
  EXPECT_EQ(std::string(found.message()), "the request names no operation: set 'operation_id'");
  // An id that names nothing is still NOT_FOUND.
  EXPECT_EQ(executor_->DeleteStream("c", "str-0000", [] {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(executor_->Synchronize("c", "str-0000", [] {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(executor_->FindOperation("c", "op-0000").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(streams(), before);
  backend_.Finish("x = 4");
  EXPECT_FALSE(ran) << "a refused request's callback ran";
  EXPECT_EQ(At(x, 0), 4);
  EXPECT_OK(executor_->FindOperation("c", on_default->id()));
  std::optional<int64_t> at_sync;
  ASSERT_OK(executor_->Synchronize("c", s, [&] { at_sync = At(x, 0); }));
  backend_.RunUntilIdle();
  EXPECT_EQ(at_sync, 4);
}

TEST_F(ExecutorTest, StreamsPerClientAreLimited) {
  for (size_t i = 0; i + 1 < Executor::kMaxStreamsPerClient; ++i)
    NewStream();  // +1: the default stream
  ASSERT_OK(executor_->DefaultStream("c", 0));
  EXPECT_EQ(executor_->CreateStream("c", 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_OK(executor_->CreateStream("other", 0));
}

// Clients that come and go must not use up the streams: the server's bound takes idle
// default streams back, and refuses only when every stream is busy or not a default.
TEST_F(ExecutorTest, StreamsOfAllClientsAreBoundedAndIdleDefaultsReclaimed) {
  ASSIGN_OR_FAIL(std::unique_ptr<Executor> executor, Executor::Create(backend_, 0, 3));
  BufferHandle x = NewBuffer(4);
  ASSERT_OK(executor->DefaultStream("a", 0));
  ASSERT_OK(executor->DefaultStream("b", 0));
  ASSERT_OK(executor->DefaultStream("c", 0));
  // Idle: "d"'s default stream takes one of theirs.
  ASSERT_OK(executor->DefaultStream("d", 0));
  size_t streams = 0;
  for (const char* client : {"a", "b", "c", "d"}) streams += executor->ListStreams(client).size();
  EXPECT_EQ(streams, 3u);

  // Three busy streams: one explicit, two defaults; nothing can be reclaimed.
  ASSIGN_OR_FAIL(StreamInfo busy, executor->CreateStream("e", 0));
  ASSERT_OK(executor->Submit("e", busy.id, Write("e", x, 1)));
  ASSERT_OK(executor->Submit("f", "", Write("f", x, 2)));
  ASSERT_OK(executor->Submit("g", "", Write("g", x, 3)));
  const absl::Status refused = executor->Submit("h", "", Write("h", x, 4)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("--max-streams"), absl::string_view::npos) << refused;
  EXPECT_EQ(executor->CreateStream("h", 0).status().code(), absl::StatusCode::kResourceExhausted);

  // Once the work is done, the idle defaults make room again.
  backend_.RunReady();
  for (const char* kernel : {"e", "f", "g"}) backend_.Finish(kernel);
  ASSERT_OK(executor->Submit("h", "", Write("h", x, 4)));
  backend_.Finish("h");
  EXPECT_EQ(At(x, 0), 4);
  backend_.RunUntilIdle();
}

// Shutdown: what runs finishes, what is queued fails behind it, in stream order, and
// nothing new is taken.
TEST_F(ExecutorTest, CancelQueuedFailsWhatHasNotStarted) {
  backend_.set_dispatch_window(1);
  ASSIGN_OR_FAIL(std::unique_ptr<Executor> executor, Executor::Create(backend_));
  executor_.swap(executor);  // the fixture's ends with the test
  BufferHandle x = NewBuffer(4);
  BufferHandle y = NewBuffer(4);
  const std::string other = NewStream();
  std::shared_ptr<Operation> running = Submit("", Write("x = 1", x, 1));
  std::shared_ptr<Operation> queued = Submit("", Write("x = 2", x, 2));
  // On another stream, waiting for the queued one (it reads x).
  std::shared_ptr<Operation> dependent = Submit(other, CopyOp("y = x", x, y));
  backend_.RunReady();
  ASSERT_EQ(StateOf(running), State::kRunning);
  ASSERT_EQ(StateOf(queued), State::kQueued) << "the window holds one operation per stream";
  EXPECT_FALSE(executor_->WaitIdle(absl::Now() + absl::Milliseconds(1)));

  EXPECT_EQ(executor_->CancelQueued(absl::UnavailableError("shutting down")), 2u);
  const absl::Status late = executor_->Submit("c", "", Write("late", x, 3)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  backend_.RunReady();
  EXPECT_EQ(StateOf(running), State::kRunning) << "work on the device is not cut short";
  EXPECT_EQ(StateOf(dependent), State::kFailed) << "it waited for nothing";
  backend_.Finish("x = 1");
  EXPECT_EQ(StateOf(running), State::kSucceeded);
  EXPECT_EQ(StateOf(queued), State::kFailed);
  EXPECT_EQ(executor_->GetStatus(*queued).error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(At(x, 0), 1) << "a cancelled operation ran";
  EXPECT_EQ(At(y, 0), 0) << "a cancelled operation ran";
  EXPECT_TRUE(executor_->WaitIdle(absl::Now()));
  executor_.swap(executor);
}

// A stream holds at most the backend's window of dispatched operations; the next goes
// out as one completes, in order.
TEST_F(ExecutorTest, DispatchStaysWithinTheBackendsWindow) {
  // Counts what the executor hands to the backend, completed or not.
  struct DispatchCounter final : OperationObserver {
    void OnSubmitted(const OperationStatus&) override {}
    void OnDispatched(const OperationStatus&) override { ++dispatched; }
    void OnCompleted(const OperationStatus&) override {}
    int dispatched = 0;  // under the executor's lock
  } counter;
  backend_.set_dispatch_window(2);
  ASSIGN_OR_FAIL(std::unique_ptr<Executor> executor, Executor::Create(backend_));
  executor->SetObserver(&counter);
  BufferHandle x = NewBuffer(4);
  std::vector<std::shared_ptr<Operation>> ops;
  for (int i = 0; i < 5; ++i) {
    ASSIGN_OR_FAIL(std::shared_ptr<Operation> op,
                   executor->Submit("c", "", Write(absl::StrCat("w", i), x, i)));
    ops.push_back(op);
  }
  backend_.RunReady();
  EXPECT_EQ(counter.dispatched, 2);
  backend_.Finish("w0");
  EXPECT_EQ(counter.dispatched, 3);
  backend_.Finish("w1");
  EXPECT_EQ(counter.dispatched, 4);
  for (int i = 2; i < 5; ++i) backend_.Finish(absl::StrCat("w", i));
  EXPECT_EQ(counter.dispatched, 5);
  for (const auto& op : ops) EXPECT_EQ(executor->GetStatus(*op).state, State::kSucceeded);
  EXPECT_EQ(At(x, 0), 4);
  EXPECT_EQ(backend_.started_order(), (std::vector<std::string>{"w0", "w1", "w2", "w3", "w4"}));
}

TEST_F(ExecutorTest, FinishedOperationsAreRetainedWithinBounds) {
  // Each operation leaves 1 MiB of inline values: the byte bound evicts before the count.
  int count = 0;
  auto with_values = [&] {
    Executor::OpSpec spec = Write(absl::StrCat("op ", count++), NewBuffer(1), 0);
    auto fill = std::move(spec.launch);
    spec.launch = [fill = std::move(fill)](Stream& s,
                                           OpResult& r) mutable -> absl::StatusOr<LaunchInfo> {
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
  backend_.RunUntilIdle();
  EXPECT_EQ(StateOf(last), State::kSucceeded);
  EXPECT_EQ(executor_->FindOperation("", first->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_OK(executor_->FindOperation("", last->id()));
}

TEST_F(ExecutorTest, TimingIsRecorded) {
  BufferHandle x = NewBuffer(16);
  Executor::OpSpec spec = Write("timed", x, 1);
  spec.bytes_read = 32;
  spec.bytes_written = 128;
  spec.flops = 16;
  std::shared_ptr<Operation> op = Submit("", std::move(spec));
  EXPECT_EQ(op->traffic_bytes(), 160u);  // known from submission on
  backend_.RunReady();
  EXPECT_EQ(StateOf(op), State::kRunning);
  // The device clock moves 0.25 s while the kernel runs: its device time, exactly.
  backend_.AdvanceClock(0.25);
  backend_.Finish("timed");
  const OperationStatus st = executor_->GetStatus(*op);
  EXPECT_EQ(st.state, State::kSucceeded);
  EXPECT_EQ(st.timing.device_seconds, 0.25);
  EXPECT_GE(st.timing.queued_seconds, 0.0);
  EXPECT_EQ(st.timing.bytes_read, 32u);
  EXPECT_EQ(st.timing.bytes_written, 128u);
  EXPECT_EQ(st.timing.flops, 16u);
  EXPECT_EQ(op->traffic_bytes(), 160u);
  EXPECT_EQ(executor_->Stats()[static_cast<int>(OperationKind::kFill)].count, 1u);
  EXPECT_EQ(executor_->Stats()[static_cast<int>(OperationKind::kFill)].device_seconds, 0.25);
}

// ---------------------------------------------------------------------------
// Recorded runs: operations launched together, recorded and launched as one unit.

class RecordedRunTest : public ExecutorTest {
 protected:
  RecordedRunTest() {
    backend_.set_can_capture(true);
    executor_->SetCaptureMinOps(3);
  }

  Executor::OpSpec Capturable(Executor::OpSpec spec) {
    spec.capturable = true;
    return spec;
  }
};

TEST_F(RecordedRunTest, OperationsLaunchedTogetherRunAndAreTimedAsOneUnit) {
  BufferHandle x = NewBuffer(1);
  BufferHandle y = NewBuffer(1);
  const std::string other = NewStream();
  std::vector<std::shared_ptr<Operation>> ops;
  std::shared_ptr<Operation> reader;
  {
    Executor::LaunchBatch batch(*executor_);
    for (int i = 1; i <= 4; ++i) {
      ops.push_back(Submit("", Capturable(Write(absl::StrCat("w", i), x, i))));
    }
    // Reads x on another stream: waits for the last write, hence for the whole unit.
    reader = Submit(other, CopyOp("y = x", x, y));
    backend_.RunReady();
    EXPECT_FALSE(backend_.Launched("w1"));  // held until the batch ends
  }
  EXPECT_EQ(backend_.graph_launches(), 1);
  backend_.RunReady();
  EXPECT_EQ(backend_.started_order(), std::vector<std::string>{"w1"});
  for (int i = 1; i <= 4; ++i) {
    backend_.AdvanceClock(0.125 * i);
    backend_.Finish(absl::StrCat("w", i));
    // The unit completes as one, after its last kernel.
    EXPECT_EQ(StateOf(ops[0]), i < 4 ? State::kRunning : State::kSucceeded) << i;
    EXPECT_EQ(backend_.Started("y = x"), i == 4) << i;
  }
  // Timed as a whole (0.125 + 0.25 + 0.375 + 0.5 s), each with an even share.
  for (const auto& op : ops) {
    const OperationStatus st = executor_->GetStatus(*op);
    EXPECT_EQ(st.state, State::kSucceeded);
    EXPECT_EQ(st.timing.device_seconds, 1.25 / 4);
    EXPECT_EQ(st.timing.graph_operations, 4u);
  }
  backend_.Finish("y = x");
  EXPECT_EQ(StateOf(reader), State::kSucceeded);
  EXPECT_EQ(At(y, 0), 4);
}

TEST_F(RecordedRunTest, ShortRunsAndOtherOperationsLaunchOneByOne) {
  BufferHandle x = NewBuffer(1);
  std::vector<std::shared_ptr<Operation>> ops;
  {
    Executor::LaunchBatch batch(*executor_);
    ops.push_back(Submit("", Capturable(Write("a1", x, 1))));
    ops.push_back(Submit("", Capturable(Write("a2", x, 2))));  // a run of two: too short
    ops.push_back(Submit("", Write("plain", x, 3)));           // not capturable
    for (int i = 1; i <= 3; ++i) {
      ops.push_back(Submit("", Capturable(Write(absl::StrCat("b", i), x, 3 + i))));
    }
  }
  EXPECT_EQ(backend_.graph_launches(), 1);  // b1..b3
  backend_.RunUntilIdle();
  EXPECT_EQ(backend_.started_order(),
            (std::vector<std::string>{"a1", "a2", "plain", "b1", "b2", "b3"}));
  for (const auto& op : ops) EXPECT_EQ(StateOf(op), State::kSucceeded);
  EXPECT_EQ(executor_->GetStatus(*ops[0]).timing.graph_operations, 0u);
  EXPECT_EQ(executor_->GetStatus(*ops[3]).timing.graph_operations, 3u);
  EXPECT_EQ(At(x, 0), 6);
}

TEST_F(RecordedRunTest, AFailedRecordingLaunchesEachOperationOnItsOwn) {
  BufferHandle x = NewBuffer(1);
  backend_.FailNextCapture();
  std::vector<std::shared_ptr<Operation>> ops;
  {
    Executor::LaunchBatch batch(*executor_);
    for (int i = 1; i <= 4; ++i) {
      ops.push_back(Submit("", Capturable(Write(absl::StrCat("w", i), x, i))));
    }
  }
  EXPECT_EQ(backend_.graph_launches(), 0);
  backend_.RunUntilIdle();
  EXPECT_EQ(backend_.started_order(), (std::vector<std::string>{"w1", "w2", "w3", "w4"}));
  for (const auto& op : ops) EXPECT_EQ(StateOf(op), State::kSucceeded);
  EXPECT_EQ(At(x, 0), 4);
}

TEST_F(RecordedRunTest, OperationsSubmittedOutsideABatchLaunchAsTheyCome) {
  BufferHandle x = NewBuffer(1);
  for (int i = 1; i <= 4; ++i) Submit("", Capturable(Write(absl::StrCat("w", i), x, i)));
  EXPECT_EQ(backend_.graph_launches(), 0);
  backend_.RunUntilIdle();
  EXPECT_EQ(At(x, 0), 4);
}

TEST_F(RecordedRunTest, OperationsWaitingForTheWindowAreLaunchedTogetherWhenItOpens) {
  // A window of 4: a batch of 10 launches 4, and the next 4 once those complete, as one.
  ScriptedBackend backend;
  backend.set_dispatch_window(4);
  backend.set_can_capture(true);
  MemoryLimiter limiter(1 << 20);
  BufferRegistry registry(backend, limiter);
  ASSIGN_OR_FAIL(std::unique_ptr<Executor> executor, Executor::Create(backend));
  executor->SetCaptureMinOps(3);
  ASSIGN_OR_FAIL(BufferHandle x, registry.Allocate("c", "", DType::kInt64, {1}, Layout::kC, 0));
  std::vector<std::shared_ptr<Operation>> ops;
  {
    Executor::LaunchBatch batch(*executor);
    for (int i = 1; i <= 10; ++i) {
      Executor::OpSpec spec;
      spec.kind = OperationKind::kFill;
      spec.accesses = {{x, true}};
      spec.capturable = true;
      spec.launch = [&backend, name = absl::StrCat("w", i)](
                        Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
        RETURN_IF_ERROR(backend.Launch(s, name));
        return LaunchInfo{};
      };
      ASSIGN_OR_FAIL(std::shared_ptr<Operation> op, executor->Submit("c", "", std::move(spec)));
      ops.push_back(op);
    }
  }
  EXPECT_EQ(backend.graph_launches(), 1);
  for (int i = 1; i <= 4; ++i) backend.Finish(absl::StrCat("w", i));
  EXPECT_EQ(backend.graph_launches(), 2);  // w5..w8
  for (int i = 5; i <= 8; ++i) backend.Finish(absl::StrCat("w", i));
  EXPECT_EQ(backend.graph_launches(), 2);  // w9 and w10: too few
  backend.RunUntilIdle();
  for (const auto& op : ops) EXPECT_EQ(executor->GetStatus(*op).state, State::kSucceeded);
  EXPECT_EQ(backend.started_order().size(), 10u);
}

TEST_F(ExecutorTest, ALaunchThatSaysWhenItsDeviceWorkStartedIsTimedFromThere) {
  BufferHandle x = NewBuffer(4);
  // The launch does work of its own first (here, a kernel standing for it), then records
  // the event its device work is timed from.
  Executor::OpSpec spec;
  spec.kind = OperationKind::kFill;
  spec.accesses = {{x, true}};
  spec.launch = [this](Stream& s, OpResult&) -> absl::StatusOr<LaunchInfo> {
    RETURN_IF_ERROR(backend_.Launch(s, "own work", [] {}));
    LaunchInfo info;
    ASSIGN_OR_RETURN(info.started, s.Record());
    RETURN_IF_ERROR(backend_.Launch(s, "device work", [] {}));
    return info;
  };
  std::shared_ptr<Operation> op = Submit("", std::move(spec));
  backend_.RunReady();
  backend_.AdvanceClock(0.5);
  backend_.Finish("own work");
  backend_.AdvanceClock(0.25);
  backend_.Finish("device work");
  const OperationStatus st = executor_->GetStatus(*op);
  EXPECT_EQ(st.state, State::kSucceeded);
  EXPECT_EQ(st.timing.device_seconds, 0.25);
}

// ---------------------------------------------------------------------------
// Tenants' quotas.

TEST_F(ExecutorTest, OperationsQuotaCountsATenantsUnfinishedOperations) {
  ASSERT_NO_FATAL_FAILURE(SetQuotas("default operations=2\n"));
  BufferHandle x = NewBuffer(4);
  BufferHandle y = NewBuffer(4);
  const std::string alice = ScopeOf("alice", "c");
  ASSERT_OK(executor_->Submit(alice, "", Write("x = 1", x, 1)));
  ASSERT_OK(executor_->Submit(ScopeOf("alice", "other client"), "", Write("x = 2", x, 2)));
  absl::StatusOr<std::shared_ptr<Operation>> third =
      executor_->Submit(alice, "", Write("x = 3", x, 3));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("tenant 'alice' is at its quota 'operations' of 2"),
            std::string::npos)
      << third.status();
  // Another tenant's operations are its own.
  ASSERT_OK(executor_->Submit(ScopeOf("bob", "c"), "", Write("y = 5", y, 5)));
  // Once one is done, alice may submit again; the refused one never ran.
  backend_.Finish("x = 1");
  ASSERT_OK(executor_->Submit(alice, "", Write("x = 4", x, 4)));
  backend_.RunUntilIdle();
  EXPECT_FALSE(backend_.Finished("x = 3"));
  EXPECT_EQ(At(x, 0), 4);
  EXPECT_EQ(At(y, 0), 5);
}

TEST_F(ExecutorTest, CheckSubmitAllRefusesWhatSubmitAllWouldAndQueuesNothing) {
  ASSERT_NO_FATAL_FAILURE(SetQuotas("default operations=4\n"));
  const std::string alice = ScopeOf("alice", "c");
  BufferHandle x = NewBuffer(4);
  const std::string mine = NewStream(alice);
  const std::string bobs = NewStream(ScopeOf("bob", "c"));
  ASSERT_OK(executor_->Submit(alice, mine, Write("x = 1", x, 1)));  // one in flight
  std::vector<Executor::OpSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back(Write(absl::StrCat("w", i), x, 10 + i));
  auto check = [&](std::vector<Executor::SubmitItem> items, size_t* refused) {
    *refused = 99;
    return executor_->CheckSubmitAll(alice, items, refused);
  };
  size_t refused = 0;
  // Three more fit the quota of four; on the default stream too.
  EXPECT_OK(check({{mine, &specs[0]}, {"", &specs[1]}, {mine, &specs[2]}}, &refused));
  EXPECT_EQ(refused, 99u);
  // A fourth does not: the item refused is the one Submit would have refused.
  absl::Status s =
      check({{mine, &specs[0]}, {mine, &specs[1]}, {mine, &specs[2]}, {mine, &specs[3]}}, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(refused, 3u);
  // Another tenant's stream, and one that does not exist, are NOT_FOUND, at their index.
  s = check({{mine, &specs[0]}, {bobs, &specs[1]}}, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(refused, 1u);
  s = check({{"str-missing", &specs[0]}}, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(refused, 0u);
  // Nothing was queued or taken: the specs are whole, and only the first write runs.
  for (const Executor::OpSpec& spec : specs) EXPECT_NE(spec.launch, nullptr);
  backend_.RunUntilIdle();
  EXPECT_EQ(backend_.started_order(), std::vector<std::string>{"x = 1"});
  EXPECT_EQ(executor_->ListStreams(alice).size(), 1u);  // no default stream was made
  // Once shutting down, everything is refused from the first item on.
  executor_->CancelQueued(absl::UnavailableError("shutting down"));
  s = check({{mine, &specs[0]}}, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(refused, 0u);
}

TEST_F(ExecutorTest, AnOperationOfSeveralMembersCountsEachInTheQuotaAndTheStatistics) {
  ASSERT_NO_FATAL_FAILURE(SetQuotas("default operations=4\n"));
  const std::string alice = ScopeOf("alice", "c");
  BufferHandle x = NewBuffer(4);
  // One operation that stands for three: two elementwise and a reduce.
  auto three = [&](const std::string& name, int64_t value) {
    Executor::OpSpec spec = Write(name, x, value);
    spec.members = {{OperationKind::kElementwise, 32, 32, 4},
                    {OperationKind::kElementwise, 32, 32, 8},
                    {OperationKind::kReduce, 32, 8, 4}};
    return spec;
  };
  absl::StatusOr<std::shared_ptr<Operation>> submitted = executor_->Submit(alice, "", three("run", 1));
  ASSERT_OK(submitted);
  const std::shared_ptr<Operation> run = *submitted;
  // Three of the four in flight: one more fits, a second group of three does not, and
  // CheckSubmitAll names the first item that does not fit.
  Executor::OpSpec group = three("again", 2);
  Executor::OpSpec single = Write("single", x, 3);
  size_t refused = 99;
  const std::vector<Executor::SubmitItem> items = {{"", &single}, {"", &group}};
  absl::Status s = executor_->CheckSubmitAll(alice, items, &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("3 operations in flight and 4 more asked for"), std::string::npos) << s;
  EXPECT_EQ(refused, 1u);
  absl::StatusOr<std::shared_ptr<Operation>> over = executor_->Submit(alice, "", three("over", 4));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  ASSERT_OK(executor_->Submit(alice, "", Write("single", x, 3)));

  backend_.RunReady();
  backend_.AdvanceClock(0.3);
  backend_.Finish("run");
  backend_.RunUntilIdle();
  EXPECT_EQ(executor_->GetStatus(*run).state, State::kSucceeded);
  EXPECT_FALSE(backend_.Finished("over"));
  // Each member counted as one operation of its kind, with its traffic and a third of the
  // time; the whole reports its own.
  const auto stats = executor_->Stats();
  const KindStats& elementwise = stats[static_cast<int>(OperationKind::kElementwise)];
  const KindStats& reduce = stats[static_cast<int>(OperationKind::kReduce)];
  EXPECT_EQ(elementwise.count, 2u);
  EXPECT_EQ(elementwise.bytes_read, 64u);
  EXPECT_EQ(elementwise.flops, 12u);
  EXPECT_DOUBLE_EQ(elementwise.device_seconds, 0.2);
  EXPECT_EQ(reduce.count, 1u);
  EXPECT_EQ(reduce.bytes_written, 8u);
  EXPECT_DOUBLE_EQ(reduce.device_seconds, 0.1);
  EXPECT_EQ(stats[static_cast<int>(OperationKind::kFill)].count, 1u);  // the single one
  EXPECT_EQ(executor_->Stats("alice")[static_cast<int>(OperationKind::kElementwise)].count, 2u);
  // All done: the quota has room for four again.
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(executor_->Submit(alice, "", Write(absl::StrCat("w", i), x, i)));
  }
  backend_.RunUntilIdle();
}

TEST_F(ExecutorTest, StreamsQuotaCountsATenantsStreamsDefaultOnesIncluded) {
  ASSERT_NO_FATAL_FAILURE(SetQuotas("default streams=2\ntenant bob streams=3"));
  const std::string alice = ScopeOf("alice", "c");
  ASSERT_OK(executor_->DefaultStream(alice, 0));
  ASSERT_OK(executor_->CreateStream(alice, 0));
  absl::StatusOr<StreamInfo> third = executor_->CreateStream(ScopeOf("alice", "d"), 0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("quota 'streams' of 2"), std::string::npos)
      << third.status();
  EXPECT_EQ(executor_->DefaultStream(ScopeOf("alice", "d"), 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(executor_->ListStreams(alice).size(), 2u);
  for (int i = 0; i < 3; ++i) ASSERT_OK(executor_->CreateStream(ScopeOf("bob", "c"), 0));
  EXPECT_EQ(executor_->CreateStream(ScopeOf("bob", "c"), 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace gpucompute

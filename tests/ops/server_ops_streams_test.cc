// End-to-end tests of StreamService and of the order it gives: creating, listing,
// synchronizing and deleting streams, the three hazards across streams, downloads behind
// pending writers, and buffers deleted while queued work uses them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

TEST_F(ServerOpsTest, StreamsCreateListSynchronizeDelete) {
  ASSIGN_OR_FAIL(auto a, c().CreateStream());
  ASSIGN_OR_FAIL(auto b, c().CreateStream());
  EXPECT_TRUE(std::regex_match(a.id(), kStreamIdPattern)) << a.id();
  EXPECT_TRUE(std::regex_match(b.id(), kStreamIdPattern)) << b.id();
  EXPECT_NE(a.id(), b.id());
  EXPECT_FALSE(a.is_default());
  EXPECT_EQ(a.device(), 0);
  EXPECT_EQ(a.pending_operations(), 0u);

  ASSIGN_OR_FAIL(auto list, c().ListStreams());
  ASSERT_EQ(list.streams_size(), 3);
  std::string default_id;
  std::set<std::string> listed;
  for (const v1::StreamInfo& s : list.streams()) {
    listed.insert(s.id());
    if (s.is_default()) {
      EXPECT_TRUE(default_id.empty()) << "two default streams";
      default_id = s.id();
    }
  }
  EXPECT_TRUE(listed.contains(a.id()));
  EXPECT_TRUE(listed.contains(b.id()));
  ASSERT_FALSE(default_id.empty());
  EXPECT_TRUE(std::regex_match(default_id, kStreamIdPattern));
  // Another client sees only its own streams.
  std::unique_ptr<Client> other = server_->Connect("someone-else");
  ASSERT_NE(other, nullptr);
  ASSIGN_OR_FAIL(auto other_list, other->ListStreams());
  ASSERT_EQ(other_list.streams_size(), 1);
  EXPECT_NE(other_list.streams(0).id(), default_id);

  // A chain on A: pending, not idle within 1 ms, idle at the end. Each link takes the CPU
  // backend a few ms, yet on a loaded machine a chain can still finish before the call
  // that looks at it is served; idle must then mean done, and another chain is queued
  // behind it. The CPU backend must be seen busy within a few chains; a GPU may run every
  // chain within the millisecond (an H100 did, once in a few runs).
  const std::vector<double> x0 = Iota(kBig);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  constexpr int kAttempts = 5;
  int queued = 0;
  bool seen_busy = false;
  std::vector<std::string> chain;
  for (int attempt = 0; attempt < kAttempts && !seen_busy; ++attempt) {
    SCOPED_TRACE(attempt);
    chain = QueueChain(c(), bx.id(), kChain, a.id());
    ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
    queued += kChain;
    ASSIGN_OR_FAIL(auto busy, c().ListStreams());
    uint64_t pending_on_a = 0;
    for (const v1::StreamInfo& s : busy.streams()) {
      if (s.id() == a.id()) {
        pending_on_a = s.pending_operations();
      } else {
        EXPECT_EQ(s.pending_operations(), 0u) << s.id();
      }
    }
    bool idle_soon = pending_on_a == 0;
    if (!idle_soon) {
      ASSIGN_OR_FAIL(idle_soon, c().SynchronizeStream(a.id(), 0.001));
    }
    if (!idle_soon) {
      seen_busy = true;
      // Nothing on B: idle without waiting for A's chain. 100 ms, not 1: on a loaded
      // machine the answer for an idle stream can take more than a millisecond to win
      // against the timeout.
      ASSIGN_OR_FAIL(auto idle_b, c().SynchronizeStream(b.id(), 0.1));
      EXPECT_TRUE(idle_b);
      break;
    }
    for (const std::string& id : chain) {
      ASSIGN_OR_FAIL(auto op, c().GetOperation(id));
      EXPECT_TRUE(op.done()) << "stream idle with " << id << " not done";
    }
  }
  if (TestBackendName() == "cpu") {
    EXPECT_TRUE(seen_busy) << "every one of " << kAttempts << " chains of " << kChain
                           << " links was idle within 1 ms of being queued";
  }
  ASSIGN_OR_FAIL(auto idle, c().SynchronizeStream(a.id()));
  EXPECT_TRUE(idle);
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(auto op, c().GetOperation(id));
    EXPECT_TRUE(op.done());
    EXPECT_EQ(op.stream_id(), a.id());
  }
  ASSIGN_OR_FAIL(auto after, c().ListStreams());
  for (const v1::StreamInfo& s : after.streams()) EXPECT_EQ(s.pending_operations(), 0u) << s.id();
  ExpectShifted(c(), bx.id(), x0, queued, "after the chains on A");
  EXPECT_EQ(c().SynchronizeStream(a.id(), -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().SynchronizeStream("str-00000000000000000000000000000000").status().code(),
            absl::StatusCode::kNotFound);

  // Deleting.
  EXPECT_EQ(c().DeleteStream(default_id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c().DeleteStream("str-00000000000000000000000000000000").code(),
            absl::StatusCode::kNotFound);
  // A request that names no stream is invalid, not a stream that is missing.
  EXPECT_EQ(c().DeleteStream("").code(), absl::StatusCode::kInvalidArgument);
  ASSIGN_OR_FAIL(auto still3, c().ListStreams());
  EXPECT_EQ(still3.streams_size(), 3);
  // Delete B while work is queued on it: the work finishes.
  const std::vector<std::string> on_b = QueueChain(c(), bx.id(), 3, b.id());
  ASSERT_OK(c().DeleteStream(b.id()));
  for (const std::string& id : on_b) {
    ASSIGN_OR_FAIL(auto op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED);
  }
  ExpectShifted(c(), bx.id(), x0, queued + 3, "after the work on B");
  ASSIGN_OR_FAIL(auto two, c().ListStreams());
  ASSERT_EQ(two.streams_size(), 2);
  for (const v1::StreamInfo& s : two.streams()) EXPECT_NE(s.id(), b.id());
  {
    SCOPED_TRACE("Submit on a deleted stream");
    v1::SubmitRequest r = Elementwise("x * 2", {{"x", BufferOperand(bx.id())}}, NewOutput("never"));
    r.set_stream_id(b.id());
    ExpectRejected(c(), r, absl::StatusCode::kNotFound, "", {bx.id()});
    r.set_wait(true);
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
    r.set_stream_id("str-00000000000000000000000000000000");
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(c().SynchronizeStream(b.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().DeleteStream(b.id()).code(), absl::StatusCode::kNotFound);
  ASSERT_OK(c().DeleteStream(a.id()));
  ASSIGN_OR_FAIL(auto one, c().ListStreams());
  ASSERT_EQ(one.streams_size(), 1);
  EXPECT_EQ(one.streams(0).id(), default_id);
}

TEST_F(ServerOpsTest, StreamsReadAfterWriteAcrossStreams) {
  ASSIGN_OR_FAIL(auto a, c().CreateStream());
  ASSIGN_OR_FAIL(auto b, c().CreateStream());
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  const std::vector<std::string> chain = QueueChain(c(), bx.id(), kChain, a.id());
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  // y = x * 1 on B, submitted after the chain: it must see all 30 increments.
  ASSIGN_OR_FAIL(auto read,
                 RunOp(c(), Elementwise("x * 1", {{"x", BufferOperand(bx.id())}}), b.id()));
  EXPECT_EQ(read.stream_id(), b.id());
  EXPECT_GT(read.timing().queued_seconds(), 0);
  // (Whether the writers on A already report done when the reader on B does is not
  // specified: the reader waits for their device work, not for their bookkeeping.)
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(auto op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ExpectShifted(c(), read.outputs(0).id(), x0, kChain, "y read on B");
  ASSIGN_OR_FAIL(auto idle, c().SynchronizeStream(a.id()));
  EXPECT_TRUE(idle);
}

TEST_F(ServerOpsTest, StreamsWriteAfterReadAcrossStreams) {
  ASSIGN_OR_FAIL(auto a, c().CreateStream());
  ASSIGN_OR_FAIL(auto b, c().CreateStream());
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  // On A: a long chain on z, then the reader y = x * 1, which therefore starts late.
  QueueChain(c(), bz.id(), kChain, a.id());
  ASSIGN_OR_FAIL(auto reader, c().Submit(OnStream(
                                  Elementwise("x * 1", {{"x", BufferOperand(bx.id())}}), a.id())));
  EXPECT_FALSE(reader.done());
  // On B, submitted later: x = x + 100. It must wait for the reader.
  ASSIGN_OR_FAIL(
      auto writer,
      RunOp(c(), Elementwise("x + 100", {{"x", BufferOperand(bx.id())}}, ExistingOutput(bx.id())),
            b.id()));
  EXPECT_EQ(writer.stream_id(), b.id());
  ASSIGN_OR_FAIL(auto reader_done, c().WaitOperation(reader.id()));
  EXPECT_EQ(reader_done.state(), v1::Operation::STATE_SUCCEEDED);
  ExpectShifted(c(), reader.outputs(0).id(), x0, 0, "what the reader saw");
  ExpectShifted(c(), bx.id(), x0, 100, "x after the writer");
}

TEST_F(ServerOpsTest, StreamsWriteAfterWriteAcrossStreams) {
  ASSIGN_OR_FAIL(auto a, c().CreateStream());
  ASSIGN_OR_FAIL(auto b, c().CreateStream());
  const std::vector<double> w = Iota(kBig, 3.0);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), std::vector<double>(kBig, -1.0)));
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(auto bw, UploadArray(c(), w));
  // On A: a long chain on z, then x = z * 1 (x becomes 30 everywhere, late).
  QueueChain(c(), bz.id(), kChain, a.id());
  ASSIGN_OR_FAIL(
      auto first,
      c().Submit(OnStream(
          Elementwise("z * 1", {{"z", BufferOperand(bz.id())}}, ExistingOutput(bx.id())), a.id())));
  // On B, later: x = w * 1, which does not read x. The later write must win.
  ASSIGN_OR_FAIL(
      auto second,
      RunOp(c(), Elementwise("w * 1", {{"w", BufferOperand(bw.id())}}, ExistingOutput(bx.id())),
            b.id()));
  EXPECT_EQ(second.stream_id(), b.id());
  ASSIGN_OR_FAIL(auto first_done, c().WaitOperation(first.id()));
  EXPECT_EQ(first_done.state(), v1::Operation::STATE_SUCCEEDED);
  ASSERT_OK(c().SynchronizeStream(a.id()));
  ASSERT_OK(c().SynchronizeStream(b.id()));
  ExpectShifted(c(), bx.id(), w, 0, "x after both writes");
  ExpectShifted(c(), bz.id(), std::vector<double>(kBig, 0.0), kChain, "z");
}

TEST_F(ServerOpsTest, DownloadWaitsForPendingWriters) {
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(auto s, c().CreateStream());
  const std::vector<std::string> chain = QueueChain(c(), bx.id(), kChain, s.id());
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  // Right away, without waiting: the download sees every increment.
  ExpectShifted(c(), bx.id(), x0, kChain, "download right after the chain");
  // Likewise on the default stream, and a ranged download of the end.
  QueueChain(c(), bx.id(), 5);
  v1::DownloadRequest tail;
  tail.set_buffer(bx.id());
  tail.set_offset_bytes((kBig - 10) * 8);
  std::string bytes;
  ASSIGN_OR_FAIL(auto response, c().Download(tail, &bytes));
  ASSERT_EQ(bytes.size(), 80u);
  for (size_t i = 0; i < 10; ++i) {
    double v;
    std::memcpy(&v, bytes.data() + 8 * i, 8);
    EXPECT_EQ(v, x0[kBig - 10 + i] + kChain + 5) << i;
  }
}

TEST_F(ServerOpsTest, DeleteBufferWhileQueuedOpsUseIt) {
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(auto s, c().CreateStream());
  ASSIGN_OR_FAIL(auto info0, c().GetServerInfo());
  // A chain on z, then y = 2 * x behind it, then delete x and z right away.
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), kChain, s.id());
  ASSIGN_OR_FAIL(
      auto reader,
      c().Submit(OnStream(
          Elementwise("2 * x + z", {{"x", BufferOperand(bx.id())}, {"z", BufferOperand(bz.id())}},
                      NewOutput("y")),
          s.id())));
  EXPECT_FALSE(reader.done());
  ASSERT_OK(c().DeleteBuffer(bx.id()));
  ASSERT_OK(c().DeleteBuffer(bz.id()));
  // The ids and names stop resolving at once.
  EXPECT_EQ(c().GetBuffer(bx.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().GetBuffer(bz.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().DeleteBuffer(bx.id()).code(), absl::StatusCode::kNotFound);
  {
    SCOPED_TRACE("using a deleted buffer");
    ExpectRejected(c(), Elementwise("x + 1", {{"x", BufferOperand(bx.id())}}),
                   absl::StatusCode::kNotFound);
  }
  // The queued work still succeeds and computes from the deleted buffers.
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(auto op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ASSIGN_OR_FAIL(auto done, c().WaitOperation(reader.id()));
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
  ASSIGN_OR_FAIL(auto y, DownloadArray<double>(c(), "y"));
  ASSERT_EQ(y.size(), kBig);
  for (size_t i = 0; i < kBig; ++i) ASSERT_EQ(y[i], 2 * x0[i] + kChain) << i;
  // The memory of x and z is released once that work is done: only y remains of the three.
  ASSIGN_OR_FAIL(auto info1, c().GetServerInfo());
  EXPECT_EQ(info1.memory_used_bytes(), info0.memory_used_bytes() - kBig * 8);
  EXPECT_EQ(info1.buffer_count(), info0.buffer_count() - 1);
  ASSIGN_OR_FAIL(auto list, c().ListBuffers());
  ASSERT_EQ(list.buffers_size(), 1);
  EXPECT_EQ(list.buffers(0).name(), "y");
}

}  // namespace
}  // namespace gpucompute::testing

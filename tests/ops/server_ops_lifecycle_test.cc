// End-to-end tests of an operation's life: Submit without waiting, WaitOperation and
// GetOperation, the states QUEUED, RUNNING and SUCCEEDED, timing, unknown ids, and
// SubmitAsync's order.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

TEST_F(ServerOpsTest, OperationLifecycleTimingAndErrors) {
  if (TestBackendName() != "cpu") {
    GTEST_SKIP() << "needs a chain that outlasts the RPCs queueing it; a GPU finishes each link in "
                    "well under an RPC's time (the executor logic is the same on every backend)";
  }
  const std::vector<double> x = Iota(kBig, 0.5);
  const std::vector<double> y = Iota(kBig, 0.25);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), y));
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));

  // A long chain on the default stream, then x + y behind it, without waiting.
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), 2 * kChain);
  ASSERT_EQ(chain.size(), static_cast<size_t>(2 * kChain));
  for (const std::string& id : chain) EXPECT_TRUE(std::regex_match(id, kOpIdPattern)) << id;
  v1::SubmitRequest sum =
      Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}});
  const auto submit_start = std::chrono::steady_clock::now();
  ASSIGN_OR_FAIL(auto queued, c().Submit(sum));
  const double submit_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - submit_start).count();
  EXPECT_TRUE(std::regex_match(queued.id(), kOpIdPattern)) << queued.id();
  EXPECT_FALSE(queued.done()) << "returned the result of an operation queued behind " << 2 * kChain
                              << " others";
  // (QUEUED precisely: see OperationBehindAChainIsReportedQueued.)
  EXPECT_TRUE(queued.state() == v1::Operation::STATE_QUEUED ||
              queued.state() == v1::Operation::STATE_RUNNING)
      << v1::Operation::State_Name(queued.state());
  EXPECT_EQ(queued.kind(), v1::OPERATION_KIND_ELEMENTWISE);
  EXPECT_TRUE(std::regex_match(queued.stream_id(), kStreamIdPattern)) << queued.stream_id();
  EXPECT_LT(submit_seconds, 1.0);
  ASSERT_EQ(queued.outputs_size(), 1);  // the new output is known at once
  const std::string out_id = queued.outputs(0).id();

  // A short wait returns the operation not done, while the chain it waits behind runs.
  // (A loaded machine may finish the chain before a reply: then done is right, and only
  // the chain's last link, still running after the reply, proves the reply early.)
  const auto still_running = [&] {
    absl::StatusOr<v1::Operation> last_link = c().GetOperation(chain.back());
    return last_link.ok() && !last_link->done();
  };
  const auto wait_start = std::chrono::steady_clock::now();
  ASSIGN_OR_FAIL(auto waited, c().WaitOperation(queued.id(), 0.01));
  const double wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  if (still_running()) {
    EXPECT_FALSE(waited.done());
    EXPECT_TRUE(waited.state() == v1::Operation::STATE_QUEUED ||
                waited.state() == v1::Operation::STATE_RUNNING)
        << v1::Operation::State_Name(waited.state());
  }
  EXPECT_EQ(waited.id(), queued.id());
  EXPECT_GE(wait_seconds, 0.009);
  EXPECT_LT(wait_seconds, 5.0);
  // Submit with wait and a short wait_timeout_seconds behaves alike.
  v1::SubmitRequest short_wait = Increment(bz.id());
  short_wait.set_wait(true);
  short_wait.set_wait_timeout_seconds(0.01);
  ASSIGN_OR_FAIL(auto short_op, c().Submit(short_wait));
  if (still_running()) {
    EXPECT_FALSE(short_op.done());
  }

  ASSIGN_OR_FAIL(auto done, c().WaitOperation(queued.id()));
  ASSERT_TRUE(done.done());
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(done.error_code(), 0);
  EXPECT_EQ(done.stream_id(), queued.stream_id());
  const v1::Timing& t = done.timing();
  EXPECT_GT(t.device_seconds(), 0);
  EXPECT_GT(t.queued_seconds(), 0);  // it waited behind the chain
  EXPECT_EQ(t.bytes_read(), 2 * kBig * 8);
  EXPECT_EQ(t.bytes_written(), kBig * 8);
  EXPECT_EQ(t.flops(), kBig);  // one addition per element
  EXPECT_EQ(t.stream_id(), queued.stream_id());
  EXPECT_EQ(t.device(), 0);
  ASSERT_GT(t.device_seconds(), 0);
  const double gbps =
      static_cast<double>(t.bytes_read() + t.bytes_written()) / t.device_seconds() / 1e9;
  EXPECT_NEAR(t.gbps(), gbps, 1e-9 * gbps);
  EXPECT_NEAR(t.gflops(), static_cast<double>(kBig) / t.device_seconds() / 1e9, 1e-9 * t.gflops());
  ASSERT_EQ(done.outputs_size(), 1);
  EXPECT_EQ(done.outputs(0).id(), out_id);

  // GetOperation reports the same finished operation.
  ASSIGN_OR_FAIL(auto got, c().GetOperation(queued.id()));
  EXPECT_TRUE(got.done());
  EXPECT_EQ(got.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(got.timing().device_seconds(), t.device_seconds());
  EXPECT_EQ(got.timing().bytes_read(), t.bytes_read());
  // The chain ran before it, in order.
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(auto link, c().GetOperation(id));
    EXPECT_TRUE(link.done()) << id;
    EXPECT_EQ(link.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ASSIGN_OR_FAIL(auto out, DownloadArray<double>(c(), out_id));
  ASSERT_EQ(out.size(), kBig);
  for (size_t i = 0; i < kBig; ++i) ASSERT_EQ(out[i], x[i] + y[i]) << i;
  ASSERT_OK(c().SynchronizeStream(""));
  ExpectShifted(c(), bz.id(), std::vector<double>(kBig, 0.0), 2 * kChain + 1, "chain");

  // Unknown ids and bad timeouts.
  for (const char* id : {"op-00000000000000000000000000000000", "op-nope", "buf-0"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(c().GetOperation(id).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(c().WaitOperation(id, 0.01).status().code(), absl::StatusCode::kNotFound);
  }
  // A request that names no operation is invalid, not an operation that is missing.
  EXPECT_EQ(c().GetOperation("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation("", 0.01).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation(queued.id(), -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation(queued.id(), std::nan("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation("op-00000000000000000000000000000000", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::SubmitRequest negative = Waiting(sum);
  negative.set_wait_timeout_seconds(-0.5);
  {
    SCOPED_TRACE("Submit with a negative wait timeout");
    ExpectRejected(c(), negative, absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("Submit naming no operation");
    ExpectRejected(c(), v1::SubmitRequest(), absl::StatusCode::kInvalidArgument);
  }
}

// Operation.State says QUEUED is "waiting behind earlier work" and RUNNING follows it. An
// operation submitted behind a long chain on its stream has not started while the chain runs.
TEST_F(ServerOpsTest, OperationBehindAChainIsReportedQueued) {
  if (TestBackendName() != "cpu") {
    GTEST_SKIP() << "needs a chain that outlasts the RPCs queueing it; a GPU finishes each link in "
                    "well under an RPC's time (the executor logic is the same on every backend)";
  }
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), std::vector<double>(kBig, 1.0)));
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), kChain);
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  ASSIGN_OR_FAIL(auto last,
                 c().Submit(OnStream(Elementwise("x * 2", {{"x", BufferOperand(bx.id())}}), "")));
  EXPECT_EQ(last.state(), v1::Operation::STATE_QUEUED)
      << "reported while " << kChain << " earlier operations wait";
  ASSIGN_OR_FAIL(auto polled, c().GetOperation(last.id()));
  ASSIGN_OR_FAIL(auto last_link, c().GetOperation(chain.back()));
  if (!last_link.done()) {
    EXPECT_EQ(polled.state(), v1::Operation::STATE_QUEUED)
        << "still behind unfinished operation " << chain.back();
  }
  ASSIGN_OR_FAIL(auto done, c().WaitOperation(last.id()));
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
}

TEST_F(ServerOpsTest, SubmitAsyncChainResolvesInOrder) {
  constexpr size_t n = size_t{1} << 18;
  const std::vector<double> x0 = Iota(n);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x0));
  constexpr int kOps = 20;
  std::vector<OperationFuture> futures;
  for (int k = 0; k < kOps; ++k) futures.push_back(c().SubmitAsync(Increment(bx.id())));
  std::vector<std::string> ids;
  for (int k = 0; k < kOps; ++k) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(futures[k].valid());
    ASSERT_TRUE(futures[k].Wait(absl::Seconds(60)));
    const absl::StatusOr<v1::Operation>& op = futures[k].Get();
    ASSERT_OK(op);
    EXPECT_TRUE(op->done());
    EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
    EXPECT_TRUE(std::regex_match(op->id(), kOpIdPattern)) << op->id();
    ASSERT_EQ(op->outputs_size(), 1);
    EXPECT_EQ(op->outputs(0).id(), bx.id());
    ids.push_back(op->id());
    // Once op k is done, every earlier one is done on the server.
    for (int j = 0; j < k; ++j) {
      ASSIGN_OR_FAIL(auto earlier, c().GetOperation(ids[j]));
      EXPECT_TRUE(earlier.done()) << "op " << j << " not done when op " << k << " is";
    }
  }
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), static_cast<size_t>(kOps));
  ExpectShifted(c(), bx.id(), x0, kOps, "after 20 increments");
}

// Operations on one stream run in the order the server receives them. SubmitAsync calls made
// one after another from one thread must therefore reach the server in that order, or a chain
// of dependent operations built with SubmitAsync computes something else. The chain here does
// not commute: x = 3*x + k (int64, wrapping) for k = 1..200 from x = 1.
TEST_F(ServerOpsTest, SubmitAsyncPreservesSubmissionOrder) {
  constexpr size_t n = 1024;
  constexpr int kOps = 200;
  ASSIGN_OR_FAIL(auto bo, UploadArray(c(), std::vector<int64_t>(n, 1)));
  std::vector<OperationFuture> futures;
  for (int k = 1; k <= kOps; ++k) {
    futures.push_back(c().SubmitAsync(
        Elementwise("3*x + k", {{"x", BufferOperand(bo.id())}, {"k", ScalarOperand(k)}},
                    ExistingOutput(bo.id()))));
  }
  for (const OperationFuture& f : futures) {
    const absl::StatusOr<v1::Operation>& op = f.Get();
    ASSERT_OK(op);
    EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  }
  uint64_t want = 1;
  for (int k = 1; k <= kOps; ++k) want = 3 * want + static_cast<uint64_t>(k);
  // The control: the same chain submitted one call at a time with wait gives `want`.
  ASSIGN_OR_FAIL(auto control, UploadArray(c(), std::vector<int64_t>(n, 1)));
  for (int k = 1; k <= kOps; ++k) {
    ASSIGN_OR_FAIL(
        auto op,
        RunOp(c(),
              Elementwise("3*x + k", {{"x", BufferOperand(control.id())}, {"k", ScalarOperand(k)}},
                          ExistingOutput(control.id()))));
  }
  ASSIGN_OR_FAIL(auto control_values, DownloadArray<int64_t>(c(), control.id()));
  ASSERT_EQ(control_values.size(), n);
  ASSERT_EQ(static_cast<uint64_t>(control_values[0]), want);
  ASSIGN_OR_FAIL(auto got, DownloadArray<int64_t>(c(), bo.id()));
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(static_cast<uint64_t>(got[0]), want)
      << "SubmitAsync calls made in order from one thread ran on the stream in another order";
  for (size_t i = 1; i < n; ++i) ASSERT_EQ(got[i], got[0]) << i;
}

// A rejected Submit must not run: the output name is taken before anything is queued.
TEST_F(ServerOpsTest, RacingSubmitsForOneOutputNameRunOnce) {
  ASSERT_OK(UploadArray(c(), std::vector<double>(64, 1.0), {}, v1::LAYOUT_C, "x"));
  const uint64_t ran_before = CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE);
  constexpr int kThreads = 8;
  constexpr int kEach = 25;
  std::atomic<int> ok{0}, exists{0}, other{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kEach; ++i) {
        const double value = t * kEach + i;
        absl::StatusOr<v1::Operation> op = c().Submit(Elementwise(
            "x * v", {{"x", BufferOperand("x")}, {"v", ScalarOperand(value)}}, NewOutput("same")));
        if (op.ok()) {
          ++ok;
        } else if (op.status().code() == absl::StatusCode::kAlreadyExists) {
          ++exists;
        } else {
          ++other;
        }
      }
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(exists.load(), kThreads * kEach - 1);
  EXPECT_EQ(other.load(), 0);
  ASSERT_OK(c().SynchronizeStream(""));
  EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE), ran_before + 1);
  // The buffer holds one submission's result: x * v for a single v.
  ASSIGN_OR_FAIL(std::vector<double> got, DownloadArray<double>(c(), "same"));
  for (double v : got) EXPECT_EQ(v, got[0]);
}

}  // namespace
}  // namespace gpucompute::testing

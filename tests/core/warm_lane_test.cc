// The warm lane (server/util/warm_lane.h): where its jobs run, awake, busy, asleep and off;
// its idle work; many callers at once; and, through a real server, Submit and RunChain
// planned and launched on it, counted on /metrics, with the same answers and refusals as
// without it.
#include "server/util/warm_lane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/session.h"
#include "tests/metrics/metrics_scrape.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using testing::HttpRequest;
using testing::HttpResponse;

// Long enough that a lane started by a test never goes to sleep during it.
constexpr absl::Duration kAwake = absl::Seconds(600);

TEST(WarmLaneTest, WithoutASpinEveryJobRunsOnItsCaller) {
  WarmLane lane(absl::ZeroDuration(), "test-lane");
  for (int i = 0; i < 3; ++i) {
    std::thread::id ran_on;
    lane.Run([&] { ran_on = std::this_thread::get_id(); });
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  }
  EXPECT_EQ(lane.ran_on_lane(), 0u);
  EXPECT_EQ(lane.ran_on_caller(), 3u);
}

TEST(WarmLaneTest, AnAwakeLaneRunsTheJobOnItsOwnThreadAndReturnsOnceItHasRun) {
  WarmLane lane(kAwake, "test-lane");
  std::vector<std::thread::id> ran_on;
  for (int i = 0; i < 5; ++i) {
    lane.Run([&] {
      absl::SleepFor(absl::Milliseconds(2));  // a slow job is still waited for
      ran_on.push_back(std::this_thread::get_id());
    });
    ASSERT_EQ(ran_on.size(), static_cast<size_t>(i + 1));
  }
  for (const std::thread::id& id : ran_on) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, ran_on.front());  // one thread, the lane's
  }
  EXPECT_EQ(lane.ran_on_lane(), 5u);
  EXPECT_EQ(lane.ran_on_caller(), 0u);
}

TEST(WarmLaneTest, ACallerFindingTheLaneBusyRunsItsJobItself) {
  WarmLane lane(kAwake, "test-lane");
  absl::Notification second_done;
  std::thread::id first_ran_on;
  // The first job holds the lane until the second has run: it can only have run on its
  // own caller's thread, or this test would hang.
  std::thread first([&] {
    lane.Run([&] {
      first_ran_on = std::this_thread::get_id();
      second_done.WaitForNotification();
    });
  });
  while (lane.ran_on_lane() == 0 && first_ran_on == std::thread::id()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::thread::id second_ran_on;
  lane.Run([&] { second_ran_on = std::this_thread::get_id(); });
  second_done.Notify();
  first.join();
  EXPECT_NE(first_ran_on, first.get_id());
  EXPECT_EQ(second_ran_on, std::this_thread::get_id());
  EXPECT_EQ(lane.ran_on_lane(), 1u);
  EXPECT_EQ(lane.ran_on_caller(), 1u);
}

TEST(WarmLaneTest, ALaneAsleepIsWokenByACallerThatRanItsOwnJob) {
  WarmLane lane(absl::Milliseconds(1), "test-lane");
  absl::SleepFor(absl::Milliseconds(50));  // past its spin: asleep
  std::thread::id ran_on;
  lane.Run([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(lane.ran_on_caller(), 1u);
  // Woken, it takes the next job. (On a loaded machine it may have spun its millisecond
  // and slept again before a job came, and then the next caller wakes it: bounded tries.)
  for (int i = 0; i < 100 && lane.ran_on_lane() == 0; ++i) {
    lane.Run([&] { ran_on = std::this_thread::get_id(); });
  }
  EXPECT_EQ(lane.ran_on_lane(), 1u);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(WarmLaneTest, TheIdleWorkRunsWhileTheLaneSpinsAndNeverWithoutASpin) {
  std::atomic<int> idled{0};
  {
    WarmLane off(absl::ZeroDuration(), "test-lane", [&] { idled.fetch_add(1); });
    off.Run([] {});
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(idled.load(), 0);
  WarmLane lane(kAwake, "test-lane", [&] { idled.fetch_add(1); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (idled.load() < 100 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(idled.load(), 100);
}

TEST(WarmLaneTest, ACallerFindingTheLaneAtItsIdleWorkRunsItsJobItself) {
  absl::Notification idling;
  absl::Notification job_done;
  std::atomic<bool> first{true};
  // The first idle work holds the lane until the caller's job has run: it can only have
  // run on the caller's thread, or this test would hang.
  WarmLane lane(kAwake, "test-lane", [&] {
    if (!first.exchange(false)) return;
    idling.Notify();
    job_done.WaitForNotification();
  });
  idling.WaitForNotification();
  std::thread::id ran_on;
  lane.Run([&] { ran_on = std::this_thread::get_id(); });
  job_done.Notify();
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(lane.ran_on_caller(), 1u);
  // Its idle work done (once its thread is back from the wait), the lane takes jobs again.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (lane.ran_on_lane() == 0 && absl::Now() < deadline) {
    lane.Run([] {});
    absl::SleepFor(absl::Microseconds(100));
  }
  EXPECT_EQ(lane.ran_on_lane(), 1u);
}

TEST(WarmLaneTest, ManyCallersAtOnceRunEveryJobOnceAndSeeItsEffects) {
  WarmLane lane(kAwake, "test-lane");
  constexpr int kCallers = 8;
  constexpr int kJobs = 2000;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      int64_t mine = 0;  // written by the job, on whichever thread, read here after Run
      for (int j = 0; j < kJobs; ++j) {
        lane.Run([&] { mine += j; });
        if (mine != int64_t{j} * (j + 1) / 2) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(lane.ran_on_lane() + lane.ran_on_caller(), uint64_t{kCallers} * kJobs);
  EXPECT_GT(lane.ran_on_lane(), 0u);
}

TEST(WarmLaneTest, ALaneStopsWhetherSpinningAsleepOrRunningAJob) {
  { WarmLane spinning(kAwake, "test-lane"); }
  {
    WarmLane asleep(absl::Milliseconds(1), "test-lane");
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Destroyed while a job runs on it: the job finishes first.
  auto lane = std::make_unique<WarmLane>(kAwake, "test-lane");
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::thread caller([&] {
    lane->Run([&] {
      started = true;
      absl::SleepFor(absl::Milliseconds(50));
      finished = true;
    });
  });
  while (!started) absl::SleepFor(absl::Milliseconds(1));
  std::thread destroyer([&] { lane.reset(); });
  caller.join();
  destroyer.join();
  EXPECT_TRUE(finished);
}

// --- Through a server

class ServerLaneTest : public ::testing::Test {
 protected:
  void Start(absl::Duration spin) {
    server_ = testing::TestServer::StartWith(nullptr, 256 * testing::kMiB, 2,
                                             [&](ServerOptions& options) {
                                               options.lane_spin = spin;
                                               options.metrics_listen = "127.0.0.1:0";
                                             });
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect();
    ASSERT_NE(client_, nullptr);
  }

  // gpucompute_lane_jobs_total{ran_on=`where`}.
  double LaneJobs(const std::string& where) {
    HttpResponse r = HttpRequest(server_->server().metrics_port(), "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    return testing::Parse(r.body).at("gpucompute_lane_jobs_total{ran_on=\"" + where + "\"}");
  }

  // x + 1 into y, x * 2 summed, and a refused Submit and chain; checks every answer and
  // that the refusals changed nothing. Returns the calls made that use the lane.
  int Workload() {
    constexpr size_t kN = 1000;
    std::vector<double> x(kN);
    for (size_t i = 0; i < kN; ++i) x[i] = 0.25 * static_cast<double>(i) - 7;
    EXPECT_OK(testing::UploadArray(*client_, x, {}, v1::LAYOUT_C, "x"));
    EXPECT_OK(testing::UploadArray(*client_, std::vector<double>(kN, 0.0), {}, v1::LAYOUT_C, "y"));
    int calls = 0;

    v1::SubmitRequest add = Elementwise("x + 1", {{"x", BufferOperand("x")}}, ExistingOutput("y"));
    add.set_wait(true);
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<v1::Operation> op = client_->Submit(add);
      ++calls;
      EXPECT_OK(op);
      if (op.ok()) {
        EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED) << op->error_message();
      }
    }
    absl::StatusOr<std::vector<double>> y = testing::DownloadArray<double>(*client_, "y");
    EXPECT_OK(y);
    if (y.ok()) {
      int wrong = 0;
      for (size_t i = 0; i < kN; ++i) wrong += (*y)[i] != x[i] + 1;
      EXPECT_EQ(wrong, 0) << "values of y that are not x + 1";
    }

    Chain chain;
    const std::string doubled = chain.Add(Elementwise("x * 2", {{"x", BufferOperand("x")}}), "d");
    chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef(doubled)), "sum");
    double want = 0;
    for (double v : x) want += 2 * v;
    for (int i = 0; i < 3; ++i) {  // planned, planned and kept, then run prepared
      absl::StatusOr<v1::ChainResponse> answer = chain.Run(*client_);
      ++calls;
      EXPECT_OK(answer);
      if (answer.ok() && answer->steps_size() == 2 && answer->steps(1).operation().values_size() == 1) {
        EXPECT_NEAR(answer->steps(1).operation().values(0).float_value(), want, 1e-12 * std::abs(want));
      } else if (answer.ok()) {
        ADD_FAILURE() << answer->DebugString();
      }
    }

    const testing::Snapshot before = testing::TakeSnapshot(*client_);
    v1::SubmitRequest missing =
        Elementwise("x + 1", {{"x", BufferOperand("no-such-buffer")}}, ExistingOutput("y"));
    missing.set_wait(true);
    absl::StatusOr<v1::Operation> refused = client_->Submit(missing);
    ++calls;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
    EXPECT_NE(refused.status().message().find("no-such-buffer"), std::string::npos)
        << refused.status();
    Chain bad;
    bad.Add(Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput("kept")), "ok");
    bad.Add(Elementwise("x +", {{"x", BufferOperand("x")}}), "broken");
    absl::StatusOr<v1::ChainResponse> rejected = bad.Run(*client_);
    ++calls;
    EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument) << rejected.status();
    EXPECT_NE(rejected.status().message().find("broken"), std::string::npos) << rejected.status();
    EXPECT_EQ(testing::TakeSnapshot(*client_), before);
    return calls;
  }

  std::unique_ptr<testing::TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServerLaneTest, SubmitsAndChainsRunOnAnAwakeLaneWithTheSameAnswersAndRefusals) {
  Start(kAwake);
  const int calls = Workload();
  // Every call passed through the lane. One at a time, each finds it idle, unless it
  // comes while the lane polls the backend's completions (every 2 us, for a moment on
  // the CPU backend, up to microseconds on CUDA), and then runs its job itself.
  EXPECT_EQ(LaneJobs("lane") + LaneJobs("call"), calls);
  EXPECT_GE(LaneJobs("lane"), calls / 2);
}

TEST_F(ServerLaneTest, WithTheLaneOffEveryCallRunsOnItsOwnThread) {
  Start(absl::ZeroDuration());
  const int calls = Workload();
  EXPECT_EQ(LaneJobs("lane"), 0);
  EXPECT_EQ(LaneJobs("call"), calls);
}

TEST_F(ServerLaneTest, ManyClientsAtOnceOnAnAwakeLaneGetTheirOwnAnswers) {
  Start(kAwake);
  constexpr int kClients = 8;
  constexpr int kOps = 50;
  constexpr size_t kN = 256;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<Client> client = server_->Connect("client" + std::to_string(c));
      if (client == nullptr) return failures.fetch_add(1), void();
      std::vector<double> x(kN, static_cast<double>(c));
      if (!testing::UploadArray(*client, x, {}, v1::LAYOUT_C, "x").ok()) {
        return failures.fetch_add(1), void();
      }
      v1::SubmitRequest sum = Reduce(v1::REDUCE_KIND_SUM, "x");
      sum.set_wait(true);
      for (int i = 0; i < kOps; ++i) {
        absl::StatusOr<v1::Operation> op = client->Submit(sum);
        if (!op.ok() || op->values_size() != 1 || op->values(0).float_value() != c * double{kN}) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(LaneJobs("lane") + LaneJobs("call"), kClients * kOps);
  EXPECT_GT(LaneJobs("lane"), 0);
}

}  // namespace
}  // namespace gpucompute

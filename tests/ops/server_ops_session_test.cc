// Sessions and chains (SessionService) through a real server: tags and dependencies,
// failures passed on to dependents, cancellation, chains checked whole, many sessions at
// once.
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "client/cpp/session.h"
#include "gpucompute/v1/limits.h"
#include "tests/ops/server_ops_fixture.h"

namespace gpucompute::testing {
namespace {

using SessionTest = ServerOpsTest;

absl::StatusOr<v1::Operation> Result(const Session::Submitted& submitted) {
  return submitted.result.Get();
}

TEST_F(SessionTest, TagsFeedLaterOperationsBeforeTheyRun) {
  const std::vector<double> x = RandomDoubles(1000, -2, 2, 1);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(std::unique_ptr<Session> session, Session::Open(c()));
  // a = 2x; s = sum(a); c = a + 1 (named); then c = 3a through c's tag, after c.
  auto a = session->Submit(Elementwise("x * 2", {{"x", BufferOperand("x")}}), "a");
  auto s = session->Submit(Reduce(v1::REDUCE_KIND_SUM, a.Ref()), "s");
  auto cc = session->Submit(Elementwise("a + 1", {{"a", Tagged("a")}}, NewOutput("c")), "c");
  auto d = session->Submit(Elementwise("a * 3", {{"a", Tagged("a")}}, ExistingOutput(cc.Ref())));
  EXPECT_EQ(d.tag, "#4");
  for (const auto* op : {&a, &s, &cc, &d}) {
    ASSIGN_OR_FAIL(v1::Operation done, Result(*op));
    EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED)
        << op->tag << ": " << done.error_message();
    EXPECT_TRUE(done.done());
  }
  double sum = 0;
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    sum += 2 * x[i];
    want[i] = 2 * x[i] * 3;
  }
  ASSIGN_OR_FAIL(v1::Operation summed, Result(s));
  ASSERT_EQ(summed.values_size(), 1);
  EXPECT_NEAR(summed.values(0).float_value(), sum, 1e-12 * x.size());
  ASSIGN_OR_FAIL(std::vector<double> got, DownloadArray<double>(c(), "c"));
  ExpectClose(got, want, 1e-15, 1e-300, "c = 3a");
  ASSERT_OK(session->Close());
  // The temporaries (a, s) are gone with the session; x and the named c stay.
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  ASSERT_EQ(list.buffers_size(), 2);
  EXPECT_EQ(list.total_bytes(), 2 * x.size() * sizeof(double));
}

TEST_F(SessionTest, AFailureFailsItsDependentsAndNothingElse) {
  ASSERT_OK(UploadArray(c(), std::vector<double>{1, 2, 3, 4}, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(std::unique_ptr<Session> session, Session::Open(c()));
  auto bad = session->Submit(Elementwise("x +", {{"x", BufferOperand("x")}}), "bad");
  auto dep = session->Submit(Elementwise("b * 2", {{"b", Tagged("bad")}}), "dep");
  auto dep2 = session->Submit(Reduce(v1::REDUCE_KIND_SUM, TagRef("dep")), "dep2");
  auto fine =
      session->Submit(Elementwise("x + 1", {{"x", BufferOperand("x")}}, NewOutput("y")), "fine");
  auto unknown = session->Submit(Reduce(v1::REDUCE_KIND_SUM, TagRef("nope")), "unknown");
  auto again = session->Submit(Reduce(v1::REDUCE_KIND_SUM, "x"), "fine");
  auto after = session->Submit(Reduce(v1::REDUCE_KIND_MAX, fine.Ref()), "after");

  ASSIGN_OR_FAIL(v1::Operation r, Result(bad));
  EXPECT_EQ(r.state(), v1::Operation::STATE_FAILED);
  EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  ASSIGN_OR_FAIL(r, Result(dep));
  EXPECT_EQ(r.state(), v1::Operation::STATE_FAILED);
  EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  ExpectContains(r.error_message(), "tag 'bad'");
  ASSIGN_OR_FAIL(r, Result(dep2));
  EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  ExpectContains(r.error_message(), "tag 'dep'");
  ASSIGN_OR_FAIL(r, Result(unknown));
  EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  ExpectContains(r.error_message(), "tag 'nope'");
  // The independent operation ran; its tag is not taken over by a duplicate.
  ASSIGN_OR_FAIL(r, Result(fine));
  EXPECT_EQ(r.state(), v1::Operation::STATE_SUCCEEDED) << r.error_message();
  EXPECT_FALSE(again.result.valid() && again.result.Get().ok() &&
               again.result.Get()->state() == v1::Operation::STATE_SUCCEEDED);
  ASSIGN_OR_FAIL(r, Result(after));
  EXPECT_EQ(r.state(), v1::Operation::STATE_SUCCEEDED) << r.error_message();
  ASSERT_EQ(r.values_size(), 1);
  EXPECT_EQ(r.values(0).float_value(), 5.0);
  ASSERT_OK(session->Close());
  ASSIGN_OR_FAIL(std::vector<double> y, DownloadArray<double>(c(), "y"));
  EXPECT_EQ(y, (std::vector<double>{2, 3, 4, 5}));
}

TEST_F(SessionTest, CancelledMidFlightLeaksNothingAndKeepsNamedBuffers) {
  const size_t n = kBig / 4;
  const std::vector<double> base = Iota(n);
  ASSERT_OK(UploadArray(c(), base, {}, v1::LAYOUT_C, "keep"));
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  ASSIGN_OR_FAIL(std::unique_ptr<Session> session, Session::Open(c()));
  auto named = session->Submit(
      Elementwise("x + 1", {{"x", BufferOperand("keep")}}, NewOutput("named")), "named");
  ASSERT_OK(Result(named));
  // A chain of temporaries, each from the last, cancelled while it runs.
  std::vector<Session::Submitted> chain;
  std::string last = "keep";
  for (int i = 0; i < 24; ++i) {
    chain.push_back(session->Submit(Elementwise("x + 1", {{"x", BufferOperand(last)}})));
    last = chain.back().Ref();
  }
  EXPECT_EQ(session->Cancel().code(), absl::StatusCode::kCancelled);
  for (const Session::Submitted& s : chain) {
    ASSERT_TRUE(s.result.Wait(absl::Seconds(30)));  // answered or cancelled, never left
  }
  // The server ends its side of the call after the client's Cancel returns: its last
  // operations may still be planned (and their temporaries made) until then.
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  for (int i = 0; i < 500 && list.buffers_size() != 2; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    ASSIGN_OR_FAIL(list, c().ListBuffers());
  }
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + n * sizeof(double));
  ASSERT_EQ(list.buffers_size(), 2);
  EXPECT_EQ(list.buffers(0).name(), "keep");
  EXPECT_EQ(list.buffers(1).name(), "named");
  ExpectShifted(c(), "keep", base, 0, "keep");
  ExpectShifted(c(), "named", base, 1, "named");
}

TEST_F(SessionTest, ManyConcurrentSessionsGiveReferenceValues) {
  constexpr int kSessions = 16;
  constexpr int kOps = 200;
  constexpr size_t kN = 256;
  std::vector<std::vector<double>> inputs;
  for (int s = 0; s < kSessions; ++s) {
    inputs.push_back(RandomDoubles(kN, -1, 1, 100 + s));
    ASSERT_OK(UploadArray(c(), inputs.back(), {}, v1::LAYOUT_C, absl::StrCat("x", s)));
  }
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(c());
      if (!session.ok()) {
        ++failures;
        return;
      }
      // y_k = y_{k-1} * 0.5 + k, from y_0 = x: each step through the last one's tag.
      std::vector<Session::Submitted> ops;
      std::string last = absl::StrCat("x", s);
      for (int k = 1; k < kOps; ++k) {
        v1::Output out = k == kOps - 1 ? NewOutput(absl::StrCat("y", s)) : v1::Output();
        ops.push_back((*session)->Submit(Elementwise(
            "y * 0.5 + k", {{"y", BufferOperand(last)}, {"k", ScalarOperand(k)}}, out)));
        last = ops.back().Ref();
      }
      ops.push_back((*session)->Submit(Reduce(v1::REDUCE_KIND_SUM, last), "sum"));
      std::vector<double> y = inputs[s];
      for (int k = 1; k < kOps; ++k) {
        for (double& v : y) v = v * 0.5 + k;
      }
      double sum = 0;
      for (double v : y) sum += v;
      for (const Session::Submitted& op : ops) {
        const absl::StatusOr<v1::Operation>& done = op.result.Get();
        if (!done.ok() || done->state() != v1::Operation::STATE_SUCCEEDED) ++failures;
      }
      const absl::StatusOr<v1::Operation>& summed = ops.back().result.Get();
      if (!summed.ok() || summed->values_size() != 1 ||
          std::abs(summed->values(0).float_value() - sum) > 1e-9 * std::abs(sum)) {
        ++failures;
      }
      if (!(*session)->Close().ok()) ++failures;
      absl::StatusOr<std::vector<double>> got = DownloadArray<double>(c(), absl::StrCat("y", s));
      if (!got.ok()) {
        ++failures;
        return;
      }
      ExpectClose(*got, y, 1e-14, 1, absl::StrCat("session ", s));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Only the named results stay.
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + kSessions * kN * sizeof(double));
}

// A Session stream of a raw stub, as the client's name; for what the Session class never
// sends.
class RawSession {
 public:
  explicit RawSession(Client& client) : stub_(v1::SessionService::NewStub(client.channel())) {
    context_.AddMetadata(kClientMetadataKey, client.options().client_name);
    stream_ = stub_->Session(&context_);
  }
  bool Write(const v1::SessionRequest& request) { return stream_->Write(request); }
  // Reads until `count` answers have come or the stream ends; the messages they came in
  // are counted in `messages`.
  std::map<std::string, v1::Operation> Read(size_t count, int* messages = nullptr) {
    std::map<std::string, v1::Operation> answers;
    v1::SessionResponse response;
    while (answers.size() < count && stream_->Read(&response)) {
      if (messages != nullptr) ++*messages;
      for (const v1::ChainStepResult& a : response.answers()) answers[a.tag()] = a.operation();
    }
    return answers;
  }
  grpc::Status Finish() {
    (void)stream_->WritesDone();
    v1::SessionResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<v1::SessionService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
};

void AddOp(v1::SessionRequest* request, std::string_view tag, v1::SubmitRequest op) {
  v1::ChainStep* step = request->add_ops();
  step->set_tag(std::string(tag));
  *step->mutable_op() = std::move(op);
}

TEST_F(SessionTest, OneRequestCarriesManyOperationsThatFeedEachOther) {
  const std::vector<double> x = RandomDoubles(300, -1, 1, 3);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  RawSession raw(c());
  v1::SessionRequest request;
  AddOp(&request, "a", Elementwise("x * 2", {{"x", BufferOperand("x")}}));
  AddOp(&request, "s", Reduce(v1::REDUCE_KIND_SUM, TagRef("a")));
  AddOp(&request, "b", Elementwise("a + 1", {{"a", Tagged("a")}}, NewOutput("b")));
  AddOp(&request, "bad", Reduce(v1::REDUCE_KIND_SUM, TagRef("nope")));
  ASSERT_TRUE(raw.Write(request));
  std::map<std::string, v1::Operation> answers = raw.Read(4);
  ASSERT_EQ(answers.size(), 4u);
  for (const char* tag : {"a", "s", "b"}) {
    EXPECT_EQ(answers[tag].state(), v1::Operation::STATE_SUCCEEDED)
        << tag << ": " << answers[tag].error_message();
  }
  EXPECT_EQ(answers["bad"].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  ExpectContains(answers["bad"].error_message(), "tag 'nope'");
  double sum = 0;
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    sum += 2 * x[i];
    want[i] = 2 * x[i] + 1;
  }
  ASSERT_EQ(answers["s"].values_size(), 1);
  EXPECT_NEAR(answers["s"].values(0).float_value(), sum, 1e-12 * x.size());
  EXPECT_OK(FromGrpcStatus(raw.Finish()));
  ASSIGN_OR_FAIL(std::vector<double> b, DownloadArray<double>(c(), "b"));
  ExpectClose(b, want, 1e-15, 1e-300, "b = 2x + 1");
  // The temporary a went with the session.
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  EXPECT_EQ(list.buffers_size(), 2);
}

TEST_F(SessionTest, AnOperationRefusedAtQueueingFailsItsDependentsInTheSameRequest) {
  // One request: a's operation is queued with the ones after it; bad's names a stream
  // that does not exist, so it is refused when queued; dep depends on it; m creates a
  // named buffer, which "after" finds by name in the same request.
  ASSERT_OK(UploadArray(c(), std::vector<double>{1, 2, 3, 4}, {}, v1::LAYOUT_C, "x"));
  RawSession raw(c());
  v1::SessionRequest request;
  AddOp(&request, "a", Elementwise("x * 2", {{"x", BufferOperand("x")}}));
  v1::SubmitRequest bad = Elementwise("x + 1", {{"x", BufferOperand("x")}});
  bad.set_stream_id("str-missing");
  AddOp(&request, "bad", std::move(bad));
  AddOp(&request, "dep", Elementwise("b * 2", {{"b", Tagged("bad")}}));
  AddOp(&request, "m", Elementwise("a + x", {{"a", Tagged("a")}, {"x", BufferOperand("x")}},
                                   NewOutput("m")));
  AddOp(&request, "after", Reduce(v1::REDUCE_KIND_SUM, "m"));
  AddOp(&request, "sum", Reduce(v1::REDUCE_KIND_SUM, TagRef("a")));
  ASSERT_TRUE(raw.Write(request));
  std::map<std::string, v1::Operation> answers = raw.Read(6);
  ASSERT_EQ(answers.size(), 6u);
  EXPECT_EQ(answers["bad"].error_code(), static_cast<int>(absl::StatusCode::kNotFound));
  ExpectContains(answers["bad"].error_message(), "str-missing");
  EXPECT_EQ(answers["dep"].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  ExpectContains(answers["dep"].error_message(), "tag 'bad'");
  for (const char* tag : {"a", "m", "after", "sum"}) {
    EXPECT_EQ(answers[tag].state(), v1::Operation::STATE_SUCCEEDED)
        << tag << ": " << answers[tag].error_message();
  }
  ASSERT_EQ(answers["after"].values_size(), 1);
  EXPECT_EQ(answers["after"].values(0).float_value(), 30.0);  // 3 * (1 + 2 + 3 + 4)
  ASSERT_EQ(answers["sum"].values_size(), 1);
  EXPECT_EQ(answers["sum"].values(0).float_value(), 20.0);
  EXPECT_OK(FromGrpcStatus(raw.Finish()));
  // Of the new buffers only the named one stays.
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  ASSERT_EQ(list.buffers_size(), 2);
  ASSIGN_OR_FAIL(std::vector<double> m, DownloadArray<double>(c(), "m"));
  EXPECT_EQ(m, (std::vector<double>{3, 6, 9, 12}));
}

TEST_F(SessionTest, ARequestOverTheInFlightBoundEndsTheSessionAndRunsNoneOfIt) {
  ASSERT_OK(UploadArray(c(), std::vector<double>{1, 2, 3}, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  RawSession raw(c());
  v1::SessionRequest first;
  AddOp(&first, "t", Elementwise("x + 1", {{"x", BufferOperand("x")}}));
  ASSERT_TRUE(raw.Write(first));
  ASSERT_EQ(raw.Read(1).size(), 1u);
  v1::SessionRequest over;
  for (uint32_t i = 0; i <= kMaxSessionInFlight; ++i) {
    AddOp(&over, absl::StrCat("n", i),
          Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput(absl::StrCat("n", i))));
  }
  (void)raw.Write(over);
  const grpc::Status status = raw.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectContains(status.error_message(), "carried 1025 operations; at most 1024");
  // None of the operations ran, and the temporary t is gone: only x is left.
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes());
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  ASSERT_EQ(list.buffers_size(), 1);
  EXPECT_EQ(list.buffers(0).name(), "x");
  ASSIGN_OR_FAIL(std::vector<double> x, DownloadArray<double>(c(), "x"));
  EXPECT_EQ(x, (std::vector<double>{1, 2, 3}));
}

TEST_F(SessionTest, ThreadsSubmittingFarAheadOnOneSessionGetEveryAnswer) {
  // More operations than one message takes, from several threads at once: the queued
  // ones go in batches.
  constexpr int kThreads = 4;
  constexpr int kOps = 1500;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_OK(
        UploadArray(c(), std::vector<double>{double(t)}, {}, v1::LAYOUT_C, absl::StrCat("y", t)));
  }
  ASSIGN_OR_FAIL(std::unique_ptr<Session> session, Session::Open(c()));
  std::vector<std::vector<Session::Submitted>> ops(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string y = absl::StrCat("y", t);
      for (int k = 0; k < kOps; ++k) {
        // One lost or repeated operation changes the count.
        ops[t].push_back(
            session->Submit(Elementwise("y + 1", {{"y", BufferOperand(y)}}, ExistingOutput(y))));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_OK(session->Close());
  for (int t = 0; t < kThreads; ++t) {
    for (const Session::Submitted& op : ops[t]) {
      ASSIGN_OR_FAIL(v1::Operation done, Result(op));
      ASSERT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED)
          << op.tag << ": " << done.error_message();
    }
    ASSIGN_OR_FAIL(std::vector<double> y, DownloadArray<double>(c(), absl::StrCat("y", t)));
    EXPECT_EQ(y, (std::vector<double>{double(t + kOps)}));
  }
}

TEST_F(SessionTest, ChainRunsInOneCallAndFreesItsTemporaries) {
  const std::vector<double> x = RandomDoubles(500, 1, 3, 7);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  Chain chain;
  chain.Add(Reduce(v1::REDUCE_KIND_MEAN, "x"), "mean");
  chain.Add(Elementwise("x - 1", {{"x", BufferOperand("x")}}), "shifted");
  chain.Add(Reduce(v1::REDUCE_KIND_NORM2, TagRef("shifted")), "norm");
  chain.Add(Elementwise("s * 2", {{"s", Tagged("shifted")}}, NewOutput("doubled")), "doubled");
  chain.Add(Elementwise("s * s", {{"s", Tagged("shifted")}}), "squared");
  chain.Keep("squared");
  ASSIGN_OR_FAIL(v1::ChainResponse response, chain.Run(c()));
  ASSERT_EQ(response.steps_size(), 5);
  double mean = 0, norm = 0;
  for (double v : x) {
    mean += v / x.size();
    norm += (v - 1) * (v - 1);
  }
  norm = std::sqrt(norm);
  for (const v1::ChainStepResult& step : response.steps()) {
    EXPECT_EQ(step.operation().state(), v1::Operation::STATE_SUCCEEDED)
        << step.tag() << ": " << step.operation().error_message();
    EXPECT_TRUE(step.operation().has_timing());
  }
  EXPECT_EQ(response.steps(0).tag(), "mean");
  EXPECT_NEAR(response.steps(0).operation().values(0).float_value(), mean, 1e-13);
  EXPECT_NEAR(response.steps(2).operation().values(0).float_value(), norm, 1e-12 * norm);
  // The temporary is not reported as an output; the kept and the named ones are.
  EXPECT_EQ(response.steps(1).operation().outputs_size(), 0);
  ASSERT_EQ(response.steps(3).operation().outputs_size(), 1);
  EXPECT_EQ(response.steps(3).operation().outputs(0).name(), "doubled");
  ASSERT_EQ(response.steps(4).operation().outputs_size(), 1);
  const std::string squared_id = response.steps(4).operation().outputs(0).id();

  std::vector<double> doubled(x.size()), squared(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    doubled[i] = (x[i] - 1) * 2;
    squared[i] = (x[i] - 1) * (x[i] - 1);
  }
  ASSIGN_OR_FAIL(std::vector<double> got, DownloadArray<double>(c(), "doubled"));
  ExpectClose(got, doubled, 1e-15, 1e-300, "doubled");
  ASSIGN_OR_FAIL(got, DownloadArray<double>(c(), squared_id));
  ExpectClose(got, squared, 1e-15, 1e-300, "squared");
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  EXPECT_EQ(list.buffers_size(), 3);  // x, doubled, squared
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + 2 * x.size() * sizeof(double));
}

TEST_F(SessionTest, AChainOnTwoStreamsAnswersOnceBothAreDone) {
  // A long step and its reduction on stream A, then a short step on stream B, which
  // finishes first: the answer must still wait for A.
  const std::vector<double> x = RandomDoubles(size_t{1} << 21, -2, 2, 11);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>{5}, {}, v1::LAYOUT_C, "small"));
  ASSIGN_OR_FAIL(v1::StreamInfo a, c().CreateStream());
  ASSIGN_OR_FAIL(v1::StreamInfo b, c().CreateStream());
  auto on = [](v1::SubmitRequest request, const std::string& stream) {
    request.set_stream_id(stream);
    return request;
  };
  Chain chain;
  chain.Add(on(Elementwise("sin(x) * exp(x) + sqrt(abs(x))", {{"x", BufferOperand("x")}}),
               a.id()),
            "long");
  chain.Add(on(Reduce(v1::REDUCE_KIND_SUM, TagRef("long")), a.id()), "sum");
  chain.Add(on(Elementwise("s + 1", {{"s", BufferOperand("small")}}), b.id()), "short");
  ASSIGN_OR_FAIL(v1::ChainResponse response, chain.Run(c()));
  ASSERT_EQ(response.steps_size(), 3);
  for (const v1::ChainStepResult& step : response.steps()) {
    ASSERT_EQ(step.operation().state(), v1::Operation::STATE_SUCCEEDED)
        << step.tag() << ": " << step.operation().error_message();
  }
  EXPECT_EQ(response.steps(0).operation().stream_id(), a.id());
  EXPECT_EQ(response.steps(2).operation().stream_id(), b.id());
  double sum = 0;
  for (double v : x) sum += std::sin(v) * std::exp(v) + std::sqrt(std::abs(v));
  ASSERT_EQ(response.steps(1).operation().values_size(), 1);
  EXPECT_NEAR(response.steps(1).operation().values(0).float_value(), sum, 1e-9 * std::abs(sum));
}

// Longer than the steps the server queues and launches together, so that it spans
// several of those runs.
constexpr int kLongChain = 70;

TEST_F(SessionTest, ALongChainRunsItsStepsInOrderAndAnswersEach) {
  const std::vector<double> x = RandomDoubles(300, -1, 1, 5);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  // Step k is x + (k + 1); step 40 is kept; the last step sums the one before it.
  Chain chain;
  std::string last = chain.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), "s0");
  for (int k = 1; k < kLongChain - 1; ++k) {
    last = chain.Add(Elementwise("s + 1", {{"s", Tagged(last)}}), absl::StrCat("s", k));
  }
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef(last)), "sum");
  chain.Keep("s40");
  ASSIGN_OR_FAIL(v1::ChainResponse response, chain.Run(c()));
  ASSERT_EQ(response.steps_size(), kLongChain);
  std::set<std::string> ids;
  for (int k = 0; k < kLongChain; ++k) {
    const v1::ChainStepResult& step = response.steps(k);
    EXPECT_EQ(step.tag(), k == kLongChain - 1 ? "sum" : absl::StrCat("s", k));
    const v1::Operation& op = step.operation();
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << k << ": " << op.error_message();
    EXPECT_TRUE(op.done()) << k;
    EXPECT_EQ(op.kind(), k == kLongChain - 1 ? v1::OPERATION_KIND_REDUCE
                                             : v1::OPERATION_KIND_ELEMENTWISE)
        << k;
    EXPECT_FALSE(op.stream_id().empty()) << k;
    EXPECT_GT(op.timing().device_seconds(), 0) << k;
    EXPECT_EQ(op.timing().bytes_written(), k == kLongChain - 1 ? 8u : x.size() * 8) << k;
    ids.insert(op.id());
    // Only the kept step reports its new buffer; the temporaries are not outputs.
    EXPECT_EQ(op.outputs_size(), k == 40 ? 1 : 0) << k;
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kLongChain)) << "operation ids are not distinct";
  double sum = 0;
  std::vector<double> s40(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    for (int k = 0; k < kLongChain - 1; ++k) {
      v += 1;
      if (k == 40) s40[i] = v;
    }
    sum += v;
  }
  const v1::Operation& total = response.steps(kLongChain - 1).operation();
  ASSERT_EQ(total.values_size(), 1);
  EXPECT_NEAR(total.values(0).float_value(), sum, 1e-12 * std::abs(sum) + 1e-9);
  ASSIGN_OR_FAIL(std::vector<double> got,
                 DownloadArray<double>(c(), response.steps(40).operation().outputs(0).id()));
  ExpectClose(got, s40, 0, 0, "s40");
  // The temporaries are freed; the kept buffer stays.
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + x.size() * sizeof(double));
}

TEST_F(SessionTest, AChainWhoseLateStepTheExecutorWouldRefuseIsRejectedWhole) {
  ASSERT_OK(UploadArray(c(), std::vector<double>{1, 2, 3}, {}, v1::LAYOUT_C, "x"));
  const Snapshot before = TakeSnapshot(c());
  const uint64_t ran_before = CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE);
  // Step 60, past the first steps queued and launched together, names a stream that
  // does not exist: nothing runs, and the named outputs before it are not created.
  Chain chain;
  for (int k = 0; k < kLongChain; ++k) {
    v1::SubmitRequest op = Elementwise(absl::StrCat("x + ", k), {{"x", BufferOperand("x")}},
                                       k % 10 == 0 ? NewOutput(absl::StrCat("n", k)) : v1::Output());
    if (k == 60) op.set_stream_id("str-0123456789abcdef0123456789abcdef");
    chain.Add(op, absl::StrCat("s", k));
  }
  absl::StatusOr<v1::ChainResponse> response = chain.Run(c());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound) << response.status();
  ExpectContains(std::string(response.status().message()), "step 60 ('s60')");
  EXPECT_EQ(TakeSnapshot(c()), before);
  EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE), ran_before);
}

TEST_F(SessionTest, AnInvalidChainStepRejectsTheWholeChain) {
  ASSERT_OK(UploadArray(c(), std::vector<double>{1, 2, 3}, {}, v1::LAYOUT_C, "x"));
  // Two elements: its shape does not broadcast with x's.
  ASSERT_OK(UploadArray(c(), std::vector<double>{9, 8}, {}, v1::LAYOUT_C, "taken"));
  const Snapshot before = TakeSnapshot(c());
  const uint64_t ran_before = CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE);
  auto expect_rejected = [&](const Chain& chain, absl::StatusCode code, std::string_view needle) {
    absl::StatusOr<v1::ChainResponse> response = chain.Run(c());
    EXPECT_EQ(response.status().code(), code) << response.status();
    ExpectContains(std::string(response.status().message()), needle);
    EXPECT_EQ(TakeSnapshot(c()), before);
    EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE), ran_before);
  };
  Chain unknown_tag;
  unknown_tag.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}, NewOutput("a")), "a");
  unknown_tag.Add(Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput("b")), "b");
  unknown_tag.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef("zzz")), "c");
  expect_rejected(unknown_tag, absl::StatusCode::kInvalidArgument, "step 2 ('c')");

  Chain bad_shape;
  bad_shape.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}, NewOutput("a")), "a");
  bad_shape.Add(Elementwise("a + t", {{"a", Tagged("a")}, {"t", BufferOperand("taken")}}), "b");
  expect_rejected(bad_shape, absl::StatusCode::kInvalidArgument, "step 1 ('b')");

  Chain name_taken;
  name_taken.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}, NewOutput("a")), "a");
  name_taken.Add(Elementwise("x + 2", {{"x", BufferOperand("x")}}, NewOutput("taken")), "b");
  expect_rejected(name_taken, absl::StatusCode::kAlreadyExists, "step 1 ('b')");

  Chain same_name_twice;
  same_name_twice.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}, NewOutput("n")), "a");
  same_name_twice.Add(Elementwise("x + 2", {{"x", BufferOperand("x")}}, NewOutput("n")), "b");
  expect_rejected(same_name_twice, absl::StatusCode::kAlreadyExists, "step 1 ('b')");

  Chain duplicate_tag;
  duplicate_tag.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), "a");
  duplicate_tag.Add(Elementwise("x + 2", {{"x", BufferOperand("x")}}), "a");
  expect_rejected(duplicate_tag, absl::StatusCode::kInvalidArgument, "step 1 ('a')");

  Chain bad_keep;
  bad_keep.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), "a");
  bad_keep.Keep("b");
  expect_rejected(bad_keep, absl::StatusCode::kInvalidArgument, "keep names tag 'b'");

  expect_rejected(Chain(), absl::StatusCode::kInvalidArgument, "at least one step");
}

}  // namespace
}  // namespace gpucompute::testing

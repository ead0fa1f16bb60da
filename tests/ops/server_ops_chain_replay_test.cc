// Chains submitted again unchanged, run prepared (server/service/chain_replay.h), through
// a real server: the same answers as a planned run, the buffers they name followed by
// name, their temporaries freed once a buffer they name goes, and the refusals of a
// planned run.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "client/cpp/session.h"
#include "tests/ops/server_ops_fixture.h"

namespace gpucompute::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

using ChainReplayTest = ServerOpsTest;

constexpr size_t kN = 300;
constexpr int kIncrements = 10;

// s0 = x * 0.5 + 1, s_k = s_(k-1) * 0.5 + 1 (temporaries), "into_y" writes 2 * s_last into
// the existing buffer y, "sum" sums s_last, "noise" fills a temporary with random values.
Chain HalvingChain() {
  Chain chain;
  std::string last = chain.Add(Elementwise("x * 0.5 + 1", {{"x", BufferOperand("x")}}), "s0");
  for (int k = 1; k < kIncrements; ++k) {
    last = chain.Add(Elementwise("s * 0.5 + 1", {{"s", Tagged(last)}}), absl::StrCat("s", k));
  }
  chain.Add(Elementwise("s * 2", {{"s", Tagged(last)}}, ExistingOutput("y")), "into_y");
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef(last)), "sum");
  chain.Add(Random(v1::DISTRIBUTION_UNIFORM, {64}, v1::DTYPE_FLOAT64, 7), "noise");
  return chain;
}

// What HalvingChain leaves in y, and its sum, from x.
struct Expected {
  std::vector<double> y;
  double sum = 0;
};
Expected Reference(const std::vector<double>& x) {
  Expected e;
  for (double v : x) {
    for (int k = 0; k < kIncrements; ++k) v = v * 0.5 + 1;
    e.y.push_back(2 * v);
    e.sum += v;
  }
  return e;
}

// Runs `chain` and checks its answers against `x`; returns the distinct operation ids
// of its steps.
std::set<std::string> RunAndCheck(Client& client, const Chain& chain, const std::vector<double>& x,
                                  v1::ChainResponse* out = nullptr) {
  absl::StatusOr<v1::ChainResponse> response = chain.Run(client);
  EXPECT_OK(response);
  if (!response.ok()) return {};
  const int steps = chain.request().steps_size();
  EXPECT_EQ(response->steps_size(), steps);
  std::set<std::string> ids;
  for (int k = 0; k < response->steps_size(); ++k) {
    const v1::ChainStepResult& step = response->steps(k);
    EXPECT_EQ(step.tag(), chain.request().steps(k).tag());
    const v1::Operation& op = step.operation();
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << step.tag() << ": " << op.error_message();
    EXPECT_TRUE(std::regex_match(op.id(), kOpIdPattern)) << op.id();
    EXPECT_FALSE(op.stream_id().empty());
    ids.insert(op.id());
  }
  const Expected want = Reference(x);
  const v1::Operation& sum = response->steps(steps - 2).operation();
  EXPECT_EQ(sum.kind(), v1::OPERATION_KIND_REDUCE);
  EXPECT_EQ(sum.values_size(), 1);
  if (sum.values_size() == 1) {
    EXPECT_NEAR(sum.values(0).float_value(), want.sum, 1e-12 * std::abs(want.sum));
  }
  absl::StatusOr<std::vector<double>> y = DownloadArray<double>(client, "y");
  EXPECT_OK(y);
  if (y.ok()) ExpectClose(*y, want.y, 1e-15, 1e-300, "y");
  if (out != nullptr) *out = *std::move(response);
  return ids;
}

TEST_F(ChainReplayTest, AChainSubmittedAgainUnchangedRunsAsOneOperationWithTheSameAnswers) {
  std::vector<double> x = RandomDoubles(kN, -1, 1, 21);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  for (bool separate : {false, true}) {
    SCOPED_TRACE(separate ? "separate launches" : "recorded where the backend can");
    Chain chain = HalvingChain();
    chain.SeparateLaunches(separate);
    const int steps = chain.request().steps_size();
    const uint64_t elementwise_before = CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE);
    v1::ChainResponse first;
    // The first run is planned, each step its own operation.
    EXPECT_EQ(RunAndCheck(c(), chain, x, &first).size(), static_cast<size_t>(steps));
    for (int run = 1; run < 5; ++run) {
      SCOPED_TRACE(absl::StrCat("run ", run));
      if (run == 3) {
        // The prepared chain reads what x holds now.
        ASSERT_OK(RunOp(c(), Elementwise("x * 3", {{"x", BufferOperand("x")}}, ExistingOutput("x"))));
        for (double& v : x) v *= 3;
      }
      v1::ChainResponse response;
      // From the second run on, the chain runs as one operation, which every step names.
      EXPECT_EQ(RunAndCheck(c(), chain, x, &response).size(), 1u);
      for (int k = 0; k < steps; ++k) {
        const v1::Operation& op = response.steps(k).operation();
        const v1::Operation& planned = first.steps(k).operation();
        EXPECT_EQ(op.kind(), planned.kind()) << k;
        EXPECT_EQ(op.timing().bytes_read(), planned.timing().bytes_read()) << k;
        EXPECT_EQ(op.timing().bytes_written(), planned.timing().bytes_written()) << k;
        EXPECT_EQ(op.timing().flops(), planned.timing().flops()) << k;
        EXPECT_EQ(op.timing().graph_operations(), static_cast<uint32_t>(steps)) << k;
        EXPECT_EQ(op.outputs_size(), planned.outputs_size()) << k;
        EXPECT_EQ(op.next_offset(), planned.next_offset()) << k;
        EXPECT_EQ(op.timing().stream_id(), op.stream_id()) << k;
        // Field for field the planned run's answer, but for what is each run's own: its
        // id, its times and the rates that follow from them, and the sum of x.
        v1::Operation mine = op;
        v1::Operation theirs = planned;
        for (v1::Operation* o : {&mine, &theirs}) {
          o->clear_id();
          o->clear_values();
          v1::Timing* t = o->mutable_timing();
          for (double v : {t->device_seconds(), t->gbps(), t->gflops()}) EXPECT_GE(v, 0) << k;
          t->clear_queued_seconds();
          t->clear_device_seconds();
          t->clear_gbps();
          t->clear_gflops();
          t->clear_compile_seconds();
          t->clear_graph_operations();
        }
        EXPECT_TRUE(MessageDifferencer::Equals(mine, theirs))
            << k << ": " << mine.DebugString() << " vs " << theirs.DebugString();
      }
      // The same random counters at every run, as a planned run of the request uses.
      EXPECT_GT(response.steps(steps - 1).operation().next_offset(), 0u);
    }
    // Every step counted as one operation of its kind, at every run (and x * 3 once).
    EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE),
              elementwise_before + 5 * (kIncrements + 1) + 1);
  }
}

// On the wire, a prepared run's answer names its operation and stream once, and its
// steps leave them empty; a planned run's steps each name their own. Chain::Run gives
// every step its operation either way.
TEST_F(ChainReplayTest, APreparedRunNamesItsOperationOnceAndTheClientGivesItToEveryStep) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 27);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  const Chain chain = HalvingChain();
  const int steps = chain.request().steps_size();
  std::unique_ptr<v1::SessionService::Stub> stub = v1::SessionService::NewStub(c().channel());
  auto run_raw = [&](v1::ChainResponse* response) {
    std::unique_ptr<grpc::ClientContext> context = c().NewContext(true);
    const grpc::Status status = stub->RunChain(context.get(), chain.request(), response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response->steps_size(), steps);
  };

  v1::ChainResponse planned;
  run_raw(&planned);
  EXPECT_EQ(planned.operation_id(), "");
  EXPECT_EQ(planned.stream_id(), "");
  std::set<std::string> ids;
  for (const v1::ChainStepResult& step : planned.steps()) {
    EXPECT_TRUE(std::regex_match(step.operation().id(), kOpIdPattern)) << step.tag();
    EXPECT_EQ(step.operation().stream_id(), planned.steps(0).operation().stream_id());
    EXPECT_EQ(step.operation().timing().stream_id(), step.operation().stream_id());
    ids.insert(step.operation().id());
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(steps));
  const std::string stream = planned.steps(0).operation().stream_id();
  EXPECT_FALSE(stream.empty());

  v1::ChainResponse prepared;
  run_raw(&prepared);
  EXPECT_TRUE(std::regex_match(prepared.operation_id(), kOpIdPattern)) << prepared.operation_id();
  EXPECT_EQ(prepared.stream_id(), stream);
  for (const v1::ChainStepResult& step : prepared.steps()) {
    const v1::Operation& op = step.operation();
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << step.tag();
    EXPECT_EQ(op.id(), "") << step.tag();
    EXPECT_EQ(op.stream_id(), "") << step.tag();
    EXPECT_EQ(op.timing().stream_id(), "") << step.tag();
    EXPECT_EQ(op.timing().graph_operations(), static_cast<uint32_t>(steps)) << step.tag();
  }
  // The operation it names is the run's, which the server knows.
  ASSIGN_OR_FAIL(v1::Operation run, c().GetOperation(prepared.operation_id()));
  EXPECT_EQ(run.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(run.stream_id(), stream);

  ASSIGN_OR_FAIL(v1::ChainResponse given, chain.Run(c()));
  EXPECT_TRUE(std::regex_match(given.operation_id(), kOpIdPattern)) << given.operation_id();
  EXPECT_NE(given.operation_id(), prepared.operation_id());
  for (const v1::ChainStepResult& step : given.steps()) {
    EXPECT_EQ(step.operation().id(), given.operation_id()) << step.tag();
    EXPECT_EQ(step.operation().stream_id(), stream) << step.tag();
    EXPECT_EQ(step.operation().timing().stream_id(), stream) << step.tag();
  }
}

// The client sends a chain's bytes as serialized at its first run: a change made after
// a run is sent, and a copy made before the change sends the request it was made with.
TEST_F(ChainReplayTest, AChainChangedAfterItRanSendsTheChangeAndACopyItsOwnRequest) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 26);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  Chain chain = HalvingChain();
  EXPECT_EQ(RunAndCheck(c(), chain, x).size(), static_cast<size_t>(chain.request().steps_size()));
  EXPECT_EQ(RunAndCheck(c(), chain, x).size(), 1u);  // prepared
  const Chain copy = chain;

  const std::string last = absl::StrCat("s", kIncrements - 1);
  chain.Add(Reduce(v1::REDUCE_KIND_MAX, TagRef(last)), "max");
  ASSIGN_OR_FAIL(v1::ChainResponse changed, chain.Run(c()));
  ASSERT_EQ(changed.steps_size(), copy.request().steps_size() + 1);
  const v1::ChainStepResult& max = changed.steps(changed.steps_size() - 1);
  EXPECT_EQ(max.tag(), "max");
  double want = -1e300;
  for (double v : Reference(x).y) want = std::max(want, v / 2);
  ASSERT_EQ(max.operation().values_size(), 1);
  EXPECT_NEAR(max.operation().values(0).float_value(), want, 1e-12 * std::abs(want));
  // A new request to the server: each step its own operation.
  std::set<std::string> ids;
  for (const v1::ChainStepResult& step : changed.steps()) ids.insert(step.operation().id());
  EXPECT_EQ(ids.size(), static_cast<size_t>(changed.steps_size()));

  // The copy still sends the request it was made with, which the server runs prepared.
  EXPECT_EQ(RunAndCheck(c(), copy, x).size(), 1u);
  // A change of an option after a run is sent too: each step launched alone is another
  // request, planned anew.
  Chain separate = copy;
  separate.SeparateLaunches();
  EXPECT_EQ(RunAndCheck(c(), separate, x).size(), static_cast<size_t>(copy.request().steps_size()));
}

TEST_F(ChainReplayTest, DeletingABufferAPreparedChainNamesFreesItsTemporaries) {
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  ASSIGN_OR_FAIL(v1::ServerInfo empty, c().GetServerInfo());
  std::vector<double> x = RandomDoubles(kN, -1, 1, 22);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  const Chain chain = HalvingChain();
  for (int run = 0; run < 3; ++run) RunAndCheck(c(), chain, x);
  // Prepared: its temporaries stay between runs.
  ASSIGN_OR_FAIL(v1::ServerInfo prepared, c().GetServerInfo());
  EXPECT_GT(prepared.memory_used_bytes(), empty.memory_used_bytes() + kN * sizeof(double));

  ASSERT_OK(c().DeleteBuffer("x"));
  ExpectMemoryReturnsTo(c(), empty.memory_used_bytes());
  // Without x the chain is refused, as a planned one is, and changes nothing.
  const Snapshot before = TakeSnapshot(c());
  absl::StatusOr<v1::ChainResponse> refused = chain.Run(c());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  ExpectContains(std::string(refused.status().message()), "step 0 ('s0')");
  EXPECT_EQ(TakeSnapshot(c()), before);

  // A new x of that name is the one the chain reads, at once and once prepared again.
  x = RandomDoubles(kN, 2, 3, 23);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  for (int run = 0; run < 3; ++run) RunAndCheck(c(), chain, x);
}

TEST_F(ChainReplayTest, APreparedChainWhoseStreamIsGoneIsRefusedNamingTheStep) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 24);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  ASSIGN_OR_FAIL(v1::StreamInfo stream, c().CreateStream());
  Chain chain = HalvingChain();
  chain.OnStream(stream.id());
  for (int run = 0; run < 3; ++run) {
    v1::ChainResponse response;
    RunAndCheck(c(), chain, x, &response);
    EXPECT_EQ(response.steps(0).operation().stream_id(), stream.id());
  }
  ASSERT_OK(c().DeleteStream(stream.id()));
  const Snapshot before = TakeSnapshot(c());
  const uint64_t ran = CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE);
  absl::StatusOr<v1::ChainResponse> refused = chain.Run(c());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  ExpectContains(std::string(refused.status().message()), "step 0 ('s0')");
  EXPECT_EQ(TakeSnapshot(c()), before);
  EXPECT_EQ(CompletedCount(c(), v1::OPERATION_KIND_ELEMENTWISE), ran);
}

TEST_F(ChainReplayTest, AChainThatKeepsANewBufferIsPlannedAtEveryRun) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 25);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSERT_OK(UploadArray(c(), std::vector<double>(kN, 0), {}, v1::LAYOUT_C, "y"));
  Chain chain = HalvingChain();
  chain.Keep("s3");
  std::set<std::string> kept;
  for (int run = 0; run < 3; ++run) {
    v1::ChainResponse response;
    EXPECT_EQ(RunAndCheck(c(), chain, x, &response).size(),
              static_cast<size_t>(chain.request().steps_size()));
    ASSERT_EQ(response.steps(3).operation().outputs_size(), 1);
    kept.insert(response.steps(3).operation().outputs(0).id());
  }
  // A new buffer at every run.
  EXPECT_EQ(kept.size(), 3u);
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, c().ListBuffers());
  EXPECT_EQ(list.buffers_size(), 5);  // x, y and the three kept
}

TEST_F(ChainReplayTest, AChainOfMoreBytesThanTheServerKeepsIsPlannedAtEveryRun) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 27);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  // 20 expressions of 60 KiB (spaces, mostly): over the 1 MiB of request the server keeps.
  constexpr int kSteps = 20;
  const std::string padding(60 << 10, ' ');
  Chain chain;
  std::string last =
      chain.Add(Elementwise(absl::StrCat("x +", padding, "1"), {{"x", BufferOperand("x")}}));
  for (int k = 1; k < kSteps; ++k) {
    last = chain.Add(Elementwise(absl::StrCat("s +", padding, "1"), {{"s", Tagged(last)}}));
  }
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef(last)), "sum");
  ASSERT_GT(chain.request().ByteSizeLong(), size_t{1} << 20);
  double want = 0;
  for (double v : x) want += v + kSteps;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    absl::StatusOr<v1::ChainResponse> response = chain.Run(c());
    ASSERT_OK(response);
    ASSERT_EQ(response->steps_size(), kSteps + 1);
    // Planned: each step its own operation.
    std::set<std::string> ids;
    for (const v1::ChainStepResult& step : response->steps()) ids.insert(step.operation().id());
    EXPECT_EQ(ids.size(), static_cast<size_t>(kSteps + 1));
    const v1::Operation& sum = response->steps(kSteps).operation();
    ASSERT_EQ(sum.values_size(), 1);
    EXPECT_NEAR(sum.values(0).float_value(), want, 1e-12 * std::abs(want) + 1e-9);
  }
}

// Runs where the server has two devices or more (GPUCOMPUTE_TEST_BACKEND=cuda on a
// multi-GPU machine).
TEST_F(ChainReplayTest, AChainOverTwoDevicesIsPlannedAtEveryRunAndAStepMixingThemIsRefused) {
  ASSIGN_OR_FAIL(v1::ServerInfo info, c().GetServerInfo());
  if (info.devices_size() < 2) GTEST_SKIP() << "the server has one device";
  for (int device : {0, 1}) {
    v1::CreateBufferRequest create;
    create.set_dtype(v1::DTYPE_FLOAT64);
    create.add_shape(kN);
    create.set_device(device);
    create.set_name(absl::StrCat("x", device));
    create.mutable_fill()->set_float_value(device == 0 ? 1.5 : 2.25);
    ASSERT_OK(c().CreateBuffer(create));
  }
  // Each step on one device, the chain on both: steps on several devices are not kept.
  Chain chain;
  chain.Add(Elementwise("x * 2", {{"x", BufferOperand("x0")}}), "a");
  chain.Add(Elementwise("x * 3", {{"x", BufferOperand("x1")}}), "b");
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef("a")), "sum_a");
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef("b")), "sum_b");
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    absl::StatusOr<v1::ChainResponse> response = chain.Run(c());
    ASSERT_OK(response);
    std::set<std::string> ids;
    for (const v1::ChainStepResult& step : response->steps()) ids.insert(step.operation().id());
    EXPECT_EQ(ids.size(), 4u);
    EXPECT_EQ(response->steps(0).operation().timing().device(), 0);
    EXPECT_EQ(response->steps(1).operation().timing().device(), 1);
    ASSERT_EQ(response->steps(2).operation().values_size(), 1);
    ASSERT_EQ(response->steps(3).operation().values_size(), 1);
    EXPECT_EQ(response->steps(2).operation().values(0).float_value(), kN * 3.0);
    EXPECT_EQ(response->steps(3).operation().values(0).float_value(), kN * 6.75);
  }
  // One step reading both devices: the chain is refused whole, naming it.
  Chain mixed;
  mixed.Add(Elementwise("x * 2", {{"x", BufferOperand("x0")}}), "a");
  mixed.Add(Elementwise("x + y", {{"x", Tagged("a")}, {"y", BufferOperand("x1")}}), "both");
  const Snapshot before = TakeSnapshot(c());
  for (int run = 0; run < 2; ++run) {
    absl::StatusOr<v1::ChainResponse> refused = mixed.Run(c());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    ExpectContains(std::string(refused.status().message()), "step 1 ('both')");
    EXPECT_EQ(TakeSnapshot(c()), before);
  }
}

TEST_F(ChainReplayTest, TheServerKeepsAtMost64ChainsAndTheirTemporaries) {
  const std::vector<double> x = RandomDoubles(kN, -1, 1, 26);
  ASSERT_OK(UploadArray(c(), x, {}, v1::LAYOUT_C, "x"));
  ASSIGN_OR_FAIL(v1::ServerInfo before, c().GetServerInfo());
  // Chain k: x + k into a temporary, then its sum (into another); each run twice, so
  // kept.
  const uint64_t temporaries = kN * sizeof(double) + sizeof(double);
  auto chain = [](int k) {
    Chain chain;
    chain.Add(Elementwise(absl::StrCat("x + ", k), {{"x", BufferOperand("x")}}), "t");
    chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef("t")), "sum");
    return chain;
  };
  auto run_twice = [&](int k) {
    for (int run = 0; run < 2; ++run) {
      absl::StatusOr<v1::ChainResponse> response = chain(k).Run(c());
      ASSERT_OK(response);
      double sum = 0;
      for (double v : x) sum += v + k;
      EXPECT_NEAR(response->steps(1).operation().values(0).float_value(), sum,
                  1e-12 * std::abs(sum) + 1e-9);
    }
  };
  for (int k = 0; k < 64; ++k) ASSERT_NO_FATAL_FAILURE(run_twice(k));
  // 64 kept, each holding its temporaries.
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + 64 * temporaries);
  // A 65th sends one away (the least recently run), its temporaries with it.
  ASSERT_NO_FATAL_FAILURE(run_twice(64));
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() + 64 * temporaries);
  // Deleting x forgets them all.
  ASSERT_OK(c().DeleteBuffer("x"));
  ExpectMemoryReturnsTo(c(), before.memory_used_bytes() - kN * sizeof(double));
}


// Expects each step of `response` whose tag `ttls` names to report one output, with the
// lease ListBuffers (which renews none) reports for its buffer: that ttl and the same
// expiry, read through the wall clock at two moments. The other steps report none.
void ExpectOutputLeases(Client& client, const v1::ChainResponse& response,
                        const std::map<std::string, double>& ttls) {
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, client.ListBuffers());
  for (const v1::ChainStepResult& step : response.steps()) {
    SCOPED_TRACE(step.tag());
    const v1::Operation& op = step.operation();
    auto ttl = ttls.find(step.tag());
    if (ttl == ttls.end()) {
      EXPECT_EQ(op.outputs_size(), 0);
      continue;
    }
    ASSERT_EQ(op.outputs_size(), 1);
    const v1::BufferInfo& out = op.outputs(0);
    auto listed = std::find_if(list.buffers().begin(), list.buffers().end(),
                               [&](const v1::BufferInfo& b) { return b.id() == out.id(); });
    ASSERT_NE(listed, list.buffers().end()) << out.id();
    EXPECT_DOUBLE_EQ(listed->ttl_seconds(), ttl->second);
    EXPECT_DOUBLE_EQ(out.ttl_seconds(), ttl->second);
    EXPECT_GT(listed->lease_expire_time_unix_nanos(), absl::ToUnixNanos(absl::Now()));
    EXPECT_NEAR(static_cast<double>(out.lease_expire_time_unix_nanos()),
                static_cast<double>(listed->lease_expire_time_unix_nanos()), 5e6);
  }
}

// A step's outputs report their buffers' leases as GetBuffer and ListBuffers do, as
// they are when the chain answers: the server's default result ttl or the buffer's own,
// in a planned run and in every run of a prepared chain.
TEST(ChainLeaseTest, StepOutputsReportTheLeasesOfTheirBuffers) {
  auto server = TestServer::StartWith(nullptr, 256 * kMiB, 2, [](ServerOptions& o) {
    o.default_result_ttl_seconds = 30;
  });
  ASSERT_NE(server, nullptr);
  auto client = server->Connect();
  ASSERT_OK(UploadArray(*client, std::vector<double>(kN, 1), {}, v1::LAYOUT_C, "x"));
  // New buffers: an unnamed result kept (the default ttl) and a named one with its own.
  Chain creating;
  creating.Add(Elementwise("x * 2", {{"x", BufferOperand("x")}}), "default");
  v1::Output own = NewOutput("own");
  own.set_ttl_seconds(45);
  creating.Add(Elementwise("x * 3", {{"x", BufferOperand("x")}}, own), "own");
  creating.Keep("default");
  ASSIGN_OR_FAIL(v1::ChainResponse created, creating.Run(*client));
  ASSERT_NO_FATAL_FAILURE(ExpectOutputLeases(*client, created, {{"default", 30}, {"own", 45}}));

  // Writing into them, with a temporary, which is no output: planned at the first run,
  // then prepared (the run that prepares it, then runs of the kept chain).
  ASSERT_EQ(created.steps(0).operation().outputs_size(), 1);
  const std::string unnamed = created.steps(0).operation().outputs(0).id();
  Chain writing;
  writing.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), "temporary");
  writing.Add(Elementwise("t * 2", {{"t", Tagged("temporary")}}, ExistingOutput(unnamed)),
              "default");
  writing.Add(Elementwise("t * 3", {{"t", Tagged("temporary")}}, ExistingOutput("own")), "own");
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    // Each run renews the leases: a lease kept from an earlier run would be this late.
    absl::SleepFor(absl::Milliseconds(50));
    ASSIGN_OR_FAIL(v1::ChainResponse response, writing.Run(*client));
    std::set<std::string> ids;
    for (const v1::ChainStepResult& step : response.steps()) ids.insert(step.operation().id());
    EXPECT_EQ(ids.size(), run == 0 ? 3u : 1u);
    ASSERT_NO_FATAL_FAILURE(
        ExpectOutputLeases(*client, response, {{"default", 30}, {"own", 45}}));
  }
}

}  // namespace
}  // namespace gpucompute::testing

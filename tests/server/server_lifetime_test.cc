// Leases (expiry, renewal by use and by RenewLease, validation) and persistence across
// restarts (--persist-dir): in-process servers over a real socket, and the real
// gpucompute-server program restarted under load.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "gpucompute/v1/limits.h"
#include "server/cpu/cpu_backend.h"
#include "server/persistence/persist_format.h"
#include "server/tenancy/auth.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/spawn_server.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kSweep = absl::Milliseconds(20);

std::unique_ptr<TestServer> StartLeased(double default_result_ttl = 0) {
  return TestServer::StartWith(nullptr, 256 * kMiB, 2, [&](ServerOptions& o) {
    o.lease_sweep_interval = kSweep;
    o.default_result_ttl_seconds = default_result_ttl;
  });
}

std::unique_ptr<TestServer> StartPersisting(const fs::path& dir, uint64_t limit = 256 * kMiB) {
  return TestServer::StartWith(nullptr, limit, 2,
                               [&](ServerOptions& o) { o.persist_dir = dir.string(); });
}

absl::StatusOr<v1::BufferInfo> CreateLeased(Client& client, double ttl,
                                            const std::string& name = "",
                                            uint64_t elements = 1024) {
  v1::CreateBufferRequest request;
  request.set_dtype(v1::DTYPE_FLOAT64);
  request.add_shape(elements);
  request.set_name(name);
  request.set_ttl_seconds(ttl);
  return client.CreateBuffer(request);
}

// A waiting Submit of 2*x; the caller sets its output.
v1::SubmitRequest Double(const std::string& x) {
  v1::SubmitRequest submit;
  submit.set_wait(true);
  v1::ElementwiseOp* op = submit.mutable_elementwise();
  op->set_expression("x * 2");
  (*op->mutable_inputs())["x"].set_buffer(x);
  return submit;
}

TEST(LeaseTest, ExpiredBufferIsReclaimedAndAnswersLikeAnUnknownId) {
  auto server = StartLeased();
  auto client = server->Connect("lessee");
  const uint64_t before = MemoryUsed(*client);
  absl::StatusOr<v1::BufferInfo> b = CreateLeased(*client, 0.3, "short", 1 << 17);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->ttl_seconds(), 0.3);
  const int64_t now = absl::ToUnixNanos(absl::Now());
  EXPECT_GT(b->lease_expire_time_unix_nanos(), now);
  EXPECT_LE(b->lease_expire_time_unix_nanos(), now + int64_t{300'000'000});
  EXPECT_EQ(MemoryUsed(*client), before + (uint64_t{1} << 20));

  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<v1::BufferInfo> gone = client->GetBuffer(b->id());
  ASSERT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  // Exactly what an id that never existed gets, but for the id itself.
  const std::string unknown = "buf-00000000000000000000000000000000";
  absl::StatusOr<v1::BufferInfo> never = client->GetBuffer(unknown);
  EXPECT_EQ(never.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(gone.status().message()),
            absl::StrReplaceAll(never.status().message(), {{unknown, b->id()}}));
  EXPECT_EQ(client->GetBuffer("short").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->DeleteBuffer(b->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->RenewLease(b->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DownloadBytes(*client, b->id()).status().code(), absl::StatusCode::kNotFound);
  // The memory comes back and the name is free again.
  EXPECT_TRUE(Eventually([&] { return MemoryUsed(*client) == before; }, absl::Seconds(5)));
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->leases_expired(), 1u);
  EXPECT_EQ(info->buffer_count(), 0u);
  EXPECT_DOUBLE_EQ(info->limits().max_ttl_seconds(), kMaxTtlSeconds);
  EXPECT_TRUE(CreateLeased(*client, 0, "short").ok());
}

TEST(LeaseTest, UseAndRenewLeaseKeepABufferAlive) {
  auto server = StartLeased();
  auto client = server->Connect();
  absl::StatusOr<v1::BufferInfo> b = CreateLeased(*client, 0.8, "kept", 8);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<v1::BufferInfo> other = CreateLeased(*client, 0, "plain", 8);
  ASSERT_TRUE(other.ok());
  // 2.4 s in all, three times the lease, renewed by every kind of use.
  for (int i = 0; i < 16; ++i) {
    absl::SleepFor(absl::Milliseconds(150));
    switch (i % 4) {
      case 0:
        ASSERT_TRUE(client->GetBuffer("kept").ok()) << "round " << i;
        break;
      case 1:
        ASSERT_TRUE(DownloadBytes(*client, b->id()).ok()) << "round " << i;
        break;
      case 2: {
        v1::SubmitRequest submit = Double(b->id());
        submit.mutable_elementwise()->mutable_output()->set_buffer(other->id());
        absl::StatusOr<v1::Operation> done = client->Submit(submit);
        ASSERT_TRUE(done.ok()) << "round " << i << ": " << done.status();
        break;
      }
      default: {
        absl::StatusOr<v1::BufferInfo> renewed = client->RenewLease("kept");
        ASSERT_TRUE(renewed.ok()) << "round " << i << ": " << renewed.status();
        EXPECT_DOUBLE_EQ(renewed->ttl_seconds(), 0.8);
      }
    }
  }
  // A new ttl, then none: the buffer stays.
  absl::StatusOr<v1::BufferInfo> longer = client->RenewLease(b->id(), 60);
  ASSERT_TRUE(longer.ok());
  EXPECT_DOUBLE_EQ(longer->ttl_seconds(), 60);
  absl::StatusOr<v1::BufferInfo> ended = client->RenewLease(b->id(), 0);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->ttl_seconds(), 0);
  EXPECT_EQ(ended->lease_expire_time_unix_nanos(), 0);
  absl::SleepFor(absl::Milliseconds(1000));
  EXPECT_TRUE(client->GetBuffer(b->id()).ok());
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->leases_expired(), 0u);
}

TEST(LeaseTest, InvalidTtlIsRejectedAndChangesNothing) {
  auto server = StartLeased();
  auto client = server->Connect();
  absl::StatusOr<v1::BufferInfo> kept = CreateLeased(*client, 30, "kept", 8);
  ASSERT_TRUE(kept.ok());
  const uint64_t used = MemoryUsed(*client);
  const double bad[] = {-1, -1e-9, std::nan(""), std::numeric_limits<double>::infinity(),
                        kMaxTtlSeconds * 1.0001};
  for (double ttl : bad) {
    SCOPED_TRACE(ttl);
    EXPECT_EQ(CreateLeased(*client, ttl, "new").status().code(),
              absl::StatusCode::kInvalidArgument);
    v1::UploadHeader header;
    header.mutable_create()->set_dtype(v1::DTYPE_INT32);
    header.mutable_create()->add_shape(1);
    header.mutable_create()->set_name("new");
    header.mutable_create()->set_ttl_seconds(ttl);
    const int32_t one = 1;
    EXPECT_EQ(client->Upload(header, std::as_bytes(std::span(&one, 1))).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client->RenewLease("kept", ttl).status().code(), absl::StatusCode::kInvalidArgument);
    v1::SubmitRequest submit = Double("kept");
    submit.mutable_elementwise()->mutable_output()->set_name("new");
    submit.mutable_elementwise()->mutable_output()->set_ttl_seconds(ttl);
    EXPECT_EQ(client->Submit(submit).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A ttl for an existing output is refused: RenewLease renews it.
  v1::SubmitRequest submit = Double("kept");
  submit.mutable_elementwise()->mutable_output()->set_buffer("kept");
  submit.mutable_elementwise()->mutable_output()->set_ttl_seconds(5);
  EXPECT_EQ(client->Submit(submit).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(MemoryUsed(*client), used);
  absl::StatusOr<v1::ListBuffersResponse> list = client->ListBuffers();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->buffers_size(), 1);
  EXPECT_DOUBLE_EQ(list->buffers(0).ttl_seconds(), 30);
  EXPECT_TRUE(CreateLeased(*client, kMaxTtlSeconds, "new").ok());  // the name is still free
}

TEST(LeaseTest, DefaultResultTtlAppliesToUnnamedResultsOnly) {
  auto server = StartLeased(1);
  auto client = server->Connect();
  absl::StatusOr<v1::BufferInfo> x = CreateLeased(*client, 0, "x", 8);
  ASSERT_TRUE(x.ok());
  auto eval = [&](const std::string& name) {
    v1::SubmitRequest submit = Double("x");
    submit.mutable_elementwise()->mutable_output()->set_name(name);
    absl::StatusOr<v1::Operation> done = client->Submit(submit);
    EXPECT_TRUE(done.ok()) << done.status();
    return done.ok() && done->outputs_size() == 1 ? done->outputs(0).id() : std::string();
  };
  const std::string unnamed = eval("");
  const std::string named = eval("y");
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_DOUBLE_EQ(info->default_result_ttl_seconds(), 1);
  absl::StatusOr<v1::BufferInfo> u = client->GetBuffer(unnamed);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_DOUBLE_EQ(u->ttl_seconds(), 1);
  absl::SleepFor(absl::Milliseconds(1300));
  EXPECT_EQ(client->GetBuffer(unnamed).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::BufferInfo> n = client->GetBuffer(named);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->ttl_seconds(), 0);
  EXPECT_TRUE(client->GetBuffer("x").ok());
}

// The CPU backend, whose elementwise operations start and then hold their stream until
// the test opens the gate: an operation that runs as long as the test wants.
class GatedBackend final : public ForwardingBackend {
 public:
  GatedBackend() : ForwardingBackend(std::make_unique<cpu::CpuBackend>(2)) {}

  // Lets every elementwise operation, held or to come, run.
  void Open() {
    if (!gate_.HasBeenNotified()) gate_.Notify();
  }
  // Waits until an elementwise operation has started (and is held); false after 30 s.
  bool WaitStarted() { return started_.WaitForNotificationWithTimeout(absl::Seconds(30)); }

  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs,
                                         DeviceMemory& out, DType out_dtype, int64_t n) override {
    absl::Status held = stream.OnComplete([this](absl::Status) {
      if (!started_.HasBeenNotified()) started_.Notify();
      gate_.WaitForNotification();
    });
    if (!held.ok()) return held;
    return ForwardingBackend::Elementwise(stream, program, inputs, out, out_dtype, n);
  }

 private:
  absl::Notification started_;
  absl::Notification gate_;
};

// The buffer `id` as ListBuffers, which renews no lease, lists it.
std::optional<v1::BufferInfo> ListedInfo(Client& client, const std::string& id) {
  absl::StatusOr<v1::ListBuffersResponse> list = client.ListBuffers();
  EXPECT_TRUE(list.ok()) << list.status();
  if (!list.ok()) return std::nullopt;
  for (const v1::BufferInfo& b : list->buffers()) {
    if (b.id() == id) return b;
  }
  return std::nullopt;
}

bool Listed(Client& client, const std::string& id) { return ListedInfo(client, id).has_value(); }

// A lease counts from the completion of the operation that writes the buffer: an
// operation held running for longer than the default ttl still leaves its result, which
// then expires a ttl after the last use.
TEST(LeaseTest, AResultsLeaseStartsWhenItsOperationCompletes) {
  auto backend = std::make_unique<GatedBackend>();
  GatedBackend* gate = backend.get();
  auto server = TestServer::StartWith(std::move(backend), 64 * kMiB, 2, [](ServerOptions& o) {
    o.lease_sweep_interval = kSweep;
    o.default_result_ttl_seconds = 1;
  });
  ASSERT_NE(server, nullptr);
  absl::Cleanup open = [gate] { gate->Open(); };  // the server waits for held work
  auto client = server->Connect();
  ASSERT_TRUE(UploadArray<double>(*client, {1, 2, 3}, {}, v1::LAYOUT_C, "x").ok());
  v1::SubmitRequest submit = Double("x");
  submit.set_wait(false);
  absl::StatusOr<v1::Operation> op = client->Submit(submit);
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_EQ(op->outputs_size(), 1);
  const std::string result = op->outputs(0).id();
  ASSERT_TRUE(gate->WaitStarted());
  // Longer than the ttl, with the sweep running every 20 ms.
  absl::SleepFor(absl::Milliseconds(1600));
  EXPECT_TRUE(Listed(*client, result));
  const absl::Time opened = absl::Now();
  gate->Open();
  absl::StatusOr<v1::Operation> done = client->WaitOperation(op->id(), 30);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::Operation::STATE_SUCCEEDED);
  absl::StatusOr<std::vector<double>> y = DownloadArray<double>(*client, result);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(*y, (std::vector<double>{2, 4, 6}));
  const absl::Time used = absl::Now();
  // Then the lease runs: the result goes a ttl after its last use (the download), and
  // not before a ttl after the operation could complete.
  absl::Time gone = absl::InfiniteFuture();
  while (absl::Now() < used + absl::Seconds(10)) {
    if (!Listed(*client, result)) {
      gone = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(gone - opened, absl::Seconds(1));
  EXPECT_LE(gone - used, absl::Seconds(4));
  EXPECT_EQ(client->GetBuffer(result).status().code(), absl::StatusCode::kNotFound);
}

// An operation's outputs report the lease the buffer has, as the buffer service does:
// the default result ttl, or the output's own.
TEST(LeaseTest, OperationOutputsReportTheLeaseOfTheirBuffer) {
  auto server = StartLeased(30);
  auto client = server->Connect();
  ASSERT_TRUE(CreateLeased(*client, 0, "x", 8).ok());
  for (const auto& [name, ttl, expected] :
       {std::tuple<std::string, double, double>{"", 0, 30}, {"own", 45, 45}}) {
    SCOPED_TRACE(name);
    v1::SubmitRequest submit = Double("x");
    submit.mutable_elementwise()->mutable_output()->set_name(name);
    submit.mutable_elementwise()->mutable_output()->set_ttl_seconds(ttl);
    absl::StatusOr<v1::Operation> submitted = client->Submit(submit);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    ASSERT_EQ(submitted->outputs_size(), 1);
    absl::StatusOr<v1::Operation> got = client->GetOperation(submitted->id());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->outputs_size(), 1);
    std::optional<v1::BufferInfo> listed = ListedInfo(*client, submitted->outputs(0).id());
    ASSERT_TRUE(listed.has_value());
    EXPECT_DOUBLE_EQ(listed->ttl_seconds(), expected);
    EXPECT_GT(listed->lease_expire_time_unix_nanos(), absl::ToUnixNanos(absl::Now()));
    for (const v1::Operation* op : {&*submitted, &*got}) {
      const v1::BufferInfo& out = op->outputs(0);
      EXPECT_DOUBLE_EQ(out.ttl_seconds(), expected);
      // The same deadline, read through the wall clock at two moments.
      EXPECT_NEAR(static_cast<double>(out.lease_expire_time_unix_nanos()),
                  static_cast<double>(listed->lease_expire_time_unix_nanos()), 5e6);
    }
  }
}

// A server goes away while its timer thread is inside a lease sweep: with sweeps back to
// back, it nearly always is. ~Server once cleared the timer's pointer while the sweep read
// it to schedule the next one; ThreadSanitizer reports such a race, and a sweep that read
// the cleared pointer crashed.
TEST(LeaseTest, ServerStopsWhileASweepRuns) {
  for (int i = 0; i < 20; ++i) {
    std::unique_ptr<TestServer> server =
        TestServer::StartWith(nullptr, 64 * kMiB, 1, [](ServerOptions& o) {
          o.lease_sweep_interval = absl::Nanoseconds(1);
          o.measure_copy_ceiling = false;
        });
    ASSERT_NE(server, nullptr);
    auto client = server->Connect();
    ASSERT_TRUE(CreateLeased(*client, 1, "x", 8).ok());
    server.reset();
  }
}

// A fresh directory under the test's temporary directory, removed afterwards.
class PersistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("gpucompute_persist_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
};

// Deterministic bytes for buffer `seed` of `size` bytes.
std::string Pattern(uint64_t seed, size_t size) {
  std::string out(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (char& c : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return out;
}

struct Expected {
  v1::BufferInfo info;
  std::string client;
  std::string bytes;
};

absl::StatusOr<v1::BufferInfo> UploadRaw(Client& client, v1::DType dtype,
                                         std::vector<uint64_t> shape, v1::Layout layout,
                                         const std::string& name, const std::string& bytes) {
  v1::UploadHeader header;
  v1::CreateBufferRequest* create = header.mutable_create();
  create->set_dtype(dtype);
  for (uint64_t d : shape) create->add_shape(d);
  create->set_layout(layout);
  create->set_name(name);
  absl::StatusOr<v1::UploadResponse> r = client.Upload(header, std::as_bytes(std::span(bytes)));
  if (!r.ok()) return r.status();
  return r->buffer();
}

void ExpectRestored(TestServer& server, const std::vector<Expected>& expected) {
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.info.name());
    auto client = server.Connect(e.client);
    absl::StatusOr<v1::BufferInfo> got = client->GetBuffer(e.info.name());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->id(), e.info.id());
    EXPECT_EQ(got->dtype(), e.info.dtype());
    EXPECT_EQ(got->layout(), e.info.layout());
    EXPECT_EQ(std::vector<uint64_t>(got->shape().begin(), got->shape().end()),
              std::vector<uint64_t>(e.info.shape().begin(), e.info.shape().end()));
    absl::StatusOr<std::string> bytes = DownloadBytes(*client, e.info.id());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_TRUE(*bytes == e.bytes) << "the bytes differ";
  }
}

TEST_F(PersistTest, EveryDtypeAndLayoutSurvivesARestartByteForByte) {
  std::vector<Expected> expected;
  std::string deleted_id, unnamed_id;
  {
    auto server = StartPersisting(dir_);
    ASSERT_NE(server, nullptr);
    int seed = 0;
    const std::pair<v1::DType, size_t> dtypes[] = {{v1::DTYPE_FLOAT32, 4},
                                                   {v1::DTYPE_FLOAT64, 8},
                                                   {v1::DTYPE_INT32, 4},
                                                   {v1::DTYPE_INT64, 8},
                                                   {v1::DTYPE_BOOL, 1}};
    for (const char* owner : {"alice", "bob"}) {
      auto client = server->Connect(owner);
      for (const auto& [dtype, size] : dtypes) {
        for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
          const std::vector<uint64_t> shape = {3, 5};
          std::string bytes = Pattern(++seed, 15 * size);
          if (dtype == v1::DTYPE_BOOL) {
            for (char& c : bytes) c &= 1;
          }
          const std::string name = absl::StrCat("d", dtype, "_l", layout);
          absl::StatusOr<v1::BufferInfo> b = UploadRaw(*client, dtype, shape, layout, name, bytes);
          ASSERT_TRUE(b.ok()) << b.status();
          expected.push_back({*b, owner, bytes});
        }
      }
      // A 0-d array, an empty one, and one larger than the persister's 16 MiB chunk.
      for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<uint64_t>>>{
               {"scalar", {}}, {"empty", {0, 4}}, {"large", {(uint64_t{20} << 20) / 8 + 3}}}) {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        const std::string bytes = Pattern(++seed, n * 8);
        absl::StatusOr<v1::BufferInfo> b =
            UploadRaw(*client, v1::DTYPE_FLOAT64, shape, v1::LAYOUT_C, name, bytes);
        ASSERT_TRUE(b.ok()) << b.status();
        expected.push_back({*b, owner, bytes});
      }
    }
    auto client = server->Connect("alice");
    absl::StatusOr<v1::BufferInfo> doomed =
        UploadRaw(*client, v1::DTYPE_INT32, {2}, v1::LAYOUT_C, "doomed", Pattern(99, 8));
    ASSERT_TRUE(doomed.ok());
    deleted_id = doomed->id();
    absl::StatusOr<v1::BufferInfo> unnamed =
        UploadRaw(*client, v1::DTYPE_INT32, {2}, v1::LAYOUT_C, "", Pattern(98, 8));
    ASSERT_TRUE(unnamed.ok());
    unnamed_id = unnamed->id();
    ASSERT_TRUE(CreateLeased(*client, 3600, "leased", 4).ok());
    // Written once, then deleted: its file must go with the next write.
    absl::StatusOr<size_t> written = server->server().Snapshot();
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(*written, expected.size() + 2);
    ASSERT_TRUE(client->DeleteBuffer("doomed").ok());
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->persistence_enabled());
  }  // destroyed: shuts down, writing the named buffers
  const std::vector<std::string> files = Files();
  EXPECT_EQ(files.size(), expected.size() + 1);
  for (const std::string& f : files) {
    EXPECT_TRUE(absl::EndsWith(f, kPersistSuffix)) << f << ": a temporary file was left";
  }
  auto server = StartPersisting(dir_);
  ASSERT_NE(server, nullptr);
  ExpectRestored(*server, expected);
  auto client = server->Connect("alice");
  EXPECT_EQ(client->GetBuffer(deleted_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->GetBuffer(unnamed_id).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffer_count(), expected.size() + 1);
  // The lease comes back too, starting afresh.
  absl::StatusOr<v1::BufferInfo> leased = client->GetBuffer("leased");
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_EQ(leased->ttl_seconds(), 3600);
  EXPECT_GT(leased->lease_expire_time_unix_nanos(),
            absl::ToUnixNanos(absl::Now() + absl::Seconds(3590)));
  // Another client's name does not resolve for this one.
  EXPECT_EQ(server->Connect("carol")->GetBuffer("scalar").status().code(),
            absl::StatusCode::kNotFound);
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteAll(const fs::path& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// Starts a server on `dir`, uploads `count` float32 buffers of shape [8, columns]
// named prefix0, prefix1, ... for the client "default", and stops it, writing them.
std::vector<Expected> PersistNamed(const fs::path& dir, int count, const std::string& prefix,
                                   uint64_t columns) {
  std::vector<Expected> buffers;
  auto server = StartPersisting(dir);
  EXPECT_NE(server, nullptr);
  if (server == nullptr) return buffers;
  auto client = server->Connect();
  for (int i = 0; i < count; ++i) {
    const std::string bytes = Pattern(i + 1, 8 * columns * 4);
    absl::StatusOr<v1::BufferInfo> b = UploadRaw(*client, v1::DTYPE_FLOAT32, {8, columns},
                                                 v1::LAYOUT_C, absl::StrCat(prefix, i), bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) buffers.push_back({*b, "default", bytes});
  }
  return buffers;
}

TEST_F(PersistTest, BadFilesAreReportedAndSkippedAndTheOthersRestored) {
  const std::vector<Expected> buffers = PersistNamed(dir_, 5, "b", 8);
  ASSERT_EQ(buffers.size(), 5u);
  auto file = [&](int i) { return dir_ / (buffers[i].info.id() + kPersistSuffix); };
  // 0: a payload byte flipped; 1: truncated; 2: a header byte flipped;
  // 3: another format version. 4 stays good.
  std::string data = ReadAll(file(0));
  data[data.size() - 10] ^= 0x01;
  WriteAll(file(0), data);
  data = ReadAll(file(1));
  WriteAll(file(1), data.substr(0, data.size() - 100));
  data = ReadAll(file(2));
  data[30] ^= 0x01;  // the payload length, covered by the header's CRC
  WriteAll(file(2), data);
  data = ReadAll(file(3));
  data[8] = 2;
  WriteAll(file(3), data);
  WriteAll(dir_ / "foreign.gpcbuf", "\x93NUMPY\x01\x00 not ours at all");
  WriteAll(dir_ / (buffers[4].info.id() + kPersistTempSuffix), "half a write");

  ::testing::internal::CaptureStderr();
  auto server = StartPersisting(dir_);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(server, nullptr);
  auto expect_reported = [&](const fs::path& path, const std::string& why) {
    const size_t at = log.find(path.string() + ": not restored: ");
    ASSERT_NE(at, std::string::npos) << path << " not reported in:\n" << log;
    EXPECT_NE(log.substr(at, log.find('\n', at) - at).find(why), std::string::npos)
        << "expected '" << why << "' in:\n"
        << log;
  };
  expect_reported(file(0), "payload's CRC32C does not match");
  expect_reported(file(1), "truncated");
  expect_reported(file(2), "header's CRC32C does not match");
  expect_reported(file(3), "format version 2; this server reads version 1 only");
  expect_reported(dir_ / "foreign.gpcbuf", "not a gpucompute buffer file");
  EXPECT_NE(log.find("removing an unfinished write"), std::string::npos) << log;

  auto client = server->Connect();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(client->GetBuffer(buffers[i].info.id()).status().code(), absl::StatusCode::kNotFound)
        << i;
  }
  ExpectRestored(*server, {buffers[4]});
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffer_count(), 1u);
  EXPECT_EQ(info->memory_used_bytes(), 256u);
  // Skipped files stay for an operator; the temporary file is gone.
  EXPECT_TRUE(fs::exists(file(0)));
  EXPECT_TRUE(fs::exists(file(3)));
  EXPECT_FALSE(fs::exists(dir_ / (buffers[4].info.id() + kPersistTempSuffix)));
}

TEST_F(PersistTest, TakenNamesAndTheMemoryLimitSkipFiles) {
  const std::vector<Expected> buffers = PersistNamed(dir_, 2, "m", kMiB / 32);  // 1 MiB each
  ASSERT_EQ(buffers.size(), 2u);
  // A copy of buffer 0's file under another name: same id and name, so it is skipped.
  fs::copy_file(dir_ / (buffers[0].info.id() + kPersistSuffix), dir_ / "zz-copy.gpcbuf");
  {
    ::testing::internal::CaptureStderr();
    auto server = StartPersisting(dir_);
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_NE(server, nullptr);
    EXPECT_NE(log.find("zz-copy.gpcbuf: not restored: a buffer named 'm0' already exists"),
              std::string::npos)
        << log;
    ExpectRestored(*server, buffers);
  }
  // Room for one of the two: the other is reported and skipped.
  fs::remove(dir_ / "zz-copy.gpcbuf");
  ::testing::internal::CaptureStderr();
  auto server = StartPersisting(dir_, kMiB + kMiB / 2);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(server, nullptr);
  EXPECT_NE(log.find("would exceed the server's memory limit"), std::string::npos) << log;
  auto client = server->Connect();
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffer_count(), 1u);
  EXPECT_EQ(info->memory_used_bytes(), kMiB);
}

// The real program, restarted under load with SIGTERM: every named buffer a client saw
// created comes back byte for byte, with its id.
#ifdef GPUCOMPUTE_SERVER_BIN
struct Program {
  pid_t pid = -1;
  fs::path log;
};

Program Spawn(const std::vector<std::string>& flags, const fs::path& log) {
  // $GPUCOMPUTE_SERVER_BIN runs another build of the program (e.g. on a GPU host).
  const char* bin = std::getenv("GPUCOMPUTE_SERVER_BIN");
  Program p{SpawnProgram(bin != nullptr && *bin != '\0' ? bin : GPUCOMPUTE_SERVER_BIN, flags,
                         log.string()),
            log};
  EXPECT_GT(p.pid, 0);
  return p;
}

int PortOf(const Program& p) {
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    const std::string log = ReadAll(p.log);
    if (size_t at = log.find("listening on port "); at != std::string::npos) {
      return std::atoi(log.c_str() + at + 18);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return 0;
}

// SIGTERM, then the exit status (-1 if it had to be killed after 30 s).
int Terminate(Program& p) {
  kill(p.pid, SIGTERM);
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) == p.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
  return -1;
}

std::unique_ptr<Client> ConnectTo(int port, const std::string& name) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", port);
  options.client_name = name;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST_F(PersistTest, RestartUnderLoadLosesNoNamedBuffer) {
  fs::create_directories(dir_);
  const std::vector<std::string> flags = {
      "--listen=127.0.0.1:0", "--backend=cpu",        "--memory-limit=512MiB",
      "--cpu-threads=2",      "--shutdown-grace=20s", "--persist-dir=" + dir_.string()};
  Program first = Spawn(flags, dir_.parent_path() / (dir_.filename().string() + "_1.log"));
  const int port = PortOf(first);
  ASSERT_NE(port, 0) << ReadAll(first.log);

  // Four clients upload named buffers and compute on them until the server goes away.
  std::mutex mu;
  std::vector<Expected> created;
  std::atomic<bool> stop{false};
  std::atomic<int> uploads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto client = ConnectTo(port, absl::StrCat("client", t));
      if (client == nullptr) return;
      for (int i = 0; !stop.load(); ++i) {
        const std::string name = absl::StrCat("t", t, "_", i);
        const std::string bytes = Pattern(t * 100000 + i, (1 + i % 7) * 4096);
        absl::StatusOr<v1::BufferInfo> b =
            UploadRaw(*client, v1::DTYPE_FLOAT32, {bytes.size() / 4}, v1::LAYOUT_C, name, bytes);
        if (!b.ok()) return;  // the server is stopping
        {
          std::lock_guard lock(mu);
          created.push_back({*b, absl::StrCat("client", t), bytes});
        }
        ++uploads;
        // Unnamed work alongside: it must not disturb the named buffers.
        v1::SubmitRequest submit = Double(b->id());
        submit.set_wait(false);
        (void)client->Submit(submit);
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return uploads.load() >= 40; }, absl::Seconds(5)))
      << ReadAll(first.log);
  EXPECT_EQ(Terminate(first), 0) << ReadAll(first.log);
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_NE(ReadAll(first.log).find("named buffers to"), std::string::npos) << ReadAll(first.log);

  Program second = Spawn(flags, dir_.parent_path() / (dir_.filename().string() + "_2.log"));
  const int port2 = PortOf(second);
  ASSERT_NE(port2, 0) << ReadAll(second.log);
  // Every named buffer the server has is one a client created, with the bytes it sent.
  size_t checked = 0;
  for (int t = 0; t < 4; ++t) {
    auto client = ConnectTo(port2, absl::StrCat("client", t));
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::ListBuffersResponse> list = client->ListBuffers();
    ASSERT_TRUE(list.ok()) << list.status();
    for (const v1::BufferInfo& b : list->buffers()) {
      if (b.name().empty()) continue;
      const int i = std::atoi(b.name().c_str() + b.name().find('_') + 1);
      absl::StatusOr<std::string> bytes = DownloadBytes(*client, b.id());
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_TRUE(*bytes == Pattern(t * 100000 + i, (1 + i % 7) * 4096))
          << b.name() << ": the bytes differ";
      ++checked;
    }
  }
  // And every one a client saw created is there, with its id.
  for (const Expected& e : created) {
    auto client = ConnectTo(port2, e.client);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::BufferInfo> got = client->GetBuffer(e.info.name());
    ASSERT_TRUE(got.ok()) << e.info.name() << ": " << got.status();
    EXPECT_EQ(got->id(), e.info.id());
  }
  EXPECT_GE(checked, created.size());
  EXPECT_GE(created.size(), 40u);
  std::printf("restart: %zu named buffers checked byte for byte\n", checked);
  EXPECT_EQ(Terminate(second), 0) << ReadAll(second.log);
  fs::remove(first.log);
  fs::remove(second.log);
}

// A TCP connection to `port` on 127.0.0.1 that never says a word (never sends the HTTP/2
// preface); its descriptor, or -1.
int ConnectSilently(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// SIGTERM to `server`, which exits 0; then closes `raw`. Returns (and prints) how long
// the program took to exit under `grace`.
absl::Duration TimeShutdown(Program& server, int raw, absl::Duration grace) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(Terminate(server), 0) << ReadAll(server.log);
  const absl::Duration took = absl::Now() - start;
  close(raw);
  std::printf("shutdown: SIGTERM to exit took %s with a grace of %s\n",
              absl::FormatDuration(took).c_str(), absl::FormatDuration(grace).c_str());
  return took;
}

// An expression of `terms` transcendental terms in x: long enough work on a large buffer.
v1::SubmitRequest LongExpression(const std::string& x, const std::string& stream, int terms) {
  std::string expression = "x";
  for (int i = 0; i < terms; ++i) absl::StrAppend(&expression, " + sin(x * ", i, ") * exp(x)");
  v1::SubmitRequest submit;
  submit.set_stream_id(stream);
  v1::ElementwiseOp* op = submit.mutable_elementwise();
  op->set_expression(expression);
  (*op->mutable_inputs())["x"].set_buffer(x);
  return submit;
}

// How many terms LongExpression needs for about a second of work on `x` (2^20 elements)
// on this machine, found by running it; 0 if an operation failed.
int TermsForASecond(Client& client, const std::string& x) {
  int terms = 4;
  for (;;) {
    v1::SubmitRequest probe = LongExpression(x, "", terms);
    probe.set_wait(true);
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::Operation> done = client.Submit(probe);
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) return 0;
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (ms >= 800 || terms >= 512) {
      std::printf("shutdown: %d terms take %.0f ms an operation\n", terms, ms);
      return terms;
    }
    terms = std::min(512, static_cast<int>(terms * std::max(1.5, 1000 / (ms + 1))));
  }
}

// A buffer of 2^20 float64 zeros named `name` (empty: unnamed), for LongExpression.
absl::StatusOr<v1::BufferInfo> CreateLarge(Client& client, const std::string& name) {
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_FLOAT64);
  create.add_shape(uint64_t{1} << 20);
  create.set_name(name);
  return client.CreateBuffer(create);
}

// A call in flight when SIGTERM comes finishes, and idle connections, a client channel
// with no call in flight and a TCP connection that never sends the preface, do not hold
// the shutdown: it ends with the call, not at the end of the grace.
TEST_F(PersistTest, ACallInFlightFinishesAndIdleConnectionsDoNotHoldTheShutdown) {
  fs::create_directories(dir_);
  constexpr absl::Duration kGrace = absl::Seconds(8);
  const fs::path log = dir_.parent_path() / (dir_.filename().string() + ".log");
  Program server = Spawn({"--listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=2",
                          "--shutdown-grace=8s", "--persist-dir=" + dir_.string()},
                         log);
  const int port = PortOf(server);
  ASSERT_NE(port, 0) << ReadAll(log);
  auto idle = ConnectTo(port, "idle");
  ASSERT_NE(idle, nullptr);
  absl::StatusOr<v1::BufferInfo> kept =
      UploadRaw(*idle, v1::DTYPE_INT32, {2}, v1::LAYOUT_C, "kept", Pattern(3, 8));
  ASSERT_TRUE(kept.ok()) << kept.status();
  absl::StatusOr<v1::BufferInfo> x = CreateLarge(*idle, "");
  ASSERT_TRUE(x.ok()) << x.status();
  const int terms = TermsForASecond(*idle, x->id());
  ASSERT_GT(terms, 0);
  // A waiting Submit of about a second, on a channel of its own.
  auto busy = ConnectTo(port, "busy");
  ASSERT_NE(busy, nullptr);
  v1::SubmitRequest submit = LongExpression(x->id(), "", terms);
  submit.set_wait(true);
  const int raw = ConnectSilently(port);
  ASSERT_GE(raw, 0);
  absl::StatusOr<v1::Operation> waited;
  std::thread call([&] { waited = busy->Submit(submit); });
  absl::SleepFor(absl::Milliseconds(200));  // the call is in flight

  const absl::Duration took = TimeShutdown(server, raw, kGrace);
  call.join();
  const std::string text = ReadAll(log);
  ASSERT_TRUE(waited.ok()) << waited.status() << "\n" << text;
  EXPECT_EQ(waited->state(), v1::Operation::STATE_SUCCEEDED) << text;
  // The rest of the call's second, and room for a loaded machine; far from the grace.
  EXPECT_LT(took, absl::Seconds(5)) << text;
  EXPECT_EQ(text.find("did not start within the shutdown grace"), std::string::npos) << text;
  EXPECT_NE(text.find("wrote 1 named buffers to " + dir_.string() + " in "), std::string::npos)
      << text;
  EXPECT_TRUE(fs::exists(dir_ / (kept->id() + kPersistSuffix)));
  fs::remove(log);
}

// SIGTERM with long operations queued on four streams, an idle client channel and a raw
// TCP connection that never sends the HTTP/2 preface: the program exits within its
// stated bound (the grace, then the cancelled work's current chunk, then the snapshot),
// not when the work would have ended, and the named buffers are written.
TEST_F(PersistTest, ShutdownKeepsItsGraceWithLongWorkAndIdleConnections) {
  fs::create_directories(dir_);
  constexpr absl::Duration kGrace = absl::Seconds(2);
  const fs::path log = dir_.parent_path() / (dir_.filename().string() + ".log");
  Program server = Spawn({"--listen=127.0.0.1:0", "--backend=cpu", "--memory-limit=1GiB",
                          "--cpu-threads=2", "--shutdown-grace=2s",
                          "--persist-dir=" + dir_.string()},
                         log);
  const int port = PortOf(server);
  ASSERT_NE(port, 0) << ReadAll(log);
  auto client = ConnectTo(port, "worker");
  ASSERT_NE(client, nullptr);
  const std::string kept_bytes = Pattern(7, 4096);
  absl::StatusOr<v1::BufferInfo> kept =
      UploadRaw(*client, v1::DTYPE_FLOAT32, {1024}, v1::LAYOUT_C, "kept", kept_bytes);
  ASSERT_TRUE(kept.ok()) << kept.status();
  absl::StatusOr<v1::BufferInfo> x = CreateLarge(*client, "x");
  ASSERT_TRUE(x.ok()) << x.status();
  const int terms = TermsForASecond(*client, x->id());
  ASSERT_GT(terms, 0);

  // Four streams, six operations each: 24 s of work or more, 6 s a stream.
  for (int s = 0; s < 4; ++s) {
    absl::StatusOr<v1::StreamInfo> stream = client->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (int i = 0; i < 6; ++i) {
      absl::StatusOr<v1::Operation> queued =
          client->Submit(LongExpression(x->id(), stream->id(), terms));
      ASSERT_TRUE(queued.ok()) << queued.status();
    }
  }
  // A second client channel, used once and then idle.
  auto idle = ConnectTo(port, "idle");
  ASSERT_NE(idle, nullptr);
  ASSERT_TRUE(idle->GetServerInfo().ok());
  const int raw = ConnectSilently(port);
  ASSERT_GE(raw, 0);

  const absl::Duration took = TimeShutdown(server, raw, kGrace);
  const std::string text = ReadAll(log);
  // The grace, then at most a chunk of each running operation and the snapshot; twice the
  // grace leaves a loaded machine room, and is less than the queued work alone would take.
  EXPECT_LT(took, 2 * kGrace) << text;
  EXPECT_GE(took, kGrace) << text;
  // The operations behind each stream's running one and the one ready after it: two
  // seconds cannot have started more than four of a stream's six.
  std::smatch cancelled_count;
  ASSERT_TRUE(std::regex_search(
      text, cancelled_count,
      std::regex("\"(\\d+) queued operations did not start within the shutdown grace")))
      << text;
  const int cancelled = std::stoi(cancelled_count[1]);
  EXPECT_GE(cancelled, 4) << text;
  EXPECT_LE(cancelled, 20) << text;
  EXPECT_NE(text.find("wrote 2 named buffers to " + dir_.string() + " in "), std::string::npos)
      << text;
  // Both come back; the one the stopped operations only read, byte for byte.
  Program again = Spawn({"--listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=2",
                         "--persist-dir=" + dir_.string()},
                        log);
  const int port2 = PortOf(again);
  ASSERT_NE(port2, 0) << ReadAll(log);
  auto back = ConnectTo(port2, "worker");
  ASSERT_NE(back, nullptr);
  absl::StatusOr<std::string> bytes = DownloadBytes(*back, kept->id());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(*bytes == kept_bytes) << "the bytes differ";
  absl::StatusOr<v1::BufferInfo> x_back = back->GetBuffer("x");
  ASSERT_TRUE(x_back.ok()) << x_back.status();
  EXPECT_EQ(x_back->id(), x->id());
  EXPECT_EQ(Terminate(again), 0) << ReadAll(log);
  fs::remove(log);
}
#endif  // GPUCOMPUTE_SERVER_BIN

// ---------------------------------------------------------------------------
// Buffers persisted without authentication, restored by a server with it.

constexpr char kAliceToken[] = "alice-token-5d1f0e";
constexpr char kAdminToken[] = "root-token-8b3c27";

class UnauthenticatedPersistTest : public PersistTest {
 protected:
  void SetUp() override {
    PersistTest::SetUp();
    fs::create_directories(dir_);
    tokens_ = dir_.parent_path() / (dir_.filename().string() + ".tokens");
    WriteAll(tokens_, absl::StrCat(kAliceToken, " alice\n", kAdminToken, " ops admin\n"));
  }
  void TearDown() override {
    fs::remove(tokens_);
    for (int run = 0; run <= 2; ++run) fs::remove(Log(run));
    PersistTest::TearDown();
  }

  // Starts the server program on dir_ with `flags` besides, logging to run `run`'s log.
  Program Start(int run, const std::vector<std::string>& flags) {
    std::vector<std::string> all = {"--listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=2",
                                    "--persist-dir=" + dir_.string()};
    all.insert(all.end(), flags.begin(), flags.end());
    return Spawn(all, Log(run));
  }
  fs::path Log(int run) const {
    return dir_.parent_path() / absl::StrCat(dir_.filename().string(), "_", run, ".log");
  }
  // Puts a named buffer into dir_ as a server without authentication persists it, from
  // client "lab"; returns its id.
  std::string PersistWithoutAuthentication(const std::string& name) {
    Program p = Start(0, {});
    const int port = PortOf(p);
    EXPECT_NE(port, 0) << ReadAll(p.log);
    auto client = ConnectTo(port, "lab");
    absl::StatusOr<v1::BufferInfo> b =
        client == nullptr ? absl::UnavailableError("no client")
                          : UploadArray<double>(*client, kData, {}, v1::LAYOUT_C, name);
    EXPECT_TRUE(b.ok()) << b.status();
    client.reset();
    EXPECT_EQ(Terminate(p), 0) << ReadAll(p.log);
    return b.ok() ? b->id() : std::string();
  }
  std::unique_ptr<Client> Connect(int port, const std::string& token, const std::string& name) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", port);
    options.client_name = name;
    options.token = token;
    options.timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static inline const std::vector<double> kData = {1.5, -2, 3.25};
  fs::path tokens_;
};

// ListBuffers and DeleteBuffer naming a tenant, as the caller of `token`.
class TenantBufferCalls {
 public:
  TenantBufferCalls(int port, std::string token)
      : stub_(v1::BufferService::NewStub(grpc::CreateChannel(
            absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()))),
        token_(std::move(token)) {}

  absl::StatusOr<v1::ListBuffersResponse> List(const std::string& tenant) {
    v1::ListBuffersRequest request;
    request.set_tenant(tenant);
    v1::ListBuffersResponse response;
    auto context = Context();
    grpc::Status s = stub_->ListBuffers(context.get(), request, &response);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return response;
  }
  absl::Status Delete(const std::string& tenant, const std::string& buffer) {
    v1::DeleteBufferRequest request;
    request.set_tenant(tenant);
    request.set_buffer(buffer);
    v1::DeleteBufferResponse response;
    auto context = Context();
    grpc::Status s = stub_->DeleteBuffer(context.get(), request, &response);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  std::unique_ptr<v1::BufferService::Stub> stub_;
  std::string token_;
};

// With --unauthenticated-tenant, the tenant named gets the buffers persisted without
// authentication, under their clients' names, and keeps them across later restarts.
TEST_F(UnauthenticatedPersistTest, TheNamedTenantGetsThem) {
  const std::string id = PersistWithoutAuthentication("kept");
  ASSERT_FALSE(id.empty());
  for (int run = 1; run <= 2; ++run) {
    SCOPED_TRACE(run);
    // The second run has no flag: the buffer was written back as alice's.
    std::vector<std::string> flags = {"--tokens-file=" + tokens_.string()};
    if (run == 1) flags.push_back("--unauthenticated-tenant=alice");
    Program p = Start(run, flags);
    const int port = PortOf(p);
    ASSERT_NE(port, 0) << ReadAll(p.log);
    EXPECT_FALSE(absl::StrContains(ReadAll(p.log), "persisted without authentication"));
    auto alice = Connect(port, kAliceToken, "lab");
    ASSERT_NE(alice, nullptr);
    absl::StatusOr<std::vector<double>> got = DownloadArray<double>(*alice, "kept");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, kData);
    absl::StatusOr<v1::BufferInfo> info = alice->GetBuffer(id);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->name(), "kept");
    absl::StatusOr<v1::ListBuffersResponse> none =
        TenantBufferCalls(port, kAdminToken).List(std::string(kUnauthenticatedTenantName));
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->buffers_size(), 0);
    alice.reset();
    EXPECT_EQ(Terminate(p), 0) << ReadAll(p.log);
  }
}

// Without the flag they are restored into no tenant: the start says how many and how to
// reach them, no tenant sees them, and the admin lists and deletes them; then the next
// start restores nothing.
TEST_F(UnauthenticatedPersistTest, TheAdminListsAndDeletesThemWithoutTheFlag) {
  const std::string id = PersistWithoutAuthentication("stray");
  ASSERT_FALSE(id.empty());
  const std::vector<std::string> flags = {"--tokens-file=" + tokens_.string()};
  Program p = Start(1, flags);
  const int port = PortOf(p);
  ASSERT_NE(port, 0) << ReadAll(p.log);
  const std::string log = ReadAll(p.log);
  EXPECT_TRUE(absl::StrContains(
      log, "buffers persisted without authentication and restored into no tenant, which no token "
           "reaches: 1."))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "naming tenant '(unauthenticated)'")) << log;
  EXPECT_TRUE(absl::StrContains(log, "--unauthenticated-tenant=NAME")) << log;

  auto alice = Connect(port, kAliceToken, "lab");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->GetBuffer(id).status().code(), absl::StatusCode::kNotFound);
  TenantBufferCalls as_alice(port, kAliceToken);
  TenantBufferCalls as_admin(port, kAdminToken);
  const std::string unauthenticated(kUnauthenticatedTenantName);
  absl::StatusOr<v1::ListBuffersResponse> refused = as_alice.List(unauthenticated);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.status().message(),
            "listing a tenant's buffers needs an admin token; tenant 'alice' is not an admin");
  absl::Status not_hers = as_alice.Delete(unauthenticated, id);
  EXPECT_EQ(not_hers.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(not_hers.message(),
            "deleting a tenant's buffer needs an admin token; tenant 'alice' is not an admin");

  absl::StatusOr<v1::ListBuffersResponse> listed = as_admin.List(unauthenticated);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->buffers_size(), 1);
  EXPECT_EQ(listed->buffers(0).id(), id);
  EXPECT_EQ(listed->buffers(0).name(), "stray");
  EXPECT_EQ(listed->total_bytes(), kData.size() * sizeof(double));
  // By name it is refused, and nothing goes.
  absl::Status by_name = as_admin.Delete(unauthenticated, "stray");
  EXPECT_EQ(by_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(by_name.message(), "name the buffer by its id")) << by_name;
  ASSERT_TRUE(as_admin.List(unauthenticated).ok());
  EXPECT_EQ(as_admin.List(unauthenticated)->buffers_size(), 1);

  EXPECT_TRUE(as_admin.Delete(unauthenticated, id).ok());
  absl::StatusOr<v1::ListBuffersResponse> after = as_admin.List(unauthenticated);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->buffers_size(), 0);
  alice.reset();
  EXPECT_EQ(Terminate(p), 0) << ReadAll(p.log);
  EXPECT_TRUE(Files().empty());

  Program q = Start(2, flags);
  const int again = PortOf(q);
  ASSERT_NE(again, 0) << ReadAll(q.log);
  EXPECT_TRUE(absl::StrContains(ReadAll(q.log), "restored 0 buffers")) << ReadAll(q.log);
  EXPECT_FALSE(absl::StrContains(ReadAll(q.log), "persisted without authentication"));
  absl::StatusOr<v1::ListBuffersResponse> gone = TenantBufferCalls(again, kAdminToken).List(unauthenticated);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->buffers_size(), 0);
  EXPECT_EQ(Terminate(q), 0) << ReadAll(q.log);
}

// --unauthenticated-tenant names a tenant and needs what it applies to: a persist
// directory and authentication.
TEST_F(UnauthenticatedPersistTest, TheFlagIsRefusedWhereItCannotApply) {
  const struct {
    std::string tenant;
    bool tokens;
    std::string persist_dir;
    std::string says;
  } cases[] = {
      {"no tenant!", true, dir_.string(),
       "unauthenticated tenant 'no tenant!': a tenant name must be 1 to 64 characters"},
      {"alice", false, dir_.string(), "this server has no authentication"},
      {"alice", true, "", "this server has no --persist-dir"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.measure_copy_ceiling = false;
    options.unauthenticated_tenant = c.tenant;
    options.persist_dir = c.persist_dir;
    if (c.tokens) options.tokens_file = tokens_.string();
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.says)) << server.status();
  }
}

}  // namespace
}  // namespace gpucompute::testing

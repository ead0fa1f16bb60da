// Load with faults, through a real server over a real socket: 32 clients across 4 tenants,
// each running a mix of uploads, expressions, reductions, downloads, deletes and probes of
// the other tenants' buffers, while clients are killed at random in the middle of an upload
// and in the middle of an operation. Checks every surviving result against a float64
// reference computed here, that no tenant reaches another's data, that every buffer a killed
// client left behind is reclaimed when its lease ends, and that memory returns to where it
// started.
//
// GPUCOMPUTE_LOAD_OPS sets the operations per client (default 1000); the sanitizer builds
// run fewer.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

constexpr int kTenants = 4;
constexpr int kClientsPerTenant = 8;
// Leases: of operation results, and of the arrays clients upload (renewed by every use, so
// only an abandoned array expires).
constexpr double kResultLease = 2;
constexpr double kArrayLease = 10;

int OpsPerClient() {
  int ops = 1000;
  if (const char* env = std::getenv("GPUCOMPUTE_LOAD_OPS"); env != nullptr) {
    if (!absl::SimpleAtoi(env, &ops) || ops < 1) ops = 1000;
  }
  return ops;
}

std::string Token(int tenant) { return absl::StrCat("load-token-", tenant, "-0123456789abcdef"); }
constexpr char kAdminToken[] = "load-admin-token-fedcba9876543210";

// The ids each tenant's clients created, for the other tenants to probe.
class IdBoard {
 public:
  void Add(int tenant, const std::string& id) {
    absl::MutexLock lock(&mu_);
    ids_[tenant].push_back(id);
  }
  // An id some other tenant created, or "" if there is none yet.
  std::string Foreign(int tenant, std::mt19937_64& rng) {
    absl::MutexLock lock(&mu_);
    const int other = (tenant + 1 + static_cast<int>(rng() % (kTenants - 1))) % kTenants;
    const std::vector<std::string>& ids = ids_[other];
    return ids.empty() ? "" : ids[rng() % ids.size()];
  }
  std::vector<std::string> All(int tenant) {
    absl::MutexLock lock(&mu_);
    return ids_[tenant];
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> ids_[kTenants] ABSL_GUARDED_BY(mu_);
};

struct Tally {
  std::atomic<int> ops{0};
  std::atomic<int> checked{0};
  std::atomic<int> wrong{0};
  std::atomic<int> probes{0};
  std::atomic<int> leaks{0};  // a probe of another tenant's id that did not get NOT_FOUND
  std::atomic<int> killed_uploads{0};
  std::atomic<int> killed_operations{0};
  std::atomic<int> unexpected{0};
  absl::Mutex mu;
  std::vector<std::string> failures ABSL_GUARDED_BY(mu);

  void Fail(std::string what) {
    unexpected.fetch_add(1);
    absl::MutexLock lock(&mu);
    if (failures.size() < 20) failures.push_back(std::move(what));
  }
};

class LoadClient {
 public:
  LoadClient(const TestServer& server, int index, IdBoard& board, Tally& tally)
      : server_(server),
        tenant_(index % kTenants),
        name_(absl::StrCat("c", index / kTenants)),  // the same names in every tenant
        rng_(0x10adull * 1000003 + index),
        board_(board),
        tally_(tally) {}

  void Run(int ops) {
    client_ = Connect();
    if (client_ == nullptr) return;
    for (int i = 0; i < ops; ++i) {
      tally_.ops.fetch_add(1);
      const int r = static_cast<int>(rng_() % 100);
      if (r < 25 || x_.empty()) {
        UploadX();
      } else if (r < 50) {
        Evaluate();
      } else if (r < 62) {
        Reduce();
      } else if (r < 72) {
        ProbeForeign();
      } else if (r < 80) {
        DeleteX();
      } else if (r < 90) {
        KillMidUpload();
      } else {
        KillMidOperation();
      }
    }
    if (!x_id_.empty()) (void)client_->DeleteBuffer(x_id_);
  }

 private:
  std::unique_ptr<Client> Connect() const {
    ClientOptions options;
    options.target = server_.target();
    // A client that comes back after being killed is a new process: a new name, since the
    // old one's names stay taken until their leases end.
    options.client_name = absl::StrCat(name_, "-", generation_);
    options.token = Token(tenant_);
    options.chunk_bytes = 16 << 10;  // several chunks per upload, so kills land mid-stream
    options.timeout = absl::Seconds(120);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) {
      tally_.Fail(absl::StrCat("connect: ", client.status().ToString()));
      return nullptr;
    }
    return *std::move(client);
  }

  v1::UploadHeader Header(uint64_t n) const {
    v1::UploadHeader header;
    v1::CreateBufferRequest* create = header.mutable_create();
    create->set_dtype(v1::DTYPE_FLOAT64);
    create->add_shape(n);
    create->set_ttl_seconds(kArrayLease);
    return header;
  }

  // Replaces the client's array "x" (same name in every tenant) with fresh values.
  void UploadX() {
    if (!x_id_.empty()) (void)client_->DeleteBuffer(x_id_);
    x_id_.clear();
    x_ = RandomDoubles(1 + rng_() % 4096, -4, 4, rng_());
    v1::UploadHeader header = Header(x_.size());
    header.mutable_create()->set_name("x");
    absl::StatusOr<v1::UploadResponse> up =
        client_->Upload(header, std::as_bytes(std::span<const double>(x_)));
    if (!up.ok()) {
      tally_.Fail(absl::StrCat("upload: ", up.status().ToString()));
      x_.clear();
      return;
    }
    x_id_ = up->buffer().id();
    board_.Add(tenant_, x_id_);
  }

  // y = x*a + b into an unnamed result (the server's default lease), downloaded and checked.
  void Evaluate() {
    const double a = static_cast<double>(rng_() % 17) - 8, b = static_cast<double>(rng_() % 9);
    v1::SubmitRequest request = Elementwise(
        "x*a + b", {{"x", BufferOperand("x")}, {"a", ScalarOperand(a)}, {"b", ScalarOperand(b)}});
    request.set_wait(true);
    absl::StatusOr<v1::Operation> op = client_->Submit(request);
    if (!op.ok() || op->state() != v1::Operation::STATE_SUCCEEDED || op->outputs_size() != 1) {
      tally_.Fail(absl::StrCat("eval: ", op.ok() ? op->error_message() : op.status().ToString()));
      return;
    }
    const std::string y = op->outputs(0).id();
    board_.Add(tenant_, y);
    absl::StatusOr<std::vector<double>> got = DownloadArray<double>(*client_, y);
    (void)client_->DeleteBuffer(y);
    if (!got.ok() || got->size() != x_.size()) {
      tally_.Fail(absl::StrCat("eval download: ", StatusOf(got).ToString()));
      return;
    }
    tally_.checked.fetch_add(1);
    for (size_t i = 0; i < x_.size(); ++i) {
      if ((*got)[i] != x_[i] * a + b) {  // exact: a and b are small integers
        tally_.wrong.fetch_add(1);
        return;
      }
    }
  }

  void Reduce() {
    v1::SubmitRequest request = gpucompute::Reduce(v1::REDUCE_KIND_SUM, "x");
    request.set_wait(true);
    absl::StatusOr<v1::Operation> op = client_->Submit(request);
    if (!op.ok() || op->state() != v1::Operation::STATE_SUCCEEDED || op->values_size() != 1) {
      tally_.Fail(absl::StrCat("sum: ", op.ok() ? op->error_message() : op.status().ToString()));
      return;
    }
    double want = 0, scale = 0;
    for (double v : x_) want += v, scale += std::fabs(v);
    tally_.checked.fetch_add(1);
    if (std::fabs(op->values(0).float_value() - want) > 1e-12 * scale + 1e-12) {
      tally_.wrong.fetch_add(1);
    }
  }

  // Another tenant's id must look exactly like an unknown one, through every door.
  void ProbeForeign() {
    const std::string id = board_.Foreign(tenant_, rng_);
    if (id.empty()) return;
    tally_.probes.fetch_add(1);
    const absl::Status get = client_->GetBuffer(id).status();
    const absl::Status down = DownloadBytes(*client_, id).status();
    v1::SubmitRequest request = Elementwise("x + 1", {{"x", BufferOperand(id)}});
    request.set_wait(true);
    const absl::Status submit = client_->Submit(request).status();
    const absl::Status del = client_->DeleteBuffer(id);
    for (const absl::Status& s : {get, down, submit, del}) {
      if (s.code() != absl::StatusCode::kNotFound) tally_.leaks.fetch_add(1);
    }
  }

  void DeleteX() {
    if (x_id_.empty()) return;
    if (absl::Status s = client_->DeleteBuffer(x_id_); !s.ok()) {
      tally_.Fail(absl::StrCat("delete: ", s.ToString()));
    }
    x_id_.clear();
    x_.clear();
  }

  // The client goes away after a few chunks of an upload: the reader fails, which cancels
  // the stream as a dying process's closed connection does. Nothing may appear.
  void KillMidUpload() {
    const uint64_t n = 64 << 10;  // 512 KiB: 32 chunks
    const int chunks_before_death = 1 + static_cast<int>(rng_() % 8);
    int chunks = 0;
    UploadReader reader = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
      if (++chunks > chunks_before_death) return absl::AbortedError("client killed");
      std::memset(out.data(), 0x5a, out.size());
      return out.size();
    };
    v1::UploadHeader header = Header(n);
    header.mutable_create()->set_name("doomed");
    absl::StatusOr<v1::UploadResponse> up = client_->Upload(header, n * 8, reader);
    if (up.ok()) {
      tally_.Fail("an upload whose client died mid-stream completed");
      return;
    }
    tally_.killed_uploads.fetch_add(1);
    if (client_->GetBuffer("doomed").status().code() != absl::StatusCode::kNotFound) {
      tally_.Fail("a killed upload left its buffer visible");
    }
  }

  // The client submits a fill of a leased buffer and dies before the answer: the whole
  // Client (its channel and calls) is destroyed, and a new one takes its place. The buffer
  // it created lives only until its lease ends.
  void KillMidOperation() {
    v1::SubmitRequest request =
        Random(v1::DISTRIBUTION_NORMAL, {1 + rng_() % (256 << 10)}, v1::DTYPE_FLOAT64, rng_());
    request.mutable_random()->mutable_output()->set_ttl_seconds(kResultLease);
    OperationFuture future = client_->SubmitAsync(request);
    client_.reset();  // cancels the call in flight
    tally_.killed_operations.fetch_add(1);
    ++generation_;
    client_ = Connect();
    if (client_ == nullptr) return;
    // A client that is killed does not get the chance to clean up: its x is the orphan.
    if (!x_id_.empty()) orphans_.push_back(x_id_);
    x_id_.clear();
    x_.clear();
  }

 public:
  int tenant() const { return tenant_; }
  std::vector<std::string> orphans_;

 private:
  const TestServer& server_;
  const int tenant_;
  const std::string name_;
  std::mt19937_64 rng_;
  IdBoard& board_;
  Tally& tally_;
  int generation_ = 0;
  std::unique_ptr<Client> client_;
  std::vector<double> x_;
  std::string x_id_;
};

TEST(ServerLoadTest, FourTenantsThirtyTwoClientsWithKills) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("gpucompute-load-", getpid());
  std::filesystem::create_directories(dir);
  const std::filesystem::path tokens = dir / "tokens";
  {
    std::ofstream out(tokens);
    for (int t = 0; t < kTenants; ++t) out << Token(t) << " tenant-" << t << "\n";
    out << kAdminToken << " operators admin\n";
  }
  std::unique_ptr<TestServer> server =
      TestServer::StartWith(nullptr, 512 * kMiB, 2, [&](ServerOptions& options) {
        options.tokens_file = tokens.string();
        options.default_result_ttl_seconds = kResultLease;
        options.lease_sweep_interval = absl::Milliseconds(100);
      });
  ASSERT_NE(server, nullptr);
  ClientOptions admin_options;
  admin_options.target = server->target();
  admin_options.token = kAdminToken;
  absl::StatusOr<std::unique_ptr<Client>> admin = Client::Connect(admin_options);
  ASSERT_TRUE(admin.ok()) << admin.status();
  absl::StatusOr<v1::ServerInfo> before = (*admin)->GetServerInfo();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(before->admin());

  IdBoard board;
  Tally tally;
  std::vector<std::unique_ptr<LoadClient>> clients;
  for (int i = 0; i < kTenants * kClientsPerTenant; ++i) {
    clients.push_back(std::make_unique<LoadClient>(*server, i, board, tally));
  }
  const int ops = OpsPerClient();
  {
    std::vector<std::thread> threads;
    for (auto& c : clients) threads.emplace_back([&c, ops] { c->Run(ops); });
    for (std::thread& t : threads) t.join();
  }
  {
    absl::MutexLock lock(&tally.mu);
    for (const std::string& f : tally.failures) ADD_FAILURE() << f;
  }
  std::printf("load: %d ops, %d results checked, %d probes, %d killed uploads, %d killed ops\n",
              tally.ops.load(), tally.checked.load(), tally.probes.load(),
              tally.killed_uploads.load(), tally.killed_operations.load());
  EXPECT_EQ(tally.unexpected.load(), 0);
  EXPECT_EQ(tally.wrong.load(), 0);
  EXPECT_EQ(tally.leaks.load(), 0);
  EXPECT_GT(tally.checked.load(), 0);
  EXPECT_GT(tally.probes.load(), 0);
  EXPECT_GT(tally.killed_uploads.load(), 0);
  EXPECT_GT(tally.killed_operations.load(), 0);

  // No tenant lists a buffer another tenant's clients made.
  for (int t = 0; t < kTenants; ++t) {
    ClientOptions options;
    options.target = server->target();
    options.token = Token(t);
    options.client_name = "c0-0";
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<v1::ListBuffersResponse> list = (*c)->ListBuffers();
    ASSERT_TRUE(list.ok()) << list.status();
    for (int other = 0; other < kTenants; ++other) {
      if (other == t) continue;
      const std::vector<std::string> theirs = board.All(other);
      for (const v1::BufferInfo& b : list->buffers()) {
        EXPECT_EQ(std::find(theirs.begin(), theirs.end(), b.id()), theirs.end())
            << "tenant " << t << " lists " << b.id() << " of tenant " << other;
      }
    }
  }

  // The orphans of killed clients, and every other leased buffer, are reclaimed when their
  // leases end; memory then returns to where it started.
  const absl::Time deadline = absl::Now() + absl::Seconds(kArrayLease + 30);
  uint64_t used = 0, count = 0;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::ServerInfo> info = (*admin)->GetServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    used = info->memory_used_bytes();
    count = info->buffer_count();
    if (used == before->memory_used_bytes() && count == before->buffer_count()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(used, before->memory_used_bytes());
  EXPECT_EQ(count, before->buffer_count());
  for (const auto& c : clients) {
    ClientOptions options;
    options.target = server->target();
    options.token = Token(c->tenant());
    absl::StatusOr<std::unique_ptr<Client>> owner = Client::Connect(options);
    ASSERT_TRUE(owner.ok());
    for (const std::string& id : c->orphans_) {
      EXPECT_EQ((*owner)->GetBuffer(id).status().code(), absl::StatusCode::kNotFound) << id;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpucompute::testing

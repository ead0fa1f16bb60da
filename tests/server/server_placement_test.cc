// Replicas that each serve the tenants the placement table places on them, end to end: the
// tenant header, redirects on every RPC family, the exempt health service, reloads of the
// table, and the clients that follow a redirect. Real servers on loopback sockets.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <span>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "gpucompute/v1/limits.h"
#include "server/server.h"
#include "server/tenancy/placement.h"
#include "tests/metrics/metrics_scrape.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

constexpr char kAliceToken[] = "alice-token-5be1";
constexpr char kBobToken[] = "bob-token-90aa";
constexpr char kCarolToken[] = "carol-token-11f2";
constexpr char kTokens[] =
    "alice-token-5be1 alice\n"
    "bob-token-90aa bob\n"
    "carol-token-11f2 carol\n";

// ---------------------------------------------------------------------------
// The table and the addresses.

TEST(PlacementTableTest, ParsesRowsAndComments) {
  absl::StatusOr<PlacementTable> table = PlacementTable::Parse(
      "# tenant replica\n"
      "alice gpucompute-0\n"
      "\n"
      "bob\tgpucompute-1   # moved last week\n");
  ASSERT_OK(table);
  EXPECT_EQ(table->size(), 2u);
  ASSERT_NE(table->Find("alice"), nullptr);
  EXPECT_EQ(*table->Find("alice"), "gpucompute-0");
  ASSERT_NE(table->Find("bob"), nullptr);
  EXPECT_EQ(*table->Find("bob"), "gpucompute-1");
  EXPECT_EQ(table->Find("carol"), nullptr);
  ASSERT_OK(PlacementTable::Parse("# nothing placed yet\n"));
}

TEST(PlacementTableTest, MalformedTablesNameTheLine) {
  const struct {
    std::string text;
    std::string says;
  } cases[] = {
      {"alice\n", "line 1: expected 'TENANT REPLICA'"},
      {"alice r0 r1\n", "line 1: expected 'TENANT REPLICA'"},
      {"ok r0\nal/ice r0\n", "line 2: a tenant name must be 1 to 64 characters of A-Z a-z 0-9 . _ -"},
      {"alice r0\nalice r1\n", "line 2: tenant 'alice' has a row on an earlier line too"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<PlacementTable> table = PlacementTable::Parse(c.text);
    EXPECT_EQ(table.status(), absl::InvalidArgumentError(c.says));
  }
}

TEST(ReplicaAddressesTest, ExplicitEntriesWinOverTheTemplate) {
  ReplicaAddresses addresses;
  ASSERT_OK(addresses.ParseList("r0=10.0.0.1:50051, r1=[::1]:7000"));
  addresses.address_template = "{replica}.replicas.svc:50051";
  EXPECT_EQ(addresses.Find("r0"), "10.0.0.1:50051");
  EXPECT_EQ(addresses.Find("r1"), "[::1]:7000");
  EXPECT_EQ(addresses.Find("r2"), "r2.replicas.svc:50051");
  EXPECT_EQ(ReplicaAddresses{}.Find("r0"), std::nullopt);
  EXPECT_EQ(ReplicaAddresses{}.ParseList("r0=host"),
            absl::InvalidArgumentError("--replica-addresses entry 'r0=host' is not NAME=HOST:PORT"));
  EXPECT_EQ(ReplicaAddresses{}.ParseList("r0=a:1,r0=b:2"),
            absl::InvalidArgumentError("--replica-addresses names replica 'r0' twice"));
}

// ---------------------------------------------------------------------------
// Servers.

// Two replicas r0 and r1 on loopback with one table: alice on r0, bob on r1, carol on
// neither. Each knows the other's address from --replica-addresses.
class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = dir_.Write("tokens", kTokens);
    table_ = dir_.Write("placement", "alice r0\nbob r1\n");
    // Ports first, then the addresses that name them: each replica is started on a port
    // picked for it.
    r0_ = StartReplica("r0", "");
    ASSERT_NE(r0_, nullptr);
    r1_ = StartReplica("r1", absl::StrCat("r0=", r0_->target()));
    ASSERT_NE(r1_, nullptr);
    // r0 learns r1's address: restarted with it on the same port.
    const std::string r0_target = r0_->target();
    r0_.reset();
    r0_ = StartReplica("r0", absl::StrCat("r1=", r1_->target()), r0_target);
    ASSERT_NE(r0_, nullptr);
  }

  std::unique_ptr<TestServer> StartReplica(const std::string& name, const std::string& addresses,
                                           const std::string& listen = "127.0.0.1:0") {
    return TestServer::StartWith(nullptr, 64 * kMiB, 2, [&](ServerOptions& options) {
      options.listen = listen;
      options.tokens_file = tokens_;
      options.replica_name = name;
      options.placement_file = table_;
      options.replica_addresses = addresses;
      options.measure_copy_ceiling = false;
      options.metrics_listen = "127.0.0.1:0";
    });
  }

  std::unique_ptr<Client> ConnectAs(const TestServer& server, const std::string& token) {
    absl::StatusOr<std::unique_ptr<Client>> client =
        server.ConnectWith([&](ClientOptions& options) { options.token = token; });
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A raw call's context: `token`'s credentials, and the tenant header when given.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token,
                                                      const std::string& tenant_header = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    if (!tenant_header.empty()) context->AddMetadata(kTenantMetadataKey, tenant_header);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return context;
  }

  // gpucompute_redirected_calls_total and gpucompute_tenant_header_refusals_total of
  // `server`.
  static std::pair<double, double> RoutingRefusals(TestServer& server) {
    HttpResponse r = HttpRequest(server.server().metrics_port(), "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    Scrape scrape = Parse(r.body);
    return {scrape.at("gpucompute_redirected_calls_total"),
            scrape.at("gpucompute_tenant_header_refusals_total")};
  }

  TempDir dir_;
  std::string tokens_;
  std::string table_;
  std::unique_ptr<TestServer> r0_;
  std::unique_ptr<TestServer> r1_;
};

v1::CreateBufferRequest NamedBuffer(const std::string& name, uint64_t elements) {
  v1::CreateBufferRequest request;
  request.set_dtype(v1::DTYPE_FLOAT32);
  request.add_shape(elements);
  request.set_name(name);
  return request;
}

// One call of each RPC shape, raw, with `context`: its status.
using RawCall = std::function<grpc::Status(grpc::ClientContext&)>;

std::map<std::string, RawCall> OneCallOfEachFamily(const std::shared_ptr<grpc::Channel>& channel) {
  std::map<std::string, RawCall> calls;
  calls["CreateBuffer"] = [channel](grpc::ClientContext& context) {
    v1::CreateBufferResponse response;
    return v1::BufferService::NewStub(channel)->CreateBuffer(&context, NamedBuffer("placed", 4),
                                                             &response);
  };
  calls["Upload"] = [channel](grpc::ClientContext& context) {
    v1::UploadResponse response;
    auto writer = v1::BufferService::NewStub(channel)->Upload(&context, &response);
    v1::UploadRequest header;
    header.mutable_header()->mutable_create()->set_dtype(v1::DTYPE_FLOAT32);
    header.mutable_header()->mutable_create()->add_shape(1);
    writer->Write(header);
    writer->WritesDone();
    return writer->Finish();
  };
  calls["Download"] = [channel](grpc::ClientContext& context) {
    v1::DownloadRequest request;
    request.set_buffer("buf-00000000000000000000000000000000");
    auto reader = v1::BufferService::NewStub(channel)->Download(&context, request);
    v1::DownloadResponse chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  calls["ListBuffers"] = [channel](grpc::ClientContext& context) {
    v1::ListBuffersResponse response;
    return v1::BufferService::NewStub(channel)->ListBuffers(&context, {}, &response);
  };
  calls["CreateStream"] = [channel](grpc::ClientContext& context) {
    v1::StreamInfo response;
    return v1::StreamService::NewStub(channel)->CreateStream(&context, {}, &response);
  };
  calls["Submit"] = [channel](grpc::ClientContext& context) {
    v1::SubmitRequest request;
    request.mutable_elementwise()->set_expression("1");
    v1::Operation response;
    return v1::OperationService::NewStub(channel)->Submit(&context, request, &response);
  };
  calls["WaitOperation"] = [channel](grpc::ClientContext& context) {
    v1::WaitOperationRequest request;
    request.set_operation_id("op-00000000000000000000000000000000");
    v1::Operation response;
    return v1::OperationService::NewStub(channel)->WaitOperation(&context, request, &response);
  };
  calls["GetServerInfo"] = [channel](grpc::ClientContext& context) {
    v1::ServerInfo response;
    return v1::ServerService::NewStub(channel)->GetServerInfo(&context, {}, &response);
  };
  calls["ListRegions"] = [channel](grpc::ClientContext& context) {
    v1::ListRegionsResponse response;
    return v1::SharedMemoryService::NewStub(channel)->ListRegions(&context, {}, &response);
  };
  calls["Session"] = [channel](grpc::ClientContext& context) {
    auto stream = v1::SessionService::NewStub(channel)->Session(&context);
    stream->WritesDone();
    v1::SessionResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  };
  calls["RunChain"] = [channel](grpc::ClientContext& context) {
    v1::ChainResponse response;
    return v1::SessionService::NewStub(channel)->RunChain(&context, {}, &response);
  };
  return calls;
}

std::string Trailer(const grpc::ClientContext& context, const std::string& key) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(key);
  return it == trailers.end() ? "(none)" : std::string(it->second.data(), it->second.size());
}

TEST_F(PlacementTest, AMisroutedCallOfEveryFamilyIsRedirectedToItsOwner) {
  std::unique_ptr<Client> alice = ConnectAs(*r0_, kAliceToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_OK(alice->CreateBuffer(NamedBuffer("kept", 8)));
  const Snapshot before = TakeSnapshot(*alice);
  const std::string message =
      absl::StrCat("tenant bob is placed on replica r1 at ", r1_->target(),
                   ", not on this replica (r0); call it there, or through the proxy that routes "
                   "on the table");
  for (const auto& [name, call] : OneCallOfEachFamily(r0_->RawChannel())) {
    SCOPED_TRACE(name);
    // With and without the (agreeing) tenant header.
    for (const std::string& header : {std::string(), std::string("bob")}) {
      std::unique_ptr<grpc::ClientContext> context = Context(kBobToken, header);
      const grpc::Status status = call(*context);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_EQ(status.error_message(), message);
      EXPECT_EQ(Trailer(*context, kRedirectAddressKey), r1_->target());
      EXPECT_EQ(Trailer(*context, kRedirectReplicaKey), "r1");
    }
  }
  EXPECT_EQ(TakeSnapshot(*alice), before);
  const size_t families = OneCallOfEachFamily(r0_->RawChannel()).size();
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(2.0 * families, 0.0));
  // Bob is served by his own replica.
  std::unique_ptr<Client> bob = ConnectAs(*r1_, kBobToken);
  ASSERT_NE(bob, nullptr);
  ASSERT_OK(bob->CreateBuffer(NamedBuffer("placed", 4)));
}

TEST_F(PlacementTest, ATenantWithoutARowIsRefusedWithoutARedirect) {
  for (const auto& [name, call] : OneCallOfEachFamily(r0_->RawChannel())) {
    SCOPED_TRACE(name);
    std::unique_ptr<grpc::ClientContext> context = Context(kCarolToken);
    const grpc::Status status = call(*context);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(status.error_message(),
              "the placement table has no row for tenant carol, so no replica serves it; an "
              "operator adds a row 'TENANT REPLICA' for it and reloads the servers and the proxy");
    EXPECT_EQ(Trailer(*context, kRedirectAddressKey), "(none)");
    EXPECT_EQ(Trailer(*context, kRedirectReplicaKey), "(none)");
  }
}

TEST_F(PlacementTest, ASpoofedTenantHeaderIsRefusedBeforeAnythingElse) {
  std::unique_ptr<Client> alice = ConnectAs(*r0_, kAliceToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_OK(alice->CreateBuffer(NamedBuffer("kept", 8)));
  const Snapshot before = TakeSnapshot(*alice);
  for (const auto& [name, call] : OneCallOfEachFamily(r0_->RawChannel())) {
    SCOPED_TRACE(name);
    // Alice claiming to be bob (placed elsewhere) and carol (placed nowhere): refused
    // before any redirect, which would tell her where bob lives.
    for (const char* claimed : {"bob", "carol", "Alice"}) {
      std::unique_ptr<grpc::ClientContext> context = Context(kAliceToken, claimed);
      const grpc::Status status = call(*context);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_EQ(status.error_message(),
                "metadata 'gpucompute-tenant' names another tenant than this call's credentials "
                "(alice); send 'gpucompute-tenant: alice' or none");
      EXPECT_EQ(Trailer(*context, kRedirectAddressKey), "(none)");
    }
  }
  EXPECT_EQ(TakeSnapshot(*alice), before);
  const size_t families = OneCallOfEachFamily(r0_->RawChannel()).size();
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(0.0, 3.0 * families));
  // Her own name is fine.
  std::unique_ptr<grpc::ClientContext> context = Context(kAliceToken, "alice");
  v1::ListBuffersResponse listed;
  ASSERT_TRUE(v1::BufferService::NewStub(r0_->RawChannel())
                  ->ListBuffers(context.get(), {}, &listed)
                  .ok());
  EXPECT_EQ(listed.buffers_size(), 1);
}

TEST_F(PlacementTest, HealthIsExempt) {
  // A probe carries whatever credentials it has, here another replica's tenant and one
  // without a row: the health service answers SERVING all the same.
  for (const char* token : {kBobToken, kCarolToken}) {
    SCOPED_TRACE(token);
    std::unique_ptr<grpc::ClientContext> context = Context(token, "bob");
    grpc::GenericStub stub(r0_->RawChannel());
    grpc::Slice empty("");  // HealthCheckRequest{}: the server as a whole
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(context.get(), "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status status = done.get_future().get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // HealthCheckResponse{status: SERVING}
  }
}

TEST_F(PlacementTest, AReloadMovesATenantAndABadTableKeepsTheOldOne) {
  // Raw calls: the client library would follow the redirects.
  auto list = [&](TestServer& server) {
    std::unique_ptr<grpc::ClientContext> context = Context(kBobToken);
    v1::ListBuffersResponse response;
    grpc::Status status = v1::BufferService::NewStub(server.RawChannel())
                              ->ListBuffers(context.get(), {}, &response);
    return std::make_pair(status, response.buffers_size());
  };
  ASSERT_EQ(list(*r0_).first.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(list(*r1_).first.ok());

  // A table that does not parse: both replicas keep routing as before.
  dir_.Write("placement", "alice r0\nbob\n");
  for (TestServer* server : {r0_.get(), r1_.get()}) {
    EXPECT_EQ(server->server().Reload(),
              absl::InvalidArgumentError(
                  absl::StrCat("placement file ", table_, ", line 2: expected 'TENANT REPLICA'")));
  }
  EXPECT_EQ(list(*r0_).first.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(list(*r1_).first.ok());

  // Bob moves to r0: r0 serves him (and finds nothing of his, since the refused calls
  // created nothing), r1 redirects him.
  dir_.Write("placement", "alice r0\nbob r0\n");
  ASSERT_OK(r0_->server().Reload());
  ASSERT_OK(r1_->server().Reload());
  const auto [served, buffers] = list(*r0_);
  ASSERT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(buffers, 0);
  const grpc::Status moved = list(*r1_).first;
  EXPECT_EQ(moved.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(moved.error_message(),
            absl::StrCat("tenant bob is placed on replica r0 at ", r0_->target(),
                         ", not on this replica (r1); call it there, or through the proxy that "
                         "routes on the table"));
}

TEST_F(PlacementTest, AReplicaWithoutTheOwnersAddressNamesItOnly) {
  // r1 without --replica-addresses.
  const std::string r1_target = r1_->target();
  r1_.reset();
  r1_ = StartReplica("r1", "", r1_target);
  ASSERT_NE(r1_, nullptr);
  std::unique_ptr<grpc::ClientContext> context = Context(kAliceToken);
  v1::ListBuffersResponse response;
  const grpc::Status status =
      v1::BufferService::NewStub(r1_->RawChannel())->ListBuffers(context.get(), {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "tenant alice is placed on replica r0, not on this replica (r1), and this server "
            "knows no address for it (--replica-addresses, --replica-address-template); call it "
            "through the proxy that routes on the table");
  EXPECT_EQ(Trailer(*context, kRedirectAddressKey), "(none)");
  EXPECT_EQ(Trailer(*context, kRedirectReplicaKey), "r0");
}

// ---------------------------------------------------------------------------
// The C++ client.

TEST_F(PlacementTest, TheClientSendsTheTenantAndFollowsARedirectOnceThenTalksToTheOwner) {
  // Bob's client is pointed at r0; each first call of a kind is redirected to r1, made
  // again there, and what follows goes to r1 directly.
  auto connect_bob = [&] {
    return r0_->ConnectWith([&](ClientOptions& options) {
      options.token = kBobToken;
      options.tenant = "bob";
      options.transfer_streams = 1;
    });
  };
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  ASSIGN_OR_FAIL(std::unique_ptr<Client> uploader, connect_bob());
  ASSIGN_OR_FAIL(v1::BufferInfo uploaded, UploadArray(*uploader, values, {}, v1::LAYOUT_C, "x"));
  EXPECT_EQ(uploader->target(), r1_->target());
  ASSIGN_OR_FAIL(std::unique_ptr<Client> downloader, connect_bob());
  ASSIGN_OR_FAIL(std::vector<float> downloaded, DownloadArray<float>(*downloader, "x"));
  EXPECT_EQ(downloaded, values);
  ASSIGN_OR_FAIL(std::unique_ptr<Client> unary, connect_bob());
  ASSIGN_OR_FAIL(v1::BufferInfo got, unary->GetBuffer(uploaded.id()));
  EXPECT_EQ(got.name(), "x");
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(3.0, 0.0));
  // From here on each client talks to r1 only: r0 redirects no more.
  for (Client* client : {uploader.get(), downloader.get(), unary.get()}) {
    EXPECT_EQ(client->target(), r1_->target());
    ASSIGN_OR_FAIL(v1::ListBuffersResponse listed, client->ListBuffers());
    EXPECT_EQ(listed.buffers_size(), 1);
    ASSIGN_OR_FAIL(v1::StreamInfo stream, client->CreateStream());
    EXPECT_OK(client->DeleteStream(stream.id()));
  }
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(3.0, 0.0));
  // r0 keeps nothing of bob's.
  dir_.Write("placement", "alice r0\nbob r0\n");
  ASSERT_OK(r0_->server().Reload());
  ASSIGN_OR_FAIL(std::unique_ptr<Client> bob_on_r0, r0_->ConnectWith([&](ClientOptions& options) {
    options.token = kBobToken;
  }));
  ASSIGN_OR_FAIL(v1::ListBuffersResponse on_r0, bob_on_r0->ListBuffers());
  EXPECT_EQ(on_r0.buffers_size(), 0);
}

TEST_F(PlacementTest, ASecondRedirectIsReturnedAsItIs) {
  ASSIGN_OR_FAIL(std::unique_ptr<Client> bob, r0_->ConnectWith([&](ClientOptions& options) {
    options.token = kBobToken;
  }));
  ASSERT_OK(bob->ListBuffers());
  ASSERT_EQ(bob->target(), r1_->target());
  // Bob moves back to r0: r1 redirects him there, and the client, redirected once
  // already, does not follow.
  dir_.Write("placement", "alice r0\nbob r0\n");
  ASSERT_OK(r1_->server().Reload());
  const absl::Status second = bob->ListBuffers().status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.message(),
            absl::StrCat("tenant bob is placed on replica r0 at ", r0_->target(),
                         ", not on this replica (r1); call it there, or through the proxy that "
                         "routes on the table"));
  EXPECT_EQ(RedirectAddressOf(second), r0_->target());
  EXPECT_EQ(bob->target(), r1_->target());
}

TEST_F(PlacementTest, AnUploadFromAReaderThatWasReadIsNotMadeAgain) {
  ASSIGN_OR_FAIL(std::unique_ptr<Client> bob, r0_->ConnectWith([&](ClientOptions& options) {
    options.token = kBobToken;
  }));
  const std::string data(64 << 10, 1);
  int reads = 0;
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_BOOL);
  header.mutable_create()->add_shape(data.size());
  const absl::StatusOr<v1::UploadResponse> refused = bob->Upload(
      header, data.size(), [&, offset = size_t{0}](std::span<std::byte> out) mutable {
        ++reads;
        const size_t n = std::min(out.size(), data.size() - offset);
        std::memcpy(out.data(), data.data() + offset, n);
        offset += n;
        return absl::StatusOr<size_t>(n);
      });
  // Whether r0's refusal came before the first chunk was read is a race. If it did, the
  // upload was made again on r1 and the reader read once in all (one chunk); if not, the
  // refusal is returned.
  if (refused.ok()) {
    EXPECT_EQ(reads, 1);
    ASSIGN_OR_FAIL(std::string stored, DownloadBytes(*bob, refused->buffer().id()));
    EXPECT_EQ(stored, data);
  } else {
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(RedirectAddressOf(refused.status()), r1_->target());
  }
  // Either way the client now talks to r1.
  EXPECT_EQ(bob->target(), r1_->target());
  ASSERT_OK(bob->ListBuffers());
}

// ---------------------------------------------------------------------------
// The CLI.

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the gpucompute program with `args` (shell words, quoted where needed) and the
// environment assignments `env` ("NAME=value ...") before it.
CliResult RunCli(const TempDir& dir, const std::string& env, const std::string& args) {
  const std::string out = dir.Write("cli.out", "");
  const std::string err = dir.Write("cli.err", "");
  // The build's program, unless the environment names another (as on a machine the
  // tests were copied to).
  const char* named = std::getenv("GPUCOMPUTE_CLI_BIN");
  const std::string cli = named != nullptr && *named != '\0' ? named : GPUCOMPUTE_CLI_BIN;
  const std::string command = absl::StrCat("env -u GPUCOMPUTE_TENANT -u GPUCOMPUTE_TOKEN ", env,
                                           " '", cli, "' ", args, " >'", out,
                                           "' 2>'", err, "'");
  const int status = std::system(command.c_str());
  CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  result.out = read(out);
  result.err = read(err);
  return result;
}

TEST_F(PlacementTest, TheCliSendsTheTenantAndFollowsARedirectOnce) {
  const std::string to_r0 = absl::StrCat("--server ", r0_->target(), " --token ", kBobToken);
  // --tenant, and $GPUCOMPUTE_TENANT: each command is redirected once by r0, and makes
  // its other calls on r1.
  CliResult created =
      RunCli(dir_, "", absl::StrCat(to_r0, " --tenant bob create --shape 4 --fill 2 --name c"));
  ASSERT_EQ(created.exit_code, 0) << created.err;
  const std::string npy = dir_.Write("c.npy", "");
  CliResult got = RunCli(dir_, "GPUCOMPUTE_TENANT=bob", absl::StrCat(to_r0, " get c -o ", npy));
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(2.0, 0.0));
  ASSIGN_OR_FAIL(std::unique_ptr<Client> bob, r1_->ConnectWith([&](ClientOptions& options) {
    options.token = kBobToken;
  }));
  ASSIGN_OR_FAIL(std::vector<double> stored, DownloadArray<double>(*bob, "c"));
  EXPECT_EQ(stored, std::vector<double>(4, 2.0));
  // A tenant the token does not name is refused, the environment's as well as the flag's.
  for (const auto& [env, flag] : {std::pair<std::string, std::string>{"", " --tenant alice"},
                                  {"GPUCOMPUTE_TENANT=alice", ""}}) {
    CliResult spoofed = RunCli(dir_, env, absl::StrCat(to_r0, flag, " ls"));
    EXPECT_NE(spoofed.exit_code, 0);
    EXPECT_NE(spoofed.err.find("metadata 'gpucompute-tenant' names another tenant than this "
                               "call's credentials (bob)"),
              std::string::npos)
        << spoofed.err;
  }
  EXPECT_EQ(RoutingRefusals(*r0_), std::make_pair(2.0, 2.0));
}

TEST(PlacementStartTest, ReplicaFlagsThatCannotWorkAreRefusedAtStart) {
  TempDir dir;
  const std::string tokens = dir.Write("tokens", kTokens);
  const std::string table = dir.Write("placement", "alice r0\n");
  auto start = [&](const std::function<void(ServerOptions&)>& configure) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.memory_limit_bytes = 16 * kMiB;
    options.measure_copy_ceiling = false;
    options.tokens_file = tokens;
    options.replica_name = "r0";
    options.placement_file = table;
    configure(options);
    return Server::Start(options).status();
  };
  EXPECT_EQ(start([](ServerOptions& o) { o.tokens_file.clear(); }),
            absl::InvalidArgumentError(
                "a replica (--replica-name, --placement-file) serves the tenants of the tokens "
                "file or client certificates; configure --tokens-file or --tls-client-ca"));
  EXPECT_EQ(start([](ServerOptions& o) { o.placement_file.clear(); }),
            absl::InvalidArgumentError(
                "--replica-name and --placement-file go together: a replica serves the tenants "
                "its rows of the placement table name; set both or neither"));
  EXPECT_EQ(start([](ServerOptions& o) {
              o.replica_name.clear();
              o.placement_file.clear();
              o.replica_addresses = "r1=127.0.0.1:1";
            }),
            absl::InvalidArgumentError(
                "--replica-addresses and --replica-address-template tell a replica where the "
                "others are; they need --replica-name and --placement-file"));
  EXPECT_EQ(start([](ServerOptions& o) { o.replica_address_template = "replicas:50051"; }),
            absl::InvalidArgumentError(
                "--replica-address-template 'replicas:50051' must be HOST:PORT with {replica} "
                "standing for the replica's name, e.g. {replica}.gpucompute-replicas:50051"));
  EXPECT_EQ(start([&](ServerOptions& o) { o.placement_file = dir.Write("bad", "alice\n"); }),
            absl::InvalidArgumentError(absl::StrCat(
                "placement file ", dir.Write("bad", "alice\n"),
                ", line 1: expected 'TENANT REPLICA'")));
}

TEST(TenantHeaderTest, AServerWithoutAuthenticationRefusesANamedTenant) {
  std::unique_ptr<TestServer> server = TestServer::Start(16 * kMiB);
  ASSERT_NE(server, nullptr);
  grpc::ClientContext context;
  context.AddMetadata(kTenantMetadataKey, "alice");
  v1::CreateBufferRequest request;
  request.set_dtype(v1::DTYPE_FLOAT32);
  request.add_shape(4);
  v1::CreateBufferResponse response;
  const grpc::Status status =
      v1::BufferService::NewStub(server->RawChannel())->CreateBuffer(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(),
            "metadata 'gpucompute-tenant' names a tenant, but this server has no authentication "
            "and serves its one unnamed tenant; send no 'gpucompute-tenant'");
  std::unique_ptr<Client> client = server->Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(TakeSnapshot(*client).buffer_count, 0u);
}

}  // namespace
}  // namespace gpucompute::testing

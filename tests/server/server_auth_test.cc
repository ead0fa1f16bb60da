// Authentication, TLS and tenants, end to end: a real server on a loopback socket, with
// the certificates of tests/testdata/tls (tests/testdata/tls/generate.sh makes them).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "client/cpp/shared_memory.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "server/tenancy/admission.h"
#include "server/tenancy/auth.h"
#include "server/tenancy/quotas.h"
#include "server/server.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

template <typename T>
void ExpectValue(const absl::StatusOr<T>& got, const T& want) {
  ASSERT_OK(got);
  EXPECT_EQ(*got, want);
}

// $GPUCOMPUTE_TESTDATA_DIR when set, so that this program copied to another host finds
// a copy of tests/testdata there; else the source tree's, compiled in.
std::string TestDataDir() {
  const char* dir = std::getenv("GPUCOMPUTE_TESTDATA_DIR");
  return dir != nullptr && *dir != '\0' ? dir : GPUCOMPUTE_TESTDATA_DIR;
}

std::string TlsFile(const std::string& name) { return absl::StrCat(TestDataDir(), "/tls/", name); }

constexpr char kAliceToken[] = "alice-token-3f9a1c";
constexpr char kBobToken[] = "bob-token-77d2e0";
constexpr char kRootToken[] = "root-token-c0ffee";
constexpr char kTokens[] =
    "# token tenant [admin]\n"
    "alice-token-3f9a1c alice\n"
    "bob-token-77d2e0   bob   # a comment\n"
    "\n"
    "root-token-c0ffee ops admin\n";

// ---------------------------------------------------------------------------
// Scopes and the tokens file.

TEST(ScopeTest, TenantIsRecoverableFromTheScopeAlone) {
  EXPECT_EQ(TenantOfScope(ScopeOf("alice", "default")), "alice");
  EXPECT_EQ(TenantOfScope(ScopeOf("alice", "a/b:c")), "alice");
  // Without authentication the scope is the client name, in the one tenant "".
  EXPECT_EQ(ScopeOf("", "cli-test"), "cli-test");
  EXPECT_EQ(TenantOfScope("cli-test"), "");
  EXPECT_EQ(TenantOfScope("alice/x"), "");
  EXPECT_FALSE(SameTenant(ScopeOf("alice", "x"), ScopeOf("bob", "x")));
  EXPECT_TRUE(SameTenant(ScopeOf("alice", "x"), ScopeOf("alice", "y")));
  // A client name cannot forge another tenant's scope: no tenant is a prefix that a
  // client name could complete.
  EXPECT_NE(ScopeOf("ali",
                    "ce\x1f"
                    "x"),
            ScopeOf("alice", "x"));
  EXPECT_EQ(DisplayScope(ScopeOf("alice", "x")), "alice/x");
}

TEST(TokenTableTest, ParsesTokensTenantsAndAdmins) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(kTokens);
  ASSERT_OK(table);
  EXPECT_EQ(table->size(), 3u);
  const TokenTable::Entry* alice = table->Find(kAliceToken);
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_FALSE(alice->admin);
  const TokenTable::Entry* root = table->Find(kRootToken);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->tenant, "ops");
  EXPECT_TRUE(root->admin);
  EXPECT_EQ(table->Find("alice-token-3f9a1"), nullptr);    // a prefix
  EXPECT_EQ(table->Find("alice-token-3f9a1cX"), nullptr);  // longer
  EXPECT_EQ(table->Find(""), nullptr);
  EXPECT_EQ(table->Find("alice"), nullptr);  // a tenant is not a token
}

TEST(TokenTableTest, MalformedFilesNameTheLineAndNeverTheToken) {
  const struct {
    std::string text;
    std::string says;
  } cases[] = {
      {"secret-one\n", "line 1: expected 'TOKEN TENANT [admin]'"},
      {"# ok\nsecret-one alice admin extra\n", "line 2: expected"},
      {"secret-one al/ice\n", "line 1: a tenant name must be"},
      {"secret-one alice root\n", "line 1: the third field may only be 'admin'"},
      {"secret-one alice\nsecret-one bob\n", "line 2: this token is listed on an earlier line"},
      {"", "lists no tokens"},
      {"# secret-one alice\n\n  \t\n", "lists no tokens"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text);
    ASSERT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.says), std::string::npos) << table.status();
    EXPECT_EQ(table.status().message().find("secret-one"), std::string::npos) << table.status();
  }
}

TEST(ListenAddressTest, LoopbackAddresses) {
  for (const char* address : {"127.0.0.1:50051", "127.8.9.10:1", "localhost:50051", "[::1]:50051",
                              "unix:/tmp/gpucompute.sock"}) {
    EXPECT_TRUE(IsLoopbackListenAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:50051", "example.com:1",
                              "128.0.0.1:5", "127.0.0.1.example.com:5", ":50051"}) {
    EXPECT_FALSE(IsLoopbackListenAddress(address)) << address;
  }
}

TEST(ListenAddressTest, AnAddressNeedsAHostAndAPort) {
  for (const char* address : {"127.0.0.1:50051", "127.0.0.1:0", "[::1]:65535", "localhost:1",
                              "0.0.0.0:50051", "unix:/tmp/gpucompute.sock", "unix-abstract:gc"}) {
    EXPECT_OK(ValidateListenAddress(address)) << address;
  }
  const struct {
    const char* address;
    const char* says;
  } refused[] = {
      {"127.0.0.1:", "has no port"},          {"127.0.0.1", "has no port"},
      {":50051", "has no host"},              {"[::1]", "no port after"},
      {"[::1]:", "has no port"},              {"127.0.0.1:65536", "[0, 65535]"},
      {"127.0.0.1:+5", "[0, 65535]"},         {"127.0.0.1:http", "[0, 65535]"},
      {"127.0.0.1:0000050051", "[0, 65535]"}, {"unix:", "names no socket"},
      {"", "has no port"},
  };
  for (const auto& c : refused) {
    const absl::Status s = ValidateListenAddress(c.address);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.address << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.address << ": " << s;
  }
}

// ---------------------------------------------------------------------------
// Starting: the listen address, the non-loopback refusal and the TLS files.

absl::StatusOr<std::unique_ptr<Server>> StartServer(
    const std::function<void(ServerOptions&)>& configure) {
  ServerOptions options;
  options.backend = "cpu";
  options.kernel_cache_dir = "";
  options.memory_limit_bytes = 64 * kMiB;
  options.cpu_threads = 1;
  options.measure_copy_ceiling = false;
  configure(options);
  return Server::Start(options);
}

TEST(StartTest, AnAddressWithoutAPortIsRefused) {
  absl::StatusOr<std::unique_ptr<Server>> server =
      StartServer([](ServerOptions& o) { o.listen = "127.0.0.1:"; });
  ASSERT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_NE(server.status().message().find("--listen '127.0.0.1:' has no port"), std::string::npos)
      << server.status();
}

// Two servers on one port would split its connections between them; the second is
// refused at start instead, and the first keeps serving.
TEST(StartTest, APortAnotherServerListensOnIsRefused) {
  absl::StatusOr<std::unique_ptr<Server>> first =
      StartServer([](ServerOptions& o) { o.listen = "127.0.0.1:0"; });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<Server>> second =
      StartServer([&](ServerOptions& o) { o.listen = address; });
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("cannot listen on " + address), std::string::npos)
      << second.status();

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::ServerService::NewStub(channel);
  grpc::ClientContext context;
  v1::GetServerInfoRequest request;
  v1::ServerInfo response;
  const grpc::Status status = stub->GetServerInfo(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(InsecureRemoteTest, RefusesANonLoopbackAddressWithoutAuthentication) {
  absl::StatusOr<std::unique_ptr<Server>> server =
      StartServer([](ServerOptions& o) { o.listen = "0.0.0.0:0"; });
  ASSERT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find("--allow-insecure-remote"), std::string::npos)
      << server.status();
  EXPECT_NE(server.status().message().find("0.0.0.0:0"), std::string::npos) << server.status();
}

TEST(InsecureRemoteTest, StartsWithTheFlagOrWithAuthentication) {
  TempDir dir;
  const std::string tokens = dir.Write("tokens", kTokens);
  const std::vector<std::function<void(ServerOptions&)>> configs = {
      [](ServerOptions& o) { o.allow_insecure_remote = true; },
      [&](ServerOptions& o) { o.tokens_file = tokens; },
      [](ServerOptions& o) {
        o.tls_cert_file = TlsFile("server.pem");
        o.tls_key_file = TlsFile("server.key");
        o.tls_client_ca_file = TlsFile("ca.pem");
      },
  };
  for (size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE(i);
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
      o.listen = "0.0.0.0:0";
      configs[i](o);
    });
    ASSERT_OK(server);
    EXPECT_NE((*server)->port(), 0);
  }
}

TEST(StartTest, BadTlsAndTokensFilesAreRefused) {
  TempDir dir;
  const std::string bad_tokens = dir.Write("tokens", "only-a-token-no-tenant\n");
  const std::string not_pem = dir.Write("not.pem", "hello\n");
  const struct {
    std::function<void(ServerOptions&)> configure;
    std::string says;
  } cases[] = {
      {[&](ServerOptions& o) { o.tokens_file = bad_tokens; }, "line 1"},
      {[&](ServerOptions& o) { o.tokens_file = dir.Write("empty", ""); },
       "the tokens file lists no tokens"},
      {[&](ServerOptions& o) { o.tokens_file = dir.Write("comments", "# only-a-token alice\n"); },
       "the tokens file lists no tokens"},
      {[&](ServerOptions& o) { o.tokens_file = dir.Write("x", "") + ".missing"; },
       "cannot read the tokens file"},
      {[&](ServerOptions& o) { o.tls_cert_file = TlsFile("server.pem"); }, "--tls-key"},
      {[&](ServerOptions& o) {
         o.tls_cert_file = not_pem;
         o.tls_key_file = TlsFile("server.key");
       },
       "is not a PEM file"},
      {[&](ServerOptions& o) { o.tls_client_ca_file = TlsFile("ca.pem"); }, "--tls-cert"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
      o.listen = "127.0.0.1:0";
      c.configure(o);
    });
    ASSERT_FALSE(server.ok()) << c.says;
    EXPECT_NE(server.status().message().find(c.says), std::string::npos) << server.status();
    EXPECT_EQ(server.status().message().find("only-a-token"), std::string::npos);
  }
}

// A certificate with a key that is not its own: refused at start, naming both files, not
// left to fail as "cannot listen" or at the first handshake. A matching pair still starts.
TEST(StartTest, ACertificateAndAKeyThatDoNotMatchAreRefused) {
  const struct {
    std::string cert, key;
  } mismatched[] = {
      {"server.pem", "alice.key"},    // the server's certificate, a client's key
      {"alice.pem", "server.key"},    // the other way round
      {"server.pem", "mallory.key"},  // a key of another CA's client
  };
  for (const auto& pair : mismatched) {
    SCOPED_TRACE(absl::StrCat(pair.cert, " with ", pair.key));
    const std::string cert = TlsFile(pair.cert);
    const std::string key = TlsFile(pair.key);
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
      o.listen = "127.0.0.1:0";
      o.tls_cert_file = cert;
      o.tls_key_file = key;
    });
    ASSERT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_EQ(std::string(server.status().message()),
              absl::StrCat("the TLS certificate ", cert, " and the TLS key ", key,
                           " do not match: the key is not the certificate's private key "
                           "(--tls-cert and --tls-key must be one pair)"));
  }
  for (const std::string name : {"server", "alice"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
      o.listen = "127.0.0.1:0";
      o.tls_cert_file = TlsFile(name + ".pem");
      o.tls_key_file = TlsFile(name + ".key");
    });
    ASSERT_OK(server);
    EXPECT_NE((*server)->port(), 0);
  }
}

// PEM files that hold something else than they should: a key given as the certificate,
// a certificate given as the key.
TEST(StartTest, ACertificateOrKeyFileOfTheWrongKindIsRefused) {
  const std::string server_pem = TlsFile("server.pem");
  const std::string server_key = TlsFile("server.key");
  const std::string ca_pem = TlsFile("ca.pem");
  const struct {
    std::string cert, key, says;
  } cases[] = {
      {server_key, server_key,
       absl::StrCat("the TLS certificate ", server_key, " holds no certificate in PEM")},
      {server_pem, ca_pem,
       absl::StrCat("the TLS key ", ca_pem, " holds no unencrypted private key in PEM")},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
      o.listen = "127.0.0.1:0";
      o.tls_cert_file = c.cert;
      o.tls_key_file = c.key;
    });
    ASSERT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_EQ(std::string(server.status().message()), c.says);
  }
}

// ---------------------------------------------------------------------------
// TLS and mutual TLS.

// The certificates come from $GPUCOMPUTE_TESTDATA_DIR when it is set: here, a copy of
// them elsewhere, which a TLS server then serves with.
TEST(TestDataTest, TheEnvironmentNamesTheTestData) {
  TempDir copy;
  const std::filesystem::path tls = std::filesystem::path(copy.Write("x", "")).parent_path();
  std::filesystem::copy(absl::StrCat(GPUCOMPUTE_TESTDATA_DIR, "/tls"), tls / "tls");
  const char* was = std::getenv("GPUCOMPUTE_TESTDATA_DIR");
  const std::string previous = was != nullptr ? was : "";
  ASSERT_EQ(setenv("GPUCOMPUTE_TESTDATA_DIR", tls.c_str(), 1), 0);
  EXPECT_EQ(TlsFile("ca.pem"), (tls / "tls" / "ca.pem").string());
  absl::StatusOr<std::unique_ptr<Server>> server = StartServer([&](ServerOptions& o) {
    o.listen = "127.0.0.1:0";
    o.tls_cert_file = TlsFile("server.pem");
    o.tls_key_file = TlsFile("server.key");
  });
  EXPECT_OK(server);
  if (was != nullptr) {
    setenv("GPUCOMPUTE_TESTDATA_DIR", previous.c_str(), 1);
  } else {
    unsetenv("GPUCOMPUTE_TESTDATA_DIR");
  }
}

class TlsTest : public ::testing::Test {
 protected:
  static std::unique_ptr<TestServer> Start(bool mutual) {
    return TestServer::StartWith(nullptr, 64 * kMiB, 1, [mutual](ServerOptions& o) {
      o.tls_cert_file = TlsFile("server.pem");
      o.tls_key_file = TlsFile("server.key");
      if (mutual) o.tls_client_ca_file = TlsFile("ca.pem");
    });
  }
};

TEST_F(TlsTest, ClientsThatTrustTheCaConnectAndOthersCannot) {
  std::unique_ptr<TestServer> server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> good = server->ConnectWith([](ClientOptions& o) {
    o.tls_ca_file = TlsFile("ca.pem");
    o.timeout = absl::Seconds(20);
  });
  ASSERT_OK(good);
  absl::StatusOr<v1::ServerInfo> info = (*good)->GetServerInfo();
  ASSERT_OK(info);
  // TLS alone authenticates no one: one tenant, and its callers are admins.
  EXPECT_FALSE(info->authentication_enabled());
  EXPECT_TRUE(info->admin());
  // A round trip of data over TLS.
  const std::vector<int32_t> values = {1, -2, 3, 40000};
  absl::StatusOr<v1::BufferInfo> buffer = UploadArray(**good, values);
  ASSERT_OK(buffer);
  ExpectValue(DownloadArray<int32_t>(**good, buffer->id()), values);

  const std::vector<std::function<void(ClientOptions&)>> bad = {
      [](ClientOptions&) {},                                              // plaintext
      [](ClientOptions& o) { o.tls_ca_file = TlsFile("other-ca.pem"); },  // wrong CA
      [](ClientOptions& o) {  // the right CA, a name the certificate does not carry
        o.tls_ca_file = TlsFile("ca.pem");
        o.tls_server_name = "gpucompute.example.com";
      },
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(i);
    absl::StatusOr<std::unique_ptr<Client>> client = server->ConnectWith([&](ClientOptions& o) {
      o.timeout = absl::Seconds(5);
      bad[i](o);
    });
    ASSERT_OK(client);
    EXPECT_EQ((*client)->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  }
}

TEST_F(TlsTest, MutualTlsRefusesMissingAndUnknownClientCertificates) {
  std::unique_ptr<TestServer> server = Start(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  const auto connect = [&](const std::string& cert) {
    return server->ConnectWith([&](ClientOptions& o) {
      o.tls_ca_file = TlsFile("ca.pem");
      o.timeout = absl::Seconds(5);
      if (!cert.empty()) {
        o.tls_cert_file = TlsFile(cert + ".pem");
        o.tls_key_file = TlsFile(cert + ".key");
      }
    });
  };
  // No certificate, and one signed by another CA (with the same CN): the handshake fails.
  for (const std::string cert : {"", "mallory"}) {
    SCOPED_TRACE(cert);
    absl::StatusOr<std::unique_ptr<Client>> client = connect(cert);
    ASSERT_OK(client);
    EXPECT_EQ((*client)->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  }
  // alice's certificate names her tenant.
  absl::StatusOr<std::unique_ptr<Client>> alice = connect("alice");
  ASSERT_OK(alice);
  absl::StatusOr<v1::ServerInfo> info = (*alice)->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_TRUE(info->authentication_enabled());
  EXPECT_EQ(info->tenant(), "alice");
  EXPECT_FALSE(info->admin());
}

TEST_F(TlsTest, ATokenWinsOverTheCertificate) {
  TempDir dir;
  const std::string tokens = dir.Write("tokens", kTokens);
  std::unique_ptr<TestServer> server =
      TestServer::StartWith(nullptr, 64 * kMiB, 1, [&](ServerOptions& o) {
        o.tls_cert_file = TlsFile("server.pem");
        o.tls_key_file = TlsFile("server.key");
        o.tls_client_ca_file = TlsFile("ca.pem");
        o.tokens_file = tokens;
      });
  ASSERT_NE(server, nullptr);
  const auto connect = [&](const std::string& token) {
    return server->ConnectWith([&](ClientOptions& o) {
      o.tls_ca_file = TlsFile("ca.pem");
      o.tls_cert_file = TlsFile("alice.pem");
      o.tls_key_file = TlsFile("alice.key");
      o.token = token;
    });
  };
  absl::StatusOr<std::unique_ptr<Client>> as_bob = connect(kBobToken);
  ASSERT_OK(as_bob);
  absl::StatusOr<v1::ServerInfo> info = (*as_bob)->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->tenant(), "bob");
  // A wrong token is refused even with a good certificate: it does not fall back.
  absl::StatusOr<std::unique_ptr<Client>> wrong = connect("not-a-token-5150");
  ASSERT_OK(wrong);
  EXPECT_EQ((*wrong)->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
}

// ---------------------------------------------------------------------------
// Tokens.

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = dir_.Write("tokens", kTokens);
    server_ = TestServer::StartWith(nullptr, 64 * kMiB, 2, [&](ServerOptions& o) {
      o.tokens_file = tokens_;
      o.allow_shared_memory = true;
    });
    ASSERT_NE(server_, nullptr);
    alice_ = As(kAliceToken);
    bob_ = As(kBobToken);
    root_ = As(kRootToken);
    ASSERT_NE(alice_, nullptr);
    ASSERT_NE(bob_, nullptr);
    ASSERT_NE(root_, nullptr);
  }

  std::unique_ptr<Client> As(const std::string& token, const std::string& client_name = "") {
    absl::StatusOr<std::unique_ptr<Client>> client = server_->ConnectWith([&](ClientOptions& o) {
      o.token = token;
      o.client_name = client_name;
    });
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  TempDir dir_;
  std::string tokens_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> alice_, bob_, root_;
};

TEST_F(TokenTest, MissingMalformedAndWrongTokensAreUnauthenticated) {
  const std::vector<int32_t> values = {7, 8, 9};
  absl::StatusOr<v1::BufferInfo> buffer = UploadArray(*alice_, values);
  ASSERT_OK(buffer);
  const Snapshot before = TakeSnapshot(*root_);

  std::unique_ptr<Client> none = As("");
  std::unique_ptr<Client> wrong = As("wrong-token-abc123");
  std::unique_ptr<Client> prefix = As("alice-token-3f9a1");
  for (Client* client : {none.get(), wrong.get(), prefix.get()}) {
    for (const absl::Status& status :
         {client->GetServerInfo().status(), client->ListBuffers().status(),
          client->GetBuffer(buffer->id()).status(),
          DownloadArray<int32_t>(*client, buffer->id()).status(),
          UploadArray(*client, values).status(), client->CreateStream().status(),
          client->GetStats().status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
      for (const char* secret : {"wrong-token-abc123", "alice-token-3f9a1", kAliceToken}) {
        EXPECT_EQ(status.message().find(secret), std::string::npos) << status;
      }
    }
  }
  // A header that is not "Bearer TOKEN".
  {
    std::unique_ptr<v1::ServerService::Stub> stub =
        v1::ServerService::NewStub(server_->RawChannel());
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Basic ") + kAliceToken);
    v1::ServerInfo info;
    grpc::Status status = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(status.error_message().find(kAliceToken), std::string::npos);
  }
  EXPECT_EQ(TakeSnapshot(*root_), before);
  ExpectValue(DownloadArray<int32_t>(*alice_, buffer->id()), values);
}

TEST_F(TokenTest, ReloadTakesTheNewFileAndKeepsTheOldOneOnError) {
  // alice loses her token, carol gets one.
  dir_.Write("tokens", "carol-token-1 carol\nbob-token-77d2e0 bob\n");
  ASSERT_OK(server_->server().Reload());
  std::unique_ptr<Client> carol = As("carol-token-1");
  absl::StatusOr<v1::ServerInfo> info = carol->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->tenant(), "carol");
  EXPECT_EQ(alice_->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_OK(bob_->GetServerInfo());

  // A malformed file: the error names the line, not the token, and nothing changes.
  dir_.Write("tokens", "carol-token-2\n");
  absl::Status reload = server_->server().Reload();
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reload.message().find("line 1"), std::string::npos) << reload;
  EXPECT_EQ(reload.message().find("carol-token-2"), std::string::npos) << reload;
  EXPECT_OK(carol->GetServerInfo());
  EXPECT_EQ(As("carol-token-2")->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  // A file that lists no tokens, empty or only comments, would lock every caller out:
  // refused the same.
  for (const char* text : {"", "# carol-token-1 carol\n\n"}) {
    SCOPED_TRACE(text);
    dir_.Write("tokens", text);
    reload = server_->server().Reload();
    EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(reload.message().find("lists no tokens"), std::string::npos) << reload;
    EXPECT_EQ(reload.message().find("carol-token-1"), std::string::npos) << reload;
    EXPECT_OK(carol->GetServerInfo());
    EXPECT_OK(bob_->GetServerInfo());
  }
  // A file that went away: the same.
  std::filesystem::remove(tokens_);
  EXPECT_FALSE(server_->server().Reload().ok());
  EXPECT_OK(carol->GetServerInfo());
}

TEST_F(TokenTest, OnlyAnAdminManagesTheServer) {
  EXPECT_EQ(alice_->TrimMemoryPool().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_OK(root_->TrimMemoryPool());
}

// ---------------------------------------------------------------------------
// Tenants: another tenant's id is NOT_FOUND on every RPC, with the message an unknown id
// gets, and leaves the owner's data as it was.

// What alice has: a buffer with known contents, a stream and a finished operation.
struct AliceState {
  std::string buffer;
  std::string stream;
  std::string operation;
  std::vector<int32_t> values;
};

// Expects `got` to be NOT_FOUND exactly as the same call with an unknown id is:
// `unknown` with `unknown_id` replaced by `id`.
void ExpectLikeUnknown(const absl::Status& got, const absl::Status& unknown,
                       const std::string& unknown_id, const std::string& id) {
  EXPECT_EQ(got.code(), absl::StatusCode::kNotFound) << got;
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_EQ(std::string(got.message()), absl::StrReplaceAll(unknown.message(), {{unknown_id, id}}));
}

v1::SubmitRequest ElementwiseOn(const std::string& input, const std::string& output_buffer = "",
                                const std::string& stream = "") {
  v1::SubmitRequest request;
  request.set_wait(true);
  request.set_stream_id(stream);
  v1::ElementwiseOp* op = request.mutable_elementwise();
  op->set_expression("x * 0");
  (*op->mutable_inputs())["x"].set_buffer(input);
  if (!output_buffer.empty()) op->mutable_output()->set_buffer(output_buffer);
  return request;
}

TEST_F(TokenTest, AnotherTenantsIdsAreNotFoundOnEveryRpc) {
  AliceState alice;
  alice.values = {5, 6, 7, 8};
  {
    absl::StatusOr<v1::BufferInfo> b = UploadArray(*alice_, alice.values, {}, v1::LAYOUT_C, "a");
    ASSERT_OK(b);
    alice.buffer = b->id();
    absl::StatusOr<v1::StreamInfo> s = alice_->CreateStream();
    ASSERT_OK(s);
    alice.stream = s->id();
    absl::StatusOr<v1::Operation> op =
        alice_->Submit(ElementwiseOn(alice.buffer, "", alice.stream));
    ASSERT_OK(op);
    ASSERT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED) << op->error_message();
    alice.operation = op->id();
    // The result is alice's too; she keeps only `a`.
    ASSERT_OK(alice_->DeleteBuffer(op->outputs(0).id()));
  }
  const Snapshot alice_before = TakeSnapshot(*alice_);
  const Snapshot root_before = TakeSnapshot(*root_);
  absl::StatusOr<v1::ListStreamsResponse> streams_before = alice_->ListStreams();
  ASSERT_OK(streams_before);

  // bob, under the client name alice used ("default"), and under another.
  for (const std::string& name : {std::string(), std::string("eve")}) {
    SCOPED_TRACE(absl::StrCat("bob as client '", name, "'"));
    std::unique_ptr<Client> bob = As(kBobToken, name);
    ASSERT_NE(bob, nullptr);
    const std::string no_buffer = "buf-00000000000000000000000000000000";
    const std::string no_stream = "str-00000000000000000000000000000000";
    const std::string no_op = "op-00000000000000000000000000000000";
    const auto buffer_case = [&](const std::function<absl::Status(const std::string&)>& call) {
      ExpectLikeUnknown(call(alice.buffer), call(no_buffer), no_buffer, alice.buffer);
    };
    // BufferService.
    buffer_case([&](const std::string& id) { return bob->GetBuffer(id).status(); });
    buffer_case([&](const std::string& id) { return DownloadBytes(*bob, id).status(); });
    buffer_case([&](const std::string& id) {
      v1::UploadHeader header;
      header.set_buffer(id);
      const std::vector<int32_t> zeros(4, 0);
      return bob->Upload(header, std::as_bytes(std::span<const int32_t>(zeros))).status();
    });
    buffer_case([&](const std::string& id) {
      v1::BeginUploadRequest request;
      request.mutable_header()->set_buffer(id);
      request.mutable_header()->set_size_bytes(16);
      return bob->BeginUpload(request).status();
    });
    buffer_case([&](const std::string& id) { return bob->DeleteBuffer(id); });
    // OperationService: operands and outputs.
    buffer_case([&](const std::string& id) { return bob->Submit(ElementwiseOn(id)).status(); });
    {
      absl::StatusOr<v1::BufferInfo> own = UploadArray(*bob, std::vector<int32_t>{1, 1, 1, 1});
      ASSERT_OK(own);
      buffer_case([&](const std::string& id) {
        return bob->Submit(ElementwiseOn(own->id(), id)).status();
      });
      ASSERT_OK(bob->DeleteBuffer(own->id()));
    }
    // SessionService: Session and RunChain operands.
    buffer_case([&](const std::string& id) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(*bob);
      if (!session.ok()) return session.status();
      absl::StatusOr<v1::Operation> op = (*session)->Submit(ElementwiseOn(id)).result.Get();
      EXPECT_OK((*session)->Close());
      if (!op.ok()) return op.status();
      return absl::Status(static_cast<absl::StatusCode>(op->error_code()), op->error_message());
    });
    buffer_case([&](const std::string& id) {
      Chain chain;
      chain.Add(ElementwiseOn(id));
      return chain.Run(*bob).status();
    });
    // SharedMemoryService: copies to and from another tenant's buffer.
    buffer_case([&](const std::string& id) {
      SharedMemoryTransport shm(*bob);
      v1::DownloadRequest request;
      request.set_buffer(id);
      std::string data;
      return shm.Download(request, &data).status();
    });
    buffer_case([&](const std::string& id) {
      SharedMemoryTransport shm(*bob);
      v1::UploadHeader header;
      header.set_buffer(id);
      const std::vector<int32_t> zeros(4, 0);
      return shm.Upload(header, std::as_bytes(std::span<const int32_t>(zeros))).status();
    });
    // StreamService.
    const auto stream_case = [&](const std::function<absl::Status(const std::string&)>& call) {
      ExpectLikeUnknown(call(alice.stream), call(no_stream), no_stream, alice.stream);
    };
    stream_case([&](const std::string& id) { return bob->SynchronizeStream(id).status(); });
    stream_case([&](const std::string& id) { return bob->DeleteStream(id); });
    {
      absl::StatusOr<v1::BufferInfo> own = UploadArray(*bob, std::vector<int32_t>{1, 1, 1, 1});
      ASSERT_OK(own);
      stream_case([&](const std::string& id) {
        return bob->Submit(ElementwiseOn(own->id(), "", id)).status();
      });
      ASSERT_OK(bob->DeleteBuffer(own->id()));
    }
    // OperationService.
    const auto op_case = [&](const std::function<absl::Status(const std::string&)>& call) {
      ExpectLikeUnknown(call(alice.operation), call(no_op), no_op, alice.operation);
    };
    op_case([&](const std::string& id) { return bob->GetOperation(id).status(); });
    op_case([&](const std::string& id) { return bob->WaitOperation(id, 1).status(); });
    // Listings show bob nothing of alice's.
    absl::StatusOr<v1::ListBuffersResponse> buffers = bob->ListBuffers();
    ASSERT_OK(buffers);
    EXPECT_EQ(buffers->buffers_size(), 0);
    absl::StatusOr<v1::ListStreamsResponse> streams = bob->ListStreams();
    ASSERT_OK(streams);
    for (const v1::StreamInfo& s : streams->streams()) EXPECT_NE(s.id(), alice.stream);
    // alice's name "a" means nothing to bob.
    EXPECT_EQ(bob->GetBuffer("a").status().code(), absl::StatusCode::kNotFound);
  }

  // alice's buffer, stream and operation are as they were.
  EXPECT_EQ(TakeSnapshot(*alice_), alice_before);
  ExpectValue(DownloadArray<int32_t>(*alice_, alice.buffer), alice.values);
  ExpectValue(DownloadArray<int32_t>(*alice_, "a"), alice.values);
  absl::StatusOr<v1::ListStreamsResponse> streams_after = alice_->ListStreams();
  ASSERT_OK(streams_after);
  EXPECT_EQ(streams_after->streams_size(), streams_before->streams_size());
  EXPECT_OK(alice_->SynchronizeStream(alice.stream));
  absl::StatusOr<v1::Operation> op = alice_->GetOperation(alice.operation);
  ASSERT_OK(op);
  EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  // The admin's view of the server: bob's own buffers came and went.
  EXPECT_EQ(TakeSnapshot(*root_).memory_used_bytes, root_before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*root_).buffer_count, root_before.buffer_count);
}

TEST_F(TokenTest, TenantsSeeTheirOwnFiguresAndAnAdminTheServers) {
  // alice: two int32 buffers of 100 and 50 elements; bob: one float64 buffer of 10.
  ASSERT_OK(UploadArray(*alice_, std::vector<int32_t>(100, 1)));
  ASSERT_OK(UploadArray(*alice_, std::vector<int32_t>(50, 2)));
  ASSERT_OK(UploadArray(*bob_, std::vector<double>(10, 3.0)));
  absl::StatusOr<v1::BufferInfo> bobs = UploadArray(*bob_, std::vector<double>(4, 0.5));
  ASSERT_OK(bobs);
  ASSERT_OK(bob_->Submit(ElementwiseOn(bobs->id())));  // one elementwise, bob's

  absl::StatusOr<v1::ServerInfo> a = alice_->GetServerInfo();
  ASSERT_OK(a);
  EXPECT_EQ(a->tenant(), "alice");
  EXPECT_FALSE(a->admin());
  EXPECT_TRUE(a->authentication_enabled());
  EXPECT_EQ(a->memory_used_bytes(), 600u);
  EXPECT_EQ(a->buffer_count(), 2u);
  EXPECT_EQ(a->tenant_memory_used_bytes(), 600u);
  EXPECT_EQ(a->tenant_buffer_count(), 2u);
  for (const v1::DeviceInfo& d : a->devices()) EXPECT_EQ(d.pool_used_bytes(), 0u);

  absl::StatusOr<v1::ServerInfo> b = bob_->GetServerInfo();
  ASSERT_OK(b);
  EXPECT_EQ(b->memory_used_bytes(), 80u + 32u + 32u);  // the result is bob's too
  EXPECT_EQ(b->buffer_count(), 3u);

  absl::StatusOr<v1::ServerInfo> r = root_->GetServerInfo();
  ASSERT_OK(r);
  EXPECT_EQ(r->tenant(), "ops");
  EXPECT_TRUE(r->admin());
  EXPECT_EQ(r->memory_used_bytes(), 600u + 144u);
  EXPECT_EQ(r->buffer_count(), 5u);
  EXPECT_EQ(r->tenant_memory_used_bytes(), 0u);
  EXPECT_EQ(r->tenant_buffer_count(), 0u);

  const auto count = [](const v1::Stats& stats, v1::OperationKind kind) -> uint64_t {
    for (const v1::KindStats& k : stats.kinds()) {
      if (k.kind() == kind) return k.count();
    }
    return 0;
  };
  absl::StatusOr<v1::Stats> as = alice_->GetStats();
  ASSERT_OK(as);
  EXPECT_EQ(as->tenant(), "alice");
  EXPECT_FALSE(as->admin());
  EXPECT_EQ(count(*as, v1::OPERATION_KIND_UPLOAD), 2u);
  EXPECT_EQ(count(*as, v1::OPERATION_KIND_ELEMENTWISE), 0u);
  EXPECT_EQ(as->memory_used_bytes(), 600u);
  EXPECT_EQ(as->memory_peak_bytes(), 0u);
  EXPECT_EQ(as->pools_size(), 0);
  absl::StatusOr<v1::Stats> bs = bob_->GetStats();
  ASSERT_OK(bs);
  EXPECT_EQ(count(*bs, v1::OPERATION_KIND_UPLOAD), 2u);
  EXPECT_EQ(count(*bs, v1::OPERATION_KIND_ELEMENTWISE), 1u);
  absl::StatusOr<v1::Stats> rs = root_->GetStats();
  ASSERT_OK(rs);
  EXPECT_TRUE(rs->admin());
  EXPECT_EQ(count(*rs, v1::OPERATION_KIND_UPLOAD), 4u);
  EXPECT_EQ(count(*rs, v1::OPERATION_KIND_ELEMENTWISE), 1u);
  EXPECT_EQ(rs->memory_used_bytes(), 744u);
  EXPECT_GE(rs->memory_peak_bytes(), 744u);
  EXPECT_GT(rs->pools_size(), 0);
}

// ---------------------------------------------------------------------------
// Quotas.

TEST(QuotaTableTest, DefaultsAndOverrides) {
  absl::StatusOr<QuotaTable> table = QuotaTable::Parse(
      "tenant bob buffers=3 # before the default line: it still takes the defaults\n"
      "default device_bytes=1KiB buffers=2 streams=4 operations=8\n"
      "tenant carol device_bytes=0\n");
  ASSERT_OK(table);
  const TenantQuota& alice = table->For("alice");
  EXPECT_EQ(alice.device_bytes, 1024u);
  EXPECT_EQ(alice.buffers, 2u);
  EXPECT_EQ(alice.streams, 4u);
  EXPECT_EQ(alice.operations, 8u);
  EXPECT_EQ(table->For("bob").buffers, 3u);
  EXPECT_EQ(table->For("bob").device_bytes, 1024u);
  EXPECT_EQ(table->For("carol").device_bytes, 0u);  // none
  EXPECT_EQ(table->For("carol").buffers, 2u);
  // An empty file: no quotas.
  absl::StatusOr<QuotaTable> empty = QuotaTable::Parse("# nothing\n");
  ASSERT_OK(empty);
  EXPECT_EQ(empty->For("alice").buffers, 0u);

  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"default bytes=1\n", "line 1: unknown key 'bytes'"},
           {"default buffers=-1\n", "buffers needs a non-negative integer"},
           {"default device_bytes=lots\n", "'lots' is not a byte size"},
           {"default\ndefault\n", "line 2: a second default line"},
           {"tenant a/b buffers=1\n", "a tenant name must be"},
           {"tenant a buffers=1\ntenant a streams=1\n", "tenant 'a' has a line already"},
           {"tenants a\n", "expected 'default KEY=VALUE...'"},
       }) {
    absl::StatusOr<QuotaTable> bad = QuotaTable::Parse(text);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(bad.status().message().find(says), std::string::npos) << bad.status();
  }
}

// A server of kTokens' tenants whose quota file (in `dir`, named "quotas") says `quotas`.
std::unique_ptr<TestServer> StartWithQuotas(const TempDir& dir, const std::string& quotas) {
  const std::string tokens = dir.Write("tokens", kTokens);
  const std::string quota_file = dir.Write("quotas", quotas);
  return TestServer::StartWith(nullptr, 64 * kMiB, 1, [&](ServerOptions& o) {
    o.tokens_file = tokens;
    o.quota_file = quota_file;
  });
}

std::unique_ptr<Client> ConnectAs(const TestServer& server, const std::string& token) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      server.ConnectWith([&](ClientOptions& o) { o.token = token; });
  EXPECT_OK(client);
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(QuotaTest, BuffersAndDeviceBytesPerTenantNameTheQuota) {
  TempDir dir;
  std::unique_ptr<TestServer> server =
      StartWithQuotas(dir, "default device_bytes=1KiB buffers=2\ntenant bob buffers=3\n");
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  std::unique_ptr<Client> bob = ConnectAs(*server, kBobToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);

  absl::StatusOr<v1::ServerInfo> info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().tenant_max_device_bytes(), 1024u);
  EXPECT_EQ(info->limits().tenant_max_buffers(), 2u);
  EXPECT_EQ(info->limits().tenant_max_streams(), 0u);
  EXPECT_EQ(info->limits().tenant_max_operations_in_flight(), 0u);
  info = bob->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().tenant_max_buffers(), 3u);

  // Two buffers of 256 bytes; the third is one too many.
  absl::StatusOr<v1::BufferInfo> first = UploadArray(*alice, std::vector<int32_t>(64, 1));
  ASSERT_OK(first);
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>(64, 2)));
  const Snapshot before = TakeSnapshot(*alice);
  absl::Status third = UploadArray(*alice, std::vector<int32_t>(4, 3)).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_NE(third.message().find("tenant 'alice' is at its quota 'buffers' of 2"),
            std::string::npos)
      << third;
  // An operation's new output counts as well, and the refused operation creates nothing.
  v1::SubmitRequest op = ElementwiseOn(first->id());
  op.mutable_elementwise()->mutable_output()->set_name("result");
  absl::Status submitted = alice->Submit(op).status();
  EXPECT_EQ(submitted.code(), absl::StatusCode::kResourceExhausted) << submitted;
  EXPECT_NE(submitted.message().find("quota 'buffers'"), std::string::npos) << submitted;
  EXPECT_EQ(TakeSnapshot(*alice), before);
  EXPECT_EQ(alice->GetBuffer("result").status().code(), absl::StatusCode::kNotFound);

  // With room for a buffer, 1 KiB of bytes is the limit: 256 held, 772 more do not fit,
  // 768 do.
  ASSERT_OK(alice->DeleteBuffer(first->id()));
  absl::Status big = UploadArray(*alice, std::vector<int32_t>(193, 4)).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_NE(big.message().find("quota 'device_bytes' of 1024 (256 bytes held, 772 more"),
            std::string::npos)
      << big;
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>(192, 5)));  // exactly 1 KiB in all
  absl::StatusOr<v1::ServerInfo> full = alice->GetServerInfo();
  ASSERT_OK(full);
  EXPECT_EQ(full->memory_used_bytes(), 1024u);

  // bob's quota is his own: three buffers, whatever alice holds.
  for (int i = 0; i < 3; ++i) ASSERT_OK(UploadArray(*bob, std::vector<int32_t>(4, i)));
  EXPECT_EQ(UploadArray(*bob, std::vector<int32_t>(4, 9)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------
// Quota reloads, uploads under way, and calls in flight per tenant.

// Polls GetServerInfo of `client` until `done` holds of it.
bool InfoBecomes(Client& client, const std::function<bool(const v1::ServerInfo&)>& done) {
  return Eventually([&] {
    absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
    return info.ok() && done(*info);
  });
}

// A Session stream of a raw stub, held open until destroyed; AddOne sends one request.
class HeldSession {
 public:
  HeldSession(const std::shared_ptr<grpc::Channel>& channel, const std::string& token)
      : stub_(v1::SessionService::NewStub(channel)) {
    context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    stream_ = stub_->Session(&context_);
  }
  ~HeldSession() {
    context_.TryCancel();
    if (!finished_) (void)stream_->Finish();
  }

  // Sends `buffer` = `buffer` + 1 as one request, tagged `tag`, and reads its answer;
  // when the call ends instead, returns its status.
  absl::StatusOr<v1::Operation> AddOne(const std::string& buffer, const std::string& tag) {
    v1::SessionRequest request;
    v1::ChainStep* step = request.add_ops();
    step->set_tag(tag);
    v1::ElementwiseOp* add = step->mutable_op()->mutable_elementwise();
    add->set_expression("x + 1");
    (*add->mutable_inputs())["x"].set_buffer(buffer);
    add->mutable_output()->set_buffer(buffer);
    stream_->Write(request);
    v1::SessionResponse response;
    if (!stream_->Read(&response)) {
      finished_ = true;
      const grpc::Status status = stream_->Finish();
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    if (response.answers_size() != 1) return absl::InternalError("not one answer");
    return response.answers(0).operation();
  }

 private:
  std::unique_ptr<v1::SessionService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  bool finished_ = false;
};

TEST_F(TokenTest, AReloadThatDropsATokenEndsTheSessionsItOpenedAtTheirNextRequest) {
  absl::StatusOr<v1::BufferInfo> a = UploadArray(*alice_, std::vector<int32_t>{1, 2, 3});
  absl::StatusOr<v1::BufferInfo> b = UploadArray(*bob_, std::vector<int32_t>{10, 20});
  ASSERT_OK(a);
  ASSERT_OK(b);
  HeldSession alice_session(server_->RawChannel(), kAliceToken);
  HeldSession bob_session(server_->RawChannel(), kBobToken);
  absl::StatusOr<v1::Operation> ran = alice_session.AddOne(a->id(), "a1");
  ASSERT_OK(ran);
  EXPECT_EQ(ran->state(), v1::Operation::STATE_SUCCEEDED) << ran->error_message();
  ran = bob_session.AddOne(b->id(), "b1");
  ASSERT_OK(ran);
  EXPECT_EQ(ran->state(), v1::Operation::STATE_SUCCEEDED) << ran->error_message();

  // alice's token goes; a second token of hers comes, to look at her buffer afterwards.
  dir_.Write("tokens", "bob-token-77d2e0 bob\nroot-token-c0ffee ops admin\nalice-token-2 alice\n");
  ASSERT_OK(server_->server().Reload());
  const Snapshot before = TakeSnapshot(*root_);
  absl::StatusOr<v1::Operation> refused = alice_session.AddOne(a->id(), "a2");
  EXPECT_EQ(refused.status(),
            absl::UnauthenticatedError(
                "the token this call was opened with was revoked (a reload of the server's "
                "tokens file dropped it); open a new call with a token the file lists"));
  // Nothing ran: alice's buffer holds what the first request left.
  std::unique_ptr<Client> alice_again = As("alice-token-2");
  ExpectValue(DownloadArray<int32_t>(*alice_again, a->id()), std::vector<int32_t>{2, 3, 4});
  EXPECT_EQ(TakeSnapshot(*root_), before);

  // bob's token stayed, and so does his session.
  ran = bob_session.AddOne(b->id(), "b2");
  ASSERT_OK(ran);
  EXPECT_EQ(ran->state(), v1::Operation::STATE_SUCCEEDED) << ran->error_message();
  ExpectValue(DownloadArray<int32_t>(*bob_, b->id()), std::vector<int32_t>{12, 22});

  // alice's old token listed again is a new grant, which a new session works with.
  dir_.Write("tokens", kTokens);
  ASSERT_OK(server_->server().Reload());
  HeldSession new_session(server_->RawChannel(), kAliceToken);
  ran = new_session.AddOne(a->id(), "a3");
  ASSERT_OK(ran);
  EXPECT_EQ(ran->state(), v1::Operation::STATE_SUCCEEDED) << ran->error_message();
  ExpectValue(DownloadArray<int32_t>(*alice_, a->id()), std::vector<int32_t>{3, 4, 5});
}

TEST_F(TokenTest, AReloadThatGivesATokenAnotherTenantRevokesItToo) {
  HeldSession session(server_->RawChannel(), kBobToken);
  absl::StatusOr<v1::BufferInfo> b = UploadArray(*bob_, std::vector<int32_t>{7});
  ASSERT_OK(b);
  ASSERT_OK(session.AddOne(b->id(), "b1"));
  dir_.Write("tokens", "bob-token-77d2e0 carol\nroot-token-c0ffee ops admin\n");
  ASSERT_OK(server_->server().Reload());
  EXPECT_EQ(session.AddOne(b->id(), "b2").status().code(), absl::StatusCode::kUnauthenticated);
}

// An Upload stream of a raw stub that sends its header and then holds the upload open,
// sending nothing, until Cancel or destruction.
class HeldUpload {
 public:
  HeldUpload(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
             uint64_t elements)
      : HeldUpload(channel, token, CreateHeader(elements)) {}
  // A stream with `header` of its own: a range stream's, say.
  HeldUpload(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
             const v1::UploadHeader& header)
      : stub_(v1::BufferService::NewStub(channel)) {
    context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    writer_ = stub_->Upload(&context_, &response_);
    v1::UploadRequest request;
    *request.mutable_header() = header;
    ok_ = writer_->Write(request);
  }
  // Creates an int32 array of `elements`.
  static v1::UploadHeader CreateHeader(uint64_t elements) {
    v1::UploadHeader header;
    header.mutable_create()->set_dtype(v1::DTYPE_INT32);
    header.mutable_create()->add_shape(elements);
    header.set_size_bytes(elements * 4);
    return header;
  }
  ~HeldUpload() { Cancel(); }
  bool ok() const { return ok_; }
  const v1::UploadResponse& response() const { return response_; }
  // Sends `values` as the next chunk; false once the stream is over.
  bool Send(const std::vector<int32_t>& values) {
    v1::UploadRequest request;
    request.set_chunk(values.data(), values.size() * sizeof(int32_t));
    return writer_->Write(request);
  }
  // Half-closes the stream and waits for the server's answer (a refused header's).
  grpc::Status Close() {
    if (writer_ == nullptr) return status_;
    writer_->WritesDone();
    status_ = writer_->Finish();
    writer_.reset();
    return status_;
  }
  // Ends the stream; returns the status the server answered it with.
  grpc::Status Cancel() {
    if (writer_ == nullptr) return status_;
    context_.TryCancel();
    status_ = writer_->Finish();
    writer_.reset();
    return status_;
  }

 private:
  std::unique_ptr<v1::BufferService::Stub> stub_;
  grpc::ClientContext context_;
  v1::UploadResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer_;
  grpc::Status status_;
  bool ok_ = false;
};

uint64_t TenantMemoryUsed(Client& client) {
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  EXPECT_OK(info);
  return info.ok() ? info->tenant_memory_used_bytes() : 0;
}

// After the reload that revoked its token: `upload`'s next chunk fails it UNAUTHENTICATED,
// and `tenant` (a client of another token of the same tenant) holds no buffer and the
// memory it held before, `before`.
void ExpectTheNextChunkFailsTheUpload(HeldUpload& upload, Client& tenant, uint64_t before) {
  (void)upload.Send({3, 4});  // the server may have ended the call before it arrives
  const grpc::Status refused = upload.Close();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused.error_message(),
            "the token this call was opened with was revoked (a reload of the server's tokens "
            "file dropped it); open a new call with a token the file lists");
  // Nothing was created, and the memory the header reserved is free again.
  EXPECT_TRUE(InfoBecomes(
      tenant, [](const v1::ServerInfo& info) { return info.tenant_uploads_in_flight() == 0; }));
  EXPECT_EQ(TenantMemoryUsed(tenant), before);
  EXPECT_EQ(TakeSnapshot(tenant).buffers, std::vector<std::string>{});
}

constexpr char kTokensWithoutAlicesFirst[] =
    "bob-token-77d2e0 bob\nroot-token-c0ffee ops admin\nalice-token-2 alice\n";

TEST_F(TokenTest, AReloadThatDropsATokenFailsTheUploadsItOpenedAtTheirNextChunk) {
  const uint64_t alice_before = TenantMemoryUsed(*alice_);
  // Each declares 4 elements and sends the first 2 before the reload.
  HeldUpload alice_upload(server_->RawChannel(), kAliceToken, 4);
  HeldUpload bob_upload(server_->RawChannel(), kBobToken, 4);
  ASSERT_TRUE(alice_upload.ok());
  ASSERT_TRUE(bob_upload.ok());
  ASSERT_TRUE(alice_upload.Send({1, 2}));
  ASSERT_TRUE(bob_upload.Send({5, 6}));
  ASSERT_TRUE(InfoBecomes(*alice_, [&](const v1::ServerInfo& info) {
    return info.tenant_uploads_in_flight() == 1 &&
           info.tenant_memory_used_bytes() == alice_before + 16;
  }));

  dir_.Write("tokens", kTokensWithoutAlicesFirst);
  ASSERT_OK(server_->server().Reload());
  std::unique_ptr<Client> alice_again = As("alice-token-2");
  ASSERT_NE(alice_again, nullptr);
  ExpectTheNextChunkFailsTheUpload(alice_upload, *alice_again, alice_before);

  // bob's token stayed, and his upload completes.
  ASSERT_TRUE(bob_upload.Send({7, 8}));
  ASSERT_TRUE(bob_upload.Close().ok());
  ExpectValue(DownloadArray<int32_t>(*bob_, bob_upload.response().buffer().id()),
              std::vector<int32_t>{5, 6, 7, 8});
}

TEST_F(TokenTest, AReloadThatDropsATokenFailsTheMultiRangeUploadsItsRangeStreamsWrite) {
  const uint64_t alice_before = TenantMemoryUsed(*alice_);
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = HeldUpload::CreateHeader(4);
  absl::StatusOr<v1::BeginUploadResponse> started = alice_->BeginUpload(begin);
  ASSERT_OK(started);
  // One range stream for all 16 bytes, 8 of them sent before the reload.
  v1::UploadHeader range;
  range.set_transfer_id(started->transfer_id());
  range.set_size_bytes(16);
  HeldUpload range_stream(server_->RawChannel(), kAliceToken, range);
  ASSERT_TRUE(range_stream.ok());
  ASSERT_TRUE(range_stream.Send({1, 2}));
  // The upload holds its 16 bytes from BeginUpload on; the range stream has been let in
  // once it counts among alice's calls in flight, beside the GetServerInfo that asks. A
  // stream refused at the door (its call started after the reload) names no upload.
  ASSERT_TRUE(InfoBecomes(*alice_, [&](const v1::ServerInfo& info) {
    return info.tenant_memory_used_bytes() == alice_before + 16 &&
           info.tenant_calls_in_flight() == 2;
  }));

  dir_.Write("tokens", kTokensWithoutAlicesFirst);
  ASSERT_OK(server_->server().Reload());
  std::unique_ptr<Client> alice_again = As("alice-token-2");
  ASSERT_NE(alice_again, nullptr);
  ExpectTheNextChunkFailsTheUpload(range_stream, *alice_again, alice_before);
}

TEST(QuotaTest, ReloadAppliesNewQuotasAndKeepsTheOldOnesOnError) {
  TempDir dir;
  std::unique_ptr<TestServer> server = StartWithQuotas(dir, "default buffers=1\n");
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>{1}));
  EXPECT_EQ(UploadArray(*alice, std::vector<int32_t>{2}).status().code(),
            absl::StatusCode::kResourceExhausted);

  dir.Write("quotas", "default buffers=1\ntenant alice buffers=3\n");
  ASSERT_OK(server->server().Reload());
  absl::StatusOr<v1::ServerInfo> info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().tenant_max_buffers(), 3u);
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>{2}));
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>{3}));
  EXPECT_EQ(UploadArray(*alice, std::vector<int32_t>{4}).status().code(),
            absl::StatusCode::kResourceExhausted);

  // A malformed file changes nothing; the error names its line.
  dir.Write("quotas", "default buffers=1\ntenant alice buffers=lots\n");
  const absl::Status bad = server->server().Reload();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("line 2"), std::string::npos) << bad;
  info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().tenant_max_buffers(), 3u);

  // A lowered quota keeps what is held and refuses more.
  dir.Write("quotas", "default buffers=1\n");
  ASSERT_OK(server->server().Reload());
  info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->tenant_buffer_count(), 3u);
  EXPECT_EQ(UploadArray(*alice, std::vector<int32_t>{5}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// A chain of `steps` increments of x (temporaries), then the sum of the last.
Chain Increments(int steps) {
  Chain chain;
  std::string last = chain.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), "s0");
  for (int k = 1; k < steps - 1; ++k) {
    last = chain.Add(Elementwise("s + 1", {{"s", BufferOperand(TagRef(last))}}),
                     absl::StrCat("s", k));
  }
  chain.Add(Reduce(v1::REDUCE_KIND_SUM, TagRef(last)), "sum");
  return chain;
}

TEST(QuotaTest, AChainCountsEachStepAgainstTheOperationsQuotaPlannedOrPrepared) {
  TempDir dir;
  std::unique_ptr<TestServer> server = StartWithQuotas(dir, "default operations=16\n");
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_OK(UploadArray(*alice, std::vector<double>{1, 2, 3}, {}, v1::LAYOUT_C, "x"));
  auto expect_refused = [&](const Chain& chain) {
    const Snapshot before = TakeSnapshot(*alice);
    absl::StatusOr<v1::ChainResponse> refused = chain.Run(*alice);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    // The first step past the quota is named.
    EXPECT_NE(refused.status().message().find("step 8 ('s8')"), std::string::npos)
        << refused.status();
    EXPECT_NE(refused.status().message().find("quota 'operations' of 8"), std::string::npos)
        << refused.status();
    EXPECT_EQ(TakeSnapshot(*alice), before);
  };
  // Ten steps fit a quota of 16; run three times, the chain runs prepared from the second.
  const Chain ten = Increments(10);
  for (int run = 0; run < 3; ++run) {
    absl::StatusOr<v1::ChainResponse> response = ten.Run(*alice);
    ASSERT_OK(response);
    ASSERT_EQ(response->steps(9).operation().values_size(), 1);
    EXPECT_EQ(response->steps(9).operation().values(0).float_value(), 1 + 2 + 3 + 3 * 9.0);
    const bool one_id =
        response->steps(0).operation().id() == response->steps(8).operation().id();
    EXPECT_EQ(one_id, run > 0) << run;
  }
  // Under a quota of 8, the prepared chain's ten steps are refused whole, as a planned
  // chain's are; so is another chain of ten.
  dir.Write("quotas", "default operations=8\n");
  ASSERT_OK(server->server().Reload());
  expect_refused(ten);
  expect_refused(Increments(11));
  // Eight fit.
  absl::StatusOr<v1::ChainResponse> eight = Increments(8).Run(*alice);
  ASSERT_OK(eight);
  EXPECT_EQ(eight->steps(7).operation().values(0).float_value(), 1 + 2 + 3 + 3 * 7.0);
}

TEST(QuotaTest, AnUploadUnderWayCountsAgainstDeviceBytes) {
  TempDir dir;
  std::unique_ptr<TestServer> server = StartWithQuotas(dir, "default device_bytes=1KiB\n");
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  std::unique_ptr<Client> bob = ConnectAs(*server, kBobToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);

  // 768 bytes declared, none sent: reserved, and charged to alice, from the header on.
  auto held = std::make_unique<HeldUpload>(server->RawChannel(), kAliceToken, 192);
  ASSERT_TRUE(held->ok());
  ASSERT_TRUE(InfoBecomes(
      *alice, [](const v1::ServerInfo& info) { return info.tenant_uploads_in_flight() == 1; }));
  absl::StatusOr<v1::ServerInfo> info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->tenant_memory_used_bytes(), 768u);
  EXPECT_EQ(info->tenant_buffer_count(), 0u);

  const absl::Status refused = UploadArray(*alice, std::vector<int32_t>(128, 1)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("quota 'device_bytes' of 1024 (768 bytes held, 512 more"),
            std::string::npos)
      << refused;
  // bob's bytes are his own.
  ASSERT_OK(UploadArray(*bob, std::vector<int32_t>(128, 2)));

  // Given up, the upload gives its bytes back, and the same request fits.
  EXPECT_EQ(held->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(InfoBecomes(*alice, [](const v1::ServerInfo& info) {
    return info.tenant_uploads_in_flight() == 0 && info.tenant_memory_used_bytes() == 0;
  }));
  absl::StatusOr<v1::BufferInfo> fits = UploadArray(*alice, std::vector<int32_t>(128, 1));
  ASSERT_OK(fits);
  ExpectValue(DownloadArray<int32_t>(*alice, fits->id()), std::vector<int32_t>(128, 1));
}

TEST(TenantAdmissionTest, PlacesAreBoundedPerTenantAndKindAndGivenBack) {
  TenantAdmission admission({.calls = 2, .uploads = 1});
  using Kind = TenantAdmission::Kind;
  absl::StatusOr<TenantAdmission::Ticket> a1 = admission.Admit(Kind::kCall, "alice");
  absl::StatusOr<TenantAdmission::Ticket> a2 = admission.Admit(Kind::kCall, "alice");
  ASSERT_OK(a1);
  ASSERT_OK(a2);
  const absl::StatusOr<TenantAdmission::Ticket> a3 = admission.Admit(Kind::kCall, "alice");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a3.status().message(),
            "tenant 'alice' has 2 calls in flight, the most --max-calls-per-tenant allows; "
            "wait for some to finish");
  // Another tenant, and another kind, have places of their own.
  ASSERT_OK(admission.Admit(Kind::kCall, "bob"));
  absl::StatusOr<TenantAdmission::Ticket> upload = admission.Admit(Kind::kUpload, "alice");
  ASSERT_OK(upload);
  const absl::Status second = admission.Admit(Kind::kUpload, "").status();
  ASSERT_OK(second);  // "" is a tenant of its own too
  EXPECT_EQ(admission.Admit(Kind::kUpload, "alice").status().message(),
            "tenant 'alice' has 1 uploads under way, the most --max-uploads-per-tenant "
            "allows; wait for some to finish");
  EXPECT_EQ(admission.InUse(Kind::kCall, "alice"), 2u);
  EXPECT_EQ(admission.InUse(Kind::kUpload, "alice"), 1u);

  // A copy of a ticket holds the same place; the last one to go gives it back.
  TenantAdmission::Ticket copy = *a1;
  a1->reset();
  EXPECT_EQ(admission.InUse(Kind::kCall, "alice"), 2u);
  copy.reset();
  EXPECT_EQ(admission.InUse(Kind::kCall, "alice"), 1u);
  ASSERT_OK(admission.Admit(Kind::kCall, "alice"));  // taken and given back at once
  EXPECT_EQ(admission.InUse(Kind::kCall, "alice"), 1u);

  TenantAdmission unbounded({});
  std::vector<TenantAdmission::Ticket> many;
  for (int i = 0; i < 1000; ++i) many.push_back(*unbounded.Admit(Kind::kCall, "alice"));
  EXPECT_EQ(unbounded.InUse(Kind::kCall, "alice"), 1000u);
  many.clear();
  EXPECT_EQ(unbounded.InUse(Kind::kCall, "alice"), 0u);
}

TEST(TenantAdmissionTest, OneTenantsUploadsReserveAtMostHalfTheMemoryAndOthersStillAllocate) {
  TempDir dir;
  const std::string tokens = dir.Write("tokens", kTokens);
  std::unique_ptr<TestServer> server = TestServer::StartWith(
      nullptr, 64 * kMiB, 1, [&](ServerOptions& o) { o.tokens_file = tokens; });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  std::unique_ptr<Client> bob = ConnectAs(*server, kBobToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  const Snapshot at_rest = TakeSnapshot(*alice);

  // A header that declares the whole memory limit reserves nothing: refused at once.
  HeldUpload whole(server->RawChannel(), kAliceToken, 16 * kMiB);  // int32: 64 MiB
  grpc::Status refused = whole.Close();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "tenant 'alice' has 0 bytes reserved by uploads under way; this upload's 67108864 "
            "more would pass the 33554432 bytes one tenant may reserve while others share the "
            "server (--max-reserved-fraction-per-tenant=0.5 of the memory limit); wait for "
            "those uploads to finish, or upload in parts");
  EXPECT_EQ(TakeSnapshot(*alice), at_rest);

  // 24 MiB fits, and is held; 12 MiB more would pass the bound.
  HeldUpload held(server->RawChannel(), kAliceToken, 6 * kMiB);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(InfoBecomes(
      *alice, [](const v1::ServerInfo& info) { return info.tenant_uploads_in_flight() == 1; }));
  const Snapshot holding = TakeSnapshot(*alice);
  HeldUpload more(server->RawChannel(), kAliceToken, 3 * kMiB);
  refused = more.Close();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("has 25165824 bytes reserved by uploads under way; "
                                         "this upload's 12582912 more would pass the 33554432"),
            std::string::npos)
      << refused.error_message();
  EXPECT_EQ(TakeSnapshot(*alice), holding);

  // bob allocates what alice's reservation leaves, while it is open.
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_FLOAT64);
  create.add_shape(4 * kMiB);  // 32 MiB
  absl::StatusOr<v1::BufferInfo> made = bob->CreateBuffer(create);
  ASSERT_OK(made);
  ASSERT_OK(bob->DeleteBuffer(made->id()));

  // Given up, alice's reservation goes, and the bound holds for what is left.
  EXPECT_EQ(held.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(InfoBecomes(*alice, [](const v1::ServerInfo& info) {
    return info.tenant_uploads_in_flight() == 0 && info.tenant_memory_used_bytes() == 0;
  }));
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>(8 * kMiB, 3)));  // 32 MiB, the bound
}

TEST(TenantAdmissionTest, CallsAndUploadsInFlightAreBoundedPerTenantEndToEnd) {
  TempDir dir;
  const std::string tokens = dir.Write("tokens", kTokens);
  std::unique_ptr<TestServer> server =
      TestServer::StartWith(nullptr, 64 * kMiB, 1, [&](ServerOptions& o) {
        o.tokens_file = tokens;
        o.max_calls_per_tenant = 3;
        o.max_uploads_per_tenant = 1;
      });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = ConnectAs(*server, kAliceToken);
  std::unique_ptr<Client> bob = ConnectAs(*server, kBobToken);
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  absl::StatusOr<v1::BufferInfo> kept = UploadArray(*alice, std::vector<int32_t>{4, 5, 6});
  ASSERT_OK(kept);
  absl::StatusOr<v1::ServerInfo> info = alice->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().tenant_max_calls_in_flight(), 3u);
  EXPECT_EQ(info->limits().tenant_max_uploads_in_flight(), 1u);
  // The upload's call ends just after its answer; then the GetServerInfo is the only one.
  EXPECT_TRUE(
      InfoBecomes(*alice, [](const v1::ServerInfo& i) { return i.tenant_calls_in_flight() == 1; }));

  const Snapshot at_rest = TakeSnapshot(*alice);
  // One upload held open is one upload and one call; a second upload is refused.
  auto held = std::make_unique<HeldUpload>(server->RawChannel(), kAliceToken, 4);
  ASSERT_TRUE(held->ok());
  ASSERT_TRUE(InfoBecomes(*alice, [](const v1::ServerInfo& i) {
    return i.tenant_uploads_in_flight() == 1 && i.tenant_calls_in_flight() == 2;
  }));
  const Snapshot before = TakeSnapshot(*alice);
  const absl::Status second = UploadArray(*alice, std::vector<int32_t>{7}).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_NE(second.message().find("tenant 'alice' has 1 uploads under way, the most "
                                  "--max-uploads-per-tenant allows"),
            std::string::npos)
      << second;
  EXPECT_EQ(TakeSnapshot(*alice), before);

  // Two sessions held open fill alice's three places: her next call is refused, bob's not.
  auto session = std::make_unique<HeldSession>(server->RawChannel(), kAliceToken);
  ASSERT_TRUE(InfoBecomes(*alice, [](const v1::ServerInfo& i) {
    return i.tenant_calls_in_flight() == 3;  // the upload, the session and this call
  }));
  // A session's call may reach the server after a GetServerInfo below has taken the
  // third place, and then it is refused: open another until alice's next call is. The
  // one that got the place holds it; the refused ones have ended.
  std::vector<std::unique_ptr<HeldSession>> sessions_too;
  ASSERT_TRUE(Eventually([&] {
    sessions_too.push_back(std::make_unique<HeldSession>(server->RawChannel(), kAliceToken));
    return alice->GetServerInfo().status().code() == absl::StatusCode::kResourceExhausted;
  }));
  const absl::Status full = alice->GetBuffer(kept->id()).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("tenant 'alice' has 3 calls in flight, the most "
                                "--max-calls-per-tenant allows"),
            std::string::npos)
      << full;
  ASSERT_OK(bob->GetServerInfo());
  ASSERT_OK(UploadArray(*bob, std::vector<int32_t>{8}));

  // The places come back as the calls end, and nothing of alice's changed meanwhile.
  sessions_too.clear();
  session.reset();
  held.reset();
  ASSERT_TRUE(InfoBecomes(*alice, [](const v1::ServerInfo& i) {
    return i.tenant_calls_in_flight() == 1 && i.tenant_uploads_in_flight() == 0;
  }));
  EXPECT_EQ(TakeSnapshot(*alice), at_rest);
  ExpectValue(DownloadArray<int32_t>(*alice, kept->id()), std::vector<int32_t>{4, 5, 6});
  ASSERT_OK(UploadArray(*alice, std::vector<int32_t>{9}));
}

// Without authentication: one tenant, every caller an admin, ids work across clients.
TEST(NoAuthenticationTest, OneTenantWhoseClientsShareIds) {
  std::unique_ptr<TestServer> server = TestServer::Start(64 * kMiB, 1);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> a = server->Connect("a");
  std::unique_ptr<Client> b = server->Connect("b");
  const std::vector<int32_t> values = {1, 2};
  absl::StatusOr<v1::BufferInfo> buffer = UploadArray(*a, values);
  ASSERT_OK(buffer);
  ExpectValue(DownloadArray<int32_t>(*b, buffer->id()), values);
  absl::StatusOr<v1::ServerInfo> info = b->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_FALSE(info->authentication_enabled());
  EXPECT_TRUE(info->admin());
  EXPECT_EQ(info->tenant(), "");
  EXPECT_EQ(info->buffer_count(), 1u);
  EXPECT_EQ(info->memory_used_bytes(), 8u);
}

}  // namespace
}  // namespace gpucompute::testing

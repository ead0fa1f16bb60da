// Hostile input through a real server: requests no honest client sends. Each gets its
// exact code and a bounded message that still says what was wrong, and changes nothing.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "server/service/proto_conversions.h"
#include "tests/support/test_server.h"
#include "tests/support/test_util.h"

namespace gpucompute::testing {
namespace {

using Code = absl::StatusCode;

// A string of `bytes` bytes that would break UTF-8 if cut anywhere but between its
// characters: three-byte characters throughout.
std::string LongUtf8(size_t bytes) {
  std::string s;
  while (s.size() + 3 <= bytes) s += "\xe2\x82\xac";  // the euro sign
  return s;
}

bool IsValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const size_t length = c < 0x80           ? 1
                          : (c >> 5) == 0x6  ? 2
                          : (c >> 4) == 0xE  ? 3
                          : (c >> 3) == 0x1E ? 4
                                             : 0;
    if (length == 0 || i + length > s.size()) return false;
    for (size_t j = 1; j < length; ++j) {
      if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("tester");
    ASSERT_NE(client_, nullptr);
    v1::CreateBufferRequest create;
    create.set_dtype(v1::DTYPE_FLOAT64);
    create.add_shape(4);
    create.set_name("kept");
    ASSERT_OK(client_->CreateBuffer(create));
  }

  // `status` has `code`, a message within the bound, valid UTF-8, that keeps the end of
  // what the server said (`reason`).
  static void ExpectBoundedError(const absl::Status& status, Code code, const std::string& reason) {
    EXPECT_EQ(status.code(), code) << status;
    const std::string message(status.message());
    EXPECT_LE(message.size(), kMaxErrorMessageBytes) << message.substr(0, 200);
    EXPECT_TRUE(IsValidUtf8(message)) << message.substr(0, 200);
    EXPECT_TRUE(absl::StrContains(message, reason)) << message;
    EXPECT_TRUE(absl::StrContains(message, "bytes left out")) << message;
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// A megabyte-long reference echoed back used to exceed the trailing metadata limit, so
// the caller saw RESOURCE_EXHAUSTED about metadata instead of NOT_FOUND.
TEST_F(HostileInputTest, LongReferencesAreNotFoundWithBoundedMessages) {
  const Snapshot before = TakeSnapshot(*client_);
  const std::string name = LongUtf8(1 << 20);

  ExpectBoundedError(client_->GetBuffer(name).status(), Code::kNotFound, "'");
  ExpectBoundedError(client_->DeleteBuffer(name), Code::kNotFound, "'");
  v1::DownloadRequest download;
  download.set_buffer(name);
  std::string data;
  ExpectBoundedError(client_->Download(download, &data).status(), Code::kNotFound, "'");
  v1::UploadHeader upload;
  upload.set_buffer(name);
  upload.set_size_bytes(8);
  const double value = 1;
  ExpectBoundedError(
      client_->Upload(upload, std::as_bytes(std::span<const double>(&value, 1))).status(),
      Code::kNotFound, "'");
  ExpectBoundedError(client_->DeleteStream(name), Code::kNotFound, name.substr(name.size() - 30));
  ExpectBoundedError(client_->GetOperation(name).status(), Code::kNotFound,
                     name.substr(name.size() - 30));
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(HostileInputTest, LongOperandsAndNamesInSubmitAreBounded) {
  const Snapshot before = TakeSnapshot(*client_);
  const std::string name = LongUtf8(200 << 10);
  absl::StatusOr<v1::Operation> op =
      client_->Submit(Elementwise("x + 1", {{"x", BufferOperand(name)}}));
  ExpectBoundedError(op.status(), Code::kNotFound, "'");

  // A 60 KiB expression that fails to parse at its very end: the position and the reason
  // survive.
  std::string expression = "x";
  while (expression.size() < (60 << 10)) expression += " + x";
  expression += " +";
  op = client_->Submit(Elementwise(expression, {{"x", BufferOperand("kept")}}));
  EXPECT_EQ(op.status().code(), Code::kInvalidArgument) << op.status();
  EXPECT_LE(op.status().message().size(), kMaxErrorMessageBytes);
  EXPECT_TRUE(absl::StrContains(op.status().message(), "position")) << op.status();
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

// The threads of this process (the server runs in it).
int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Every new client name gets a default stream, which cannot be deleted, and on the CPU
// backend each stream is a thread: 300 names used to make 315 threads. The server's
// stream bound takes idle default streams back instead.
TEST(HostileClientsTest, ManyClientNamesDoNotGrowStreamsOrThreads) {
  std::unique_ptr<TestServer> server = TestServer::StartWith(
      nullptr, 256 * kMiB, 2, [](ServerOptions& options) { options.max_streams = 8; });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> first = server->Connect("client-0");
  ASSERT_OK(
      first->Submit(Random(v1::DISTRIBUTION_UNIFORM, {16}, v1::DTYPE_FLOAT64, 1, NewOutput("r0"))));
  const int threads_before = ProcessThreads();
  for (int i = 1; i < 300; ++i) {
    std::unique_ptr<Client> client = server->Connect(absl::StrCat("client-", i));
    v1::SubmitRequest request = Elementwise("x * 2", {{"x", BufferOperand("r0")}});
    request.set_wait(true);
    // Buffers belong to their client: another client's name is unknown, which must not
    // stop it from getting (and giving back) a default stream.
    ASSERT_EQ(client->Submit(request).status().code(), Code::kNotFound) << i;
    request = Random(v1::DISTRIBUTION_UNIFORM, {4}, v1::DTYPE_FLOAT32, i);
    request.set_wait(true);
    ASSERT_OK(client->Submit(request)) << i;
    ASSERT_OK(client->GetServerInfo());
  }
  const int threads_after = ProcessThreads();
  // gRPC may add a few threads of its own under load; one per name would be 299.
  EXPECT_LE(threads_after, threads_before + 32) << "threads grew with client names";
  absl::StatusOr<v1::ServerInfo> info = first->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->limits().max_streams(), 8u);
}

TEST(BoundedErrorMessageTest, ShortMessagesAreUntouched) {
  EXPECT_EQ(BoundedErrorMessage("buffer 'x' not found"), "buffer 'x' not found");
  const std::string exact(kMaxErrorMessageBytes, 'a');
  EXPECT_EQ(BoundedErrorMessage(exact), exact);
}

TEST(BoundedErrorMessageTest, LongMessagesKeepBothEndsAndSayHowMuchIsGone) {
  const std::string message = "start " + std::string(5000, 'x') + " end";
  const std::string bounded = BoundedErrorMessage(message);
  EXPECT_LE(bounded.size(), kMaxErrorMessageBytes);
  EXPECT_TRUE(absl::StartsWith(bounded, "start xxx")) << bounded;
  EXPECT_TRUE(absl::EndsWith(bounded, "xxx end")) << bounded;
  const size_t head = bounded.find("... [");
  const size_t tail_start = bounded.find("] ...") + 5;
  const uint64_t left_out = std::stoull(bounded.substr(head + 5));
  EXPECT_EQ(head + left_out + (bounded.size() - tail_start), message.size()) << bounded;
}

TEST(BoundedErrorMessageTest, NeverSplitsACharacter) {
  for (size_t bytes : {1025, 1026, 1027, 3001, 3002}) {
    std::string message = "a" + LongUtf8(bytes);
    EXPECT_TRUE(IsValidUtf8(BoundedErrorMessage(message))) << bytes;
  }
}

}  // namespace
}  // namespace gpucompute::testing

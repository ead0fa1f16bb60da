// End-to-end tests of the request limits (--max-message-bytes, --max-dimensions,
// --max-elements, --max-expression-bytes, --max-expression-depth) over a real socket: a
// server started with low limits accepts a request at each limit, refuses one just past
// it with the code that really comes back and a message naming the limit, changes
// nothing when it refuses, and reports every limit in GetServerInfo.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "server/server.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using ::gpucompute::testing::DownloadArray;
using ::gpucompute::testing::Snapshot;
using ::gpucompute::testing::StatusOf;
using ::gpucompute::testing::TakeSnapshot;
using ::gpucompute::testing::TestServer;
using ::gpucompute::testing::UploadArray;
using Code = absl::StatusCode;

// The limits of the server under test, written out rather than derived from the code's
// constants: the smallest message bound (the clients' default 4 MiB chunk and 64 KiB of
// framing), so chunks of at most exactly 4 MiB.
constexpr uint64_t kMessageBytes = (uint64_t{4} << 20) + (uint64_t{64} << 10);
constexpr uint64_t kChunkBytes = uint64_t{4} << 20;
constexpr uint64_t kDimensions = 3;
constexpr uint64_t kElements = uint64_t{1} << 20;
constexpr uint64_t kExpressionBytes = 32;
constexpr uint64_t kExpressionDepth = 3;

v1::CreateBufferRequest Create(v1::DType dtype, const std::vector<uint64_t>& shape) {
  v1::CreateBufferRequest request;
  request.set_dtype(dtype);
  for (uint64_t d : shape) request.add_shape(d);
  return request;
}

v1::SubmitRequest Random(const std::vector<uint64_t>& shape) {
  v1::SubmitRequest request;
  request.set_wait(true);
  v1::RandomOp* random = request.mutable_random();
  random->set_distribution(v1::DISTRIBUTION_UNIFORM);
  random->mutable_output()->set_dtype(v1::DTYPE_FLOAT32);
  for (uint64_t d : shape) random->add_shape(d);
  return request;
}

v1::SubmitRequest Elementwise(const std::string& expression, const std::string& x) {
  v1::SubmitRequest request;
  request.set_wait(true);
  v1::ElementwiseOp* op = request.mutable_elementwise();
  op->set_expression(expression);
  (*op->mutable_inputs())["x"].set_buffer(x);
  return request;
}

// Expects `status` to be `code` with a message containing each of `parts`.
template <typename T>
void ExpectRefused(const T& result, Code code, const std::vector<std::string>& parts) {
  const absl::Status status = StatusOf(result);
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), absl::string_view::npos) << status << "\n" << part;
  }
}

class ServerLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::StartWith(nullptr, 256 * testing::kMiB, 2, [](ServerOptions& options) {
      options.measure_copy_ceiling = false;
      options.limits.max_message_bytes = kMessageBytes;
      options.limits.max_dimensions = kDimensions;
      options.limits.max_elements = kElements;
      options.limits.max_expression_bytes = kExpressionBytes;
      options.limits.max_expression_depth = kExpressionDepth;
    });
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect();
    ASSERT_NE(client_, nullptr);
  }

  // A float64 buffer of kElements values (8 MiB: two chunks at the limit), uploaded by
  // a client whose chunks are exactly the limit.
  v1::BufferInfo UploadLargest(const std::vector<double>& values) {
    std::unique_ptr<Client> client = server_->Connect("", kChunkBytes);
    absl::StatusOr<v1::BufferInfo> info = UploadArray(*client, values);
    EXPECT_OK(info);
    return info.value_or(v1::BufferInfo());
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServerLimitsTest, ServerInfoReportsTheConfiguredLimits) {
  ASSIGN_OR_FAIL(const v1::ServerInfo info, client_->GetServerInfo());
  const v1::Limits& limits = info.limits();
  EXPECT_EQ(limits.max_message_bytes(), kMessageBytes);
  EXPECT_EQ(limits.max_chunk_bytes(), kChunkBytes);
  EXPECT_EQ(limits.max_dimensions(), kDimensions);
  EXPECT_EQ(limits.max_elements(), kElements);
  EXPECT_EQ(limits.max_expression_bytes(), kExpressionBytes);
  EXPECT_EQ(limits.max_expression_depth(), kExpressionDepth);
}

TEST(ServerLimitsDefaultsTest, ServerInfoReportsTheDefaults) {
  std::unique_ptr<TestServer> server = TestServer::StartWith(
      nullptr, 256 * testing::kMiB, 2,
      [](ServerOptions& options) { options.measure_copy_ceiling = false; });
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->Connect();
  ASSERT_NE(client, nullptr);
  ASSIGN_OR_FAIL(const v1::ServerInfo info, client->GetServerInfo());
  const v1::Limits& limits = info.limits();
  EXPECT_EQ(limits.max_message_bytes(), uint64_t{64} << 20);
  EXPECT_EQ(limits.max_chunk_bytes(), (uint64_t{64} << 20) - (uint64_t{64} << 10));
  EXPECT_EQ(limits.max_dimensions(), 8u);
  EXPECT_EQ(limits.max_elements(), uint64_t{1} << 40);
  EXPECT_EQ(limits.max_expression_bytes(), 65536u);
  EXPECT_EQ(limits.max_expression_depth(), 256u);
}

TEST(ServerLimitsDefaultsTest, StartRefusesLimitsOutsideTheirRanges) {
  struct Case {
    void (*set)(RequestLimits&);
    std::string message;
  };
  const Case cases[] = {
      {[](RequestLimits& l) { l.max_message_bytes = uint64_t{1} << 20; },
       "--max-message-bytes: must be from 4259840 to 67108864, not 1048576"},
      {[](RequestLimits& l) { l.max_message_bytes = (uint64_t{64} << 20) + 1; },
       "--max-message-bytes: must be from 4259840 to 67108864, not 67108865"},
      {[](RequestLimits& l) { l.max_dimensions = 0; },
       "--max-dimensions: must be from 1 to 8, not 0"},
      {[](RequestLimits& l) { l.max_dimensions = 9; },
       "--max-dimensions: must be from 1 to 8, not 9"},
      {[](RequestLimits& l) { l.max_elements = 0; },
       "--max-elements: must be from 1 to 281474976710656, not 0"},
      {[](RequestLimits& l) { l.max_expression_bytes = 65537; },
       "--max-expression-bytes: must be from 1 to 65536, not 65537"},
      {[](RequestLimits& l) { l.max_expression_depth = 257; },
       "--max-expression-depth: must be from 1 to 256, not 257"},
  };
  for (const Case& c : cases) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.cpu_threads = 1;
    options.measure_copy_ceiling = false;
    c.set(options.limits);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_EQ(server.status().code(), Code::kInvalidArgument) << c.message;
    EXPECT_EQ(server.status().message(), c.message);
  }
}

TEST_F(ServerLimitsTest, BuffersWithMoreDimensionsThanTheLimitAreRefused) {
  ASSIGN_OR_FAIL(const v1::BufferInfo at_limit,
                 client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {2, 3, 4})));
  EXPECT_EQ(at_limit.shape_size(), 3);
  ASSIGN_OR_FAIL(const v1::Operation random, client_->Submit(Random({2, 2, 2})));
  EXPECT_EQ(random.state(), v1::Operation::STATE_SUCCEEDED) << random.error_message();

  const Snapshot before = TakeSnapshot(*client_);
  const std::vector<std::string> names = {"has 4 dimensions", "at most 3 (--max-dimensions)"};
  ExpectRefused(client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {2, 3, 4, 1})),
                Code::kInvalidArgument, names);
  v1::UploadHeader header;
  *header.mutable_create() = Create(v1::DTYPE_FLOAT64, {1, 1, 1, 1});
  const double one = 1;
  ExpectRefused(client_->Upload(header, std::as_bytes(std::span<const double>(&one, 1))),
                Code::kInvalidArgument, names);
  ExpectRefused(client_->Submit(Random({2, 2, 2, 2})), Code::kInvalidArgument, names);
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerLimitsTest, BuffersWithMoreElementsThanTheLimitAreRefused) {
  // 2^20 elements, as one dimension or several; an empty array may have 2^20 in its
  // other dimensions.
  EXPECT_OK(client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {1024, 1024})));
  EXPECT_OK(client_->CreateBuffer(Create(v1::DTYPE_BOOL, {kElements})));
  EXPECT_OK(client_->CreateBuffer(Create(v1::DTYPE_FLOAT64, {0, 1024, 1024})));
  ASSIGN_OR_FAIL(const v1::Operation random, client_->Submit(Random({kElements})));
  EXPECT_EQ(random.state(), v1::Operation::STATE_SUCCEEDED) << random.error_message();

  const Snapshot before = TakeSnapshot(*client_);
  const std::string limit = "at most 1048576 (--max-elements)";
  ExpectRefused(client_->CreateBuffer(Create(v1::DTYPE_BOOL, {kElements + 1})),
                Code::kInvalidArgument, {"shape [1048577] has more than 1048576 elements", limit});
  ExpectRefused(client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {1024, 1025})),
                Code::kInvalidArgument, {limit});
  // Empty, yet its extents multiply past the limit: refused before anything else.
  ExpectRefused(client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {0, 1024, 1025})),
                Code::kInvalidArgument, {"not counting its empty dimensions", limit});
  ExpectRefused(client_->CreateBuffer(Create(v1::DTYPE_FLOAT32, {0, uint64_t{1} << 62})),
                Code::kInvalidArgument, {limit});
  ExpectRefused(client_->Submit(Random({kElements + 1})), Code::kInvalidArgument, {limit});
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerLimitsTest, ExpressionsLongerThanTheLimitAreRefused) {
  ASSIGN_OR_FAIL(const v1::BufferInfo x,
                 UploadArray<double>(*client_, {1, 2, 3, 4}));
  std::string expression = "(x + 1) * 2";
  expression.resize(kExpressionBytes, ' ');  // spaces are part of the length
  ASSIGN_OR_FAIL(const v1::Operation op, client_->Submit(Elementwise(expression, x.id())));
  ASSERT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << op.error_message();
  ASSIGN_OR_FAIL(const std::vector<double> y, DownloadArray<double>(*client_, op.outputs(0).id()));
  EXPECT_EQ(y, (std::vector<double>{4, 6, 8, 10}));

  const Snapshot before = TakeSnapshot(*client_);
  ExpectRefused(client_->Submit(Elementwise(expression + " ", x.id())), Code::kInvalidArgument,
                {"expression is 33 bytes", "at most 32 (--max-expression-bytes)"});
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerLimitsTest, ExpressionsNestedDeeperThanTheLimitAreRefused) {
  ASSIGN_OR_FAIL(const v1::BufferInfo x,
                 UploadArray<double>(*client_, {1, -2, 3}));
  // Unary minus, parenthesis, unary minus: three levels.
  ASSIGN_OR_FAIL(const v1::Operation op, client_->Submit(Elementwise("-(-x) + 1", x.id())));
  ASSERT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << op.error_message();
  ASSIGN_OR_FAIL(const std::vector<double> y, DownloadArray<double>(*client_, op.outputs(0).id()));
  EXPECT_EQ(y, (std::vector<double>{2, -1, 4}));

  const Snapshot before = TakeSnapshot(*client_);
  const std::vector<std::string> names = {"nested more than 3 levels deep",
                                          "--max-expression-depth"};
  ExpectRefused(client_->Submit(Elementwise("-(-(x))", x.id())), Code::kInvalidArgument, names);
  ExpectRefused(client_->Submit(Elementwise("abs(abs(abs(abs(x))))", x.id())),
                Code::kInvalidArgument, names);
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerLimitsTest, ChainsAreHeldToTheSameLimits) {
  ASSIGN_OR_FAIL(const v1::BufferInfo x, UploadArray<double>(*client_, {1, 2}));
  Chain good;
  good.Keep(good.Add(Elementwise("-(-x)", x.id())));
  ASSIGN_OR_FAIL(const v1::ChainResponse done, good.Run(*client_));
  ASSERT_EQ(done.steps_size(), 1);
  EXPECT_EQ(done.steps(0).operation().state(), v1::Operation::STATE_SUCCEEDED);

  const Snapshot before = TakeSnapshot(*client_);
  Chain deep;
  deep.Add(Elementwise("x + 1", x.id()));
  deep.Add(Elementwise("-(-(x))", x.id()));
  ExpectRefused(deep.Run(*client_), Code::kInvalidArgument, {"--max-expression-depth"});
  Chain wide;
  wide.Add(Random({2, 2, 2, 2}));
  ExpectRefused(wide.Run(*client_), Code::kInvalidArgument, {"--max-dimensions"});
  Chain large;
  large.Add(Random({kElements + 1}));
  ExpectRefused(large.Run(*client_), Code::kInvalidArgument, {"--max-elements"});
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

class ServerMessageLimitTest : public ServerLimitsTest {
 protected:
  // An upload of a float64 buffer of kElements values, sending `chunk` after the header
  // (8 MiB expected), on a channel that itself sends messages of any size.
  grpc::Status UploadOneChunk(std::string chunk) {
    std::unique_ptr<v1::BufferService::Stub> stub =
        v1::BufferService::NewStub(server_->RawChannel());
    grpc::ClientContext context;
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        stub->Upload(&context, &response);
    v1::UploadRequest header;
    *header.mutable_header()->mutable_create() = Create(v1::DTYPE_FLOAT64, {kElements});
    if (writer->Write(header)) {
      v1::UploadRequest request;
      request.set_chunk(std::move(chunk));
      if (writer->Write(request)) writer->WritesDone();
    }
    return writer->Finish();
  }
};

TEST_F(ServerMessageLimitTest, UploadChunksAtTheChunkLimitAreAccepted) {
  const std::vector<double> values = testing::RandomDoubles(kElements, -1, 1, 7);
  const v1::BufferInfo info = UploadLargest(values);
  ASSERT_FALSE(info.id().empty());
  ASSIGN_OR_FAIL(const std::vector<double> back, DownloadArray<double>(*client_, info.id()));
  EXPECT_EQ(back, values);
}

TEST_F(ServerMessageLimitTest, AChunkPastTheChunkLimitIsRefused) {
  const Snapshot before = TakeSnapshot(*client_);
  // It fits a message, so gRPC lets it through; the server refuses it itself.
  ExpectRefused(UploadOneChunk(std::string(kChunkBytes + 1, 'a')), Code::kInvalidArgument,
                {"chunk of 4194305 bytes", "max_chunk_bytes of 4194304", "--max-message-bytes"});
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerMessageLimitTest, AMessagePastTheMessageLimitIsRefusedByGrpc) {
  const Snapshot before = TakeSnapshot(*client_);
  // The chunk alone is the limit; with its framing the message is larger.
  ExpectRefused(UploadOneChunk(std::string(kMessageBytes, 'a')), Code::kResourceExhausted, {});
  // A client that was not told of the smaller limit sends one 8 MiB chunk.
  const std::vector<double> values(kElements, 0.5);
  std::unique_ptr<Client> unaware = server_->Connect("", kMaxChunkBytes);
  ExpectRefused(UploadArray(*unaware, values), Code::kResourceExhausted, {});
  // gRPC answers the client before the server's handler has seen the stream end and
  // freed what the upload's header reserved.
  testing::WaitForMemoryUsed(*client_, before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerMessageLimitTest, DownloadsAreCutToTheChunkLimit) {
  const std::vector<double> values = testing::RandomDoubles(kElements, -1, 1, 11);
  const v1::BufferInfo info = UploadLargest(values);
  ASSERT_FALSE(info.id().empty());
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server_->RawChannel());
  grpc::ClientContext context;
  v1::DownloadRequest request;
  request.set_buffer(info.id());
  request.set_chunk_bytes(8 << 20);  // the whole buffer, were it allowed
  std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
      stub->Download(&context, request);
  std::vector<size_t> sizes;
  std::string data;
  for (v1::DownloadResponse message; reader->Read(&message);) {
    sizes.push_back(message.data().size());
    data += message.data();
  }
  ASSERT_OK(reader->Finish());
  EXPECT_EQ(sizes, (std::vector<size_t>{kChunkBytes, kChunkBytes}));
  ASSERT_EQ(data.size(), values.size() * sizeof(double));
  EXPECT_EQ(std::memcmp(data.data(), values.data(), data.size()), 0);
}

}  // namespace
}  // namespace gpucompute

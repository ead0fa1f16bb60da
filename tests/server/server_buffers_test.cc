// End-to-end tests of BufferService and ServerService: a real in-process server (CPU
// backend) on a loopback port, driven over a real socket through the client library,
// and through raw stubs for requests the library would never send.
//
// Every expected value is computed here, independently of the server: fill values are
// converted with static_cast in the test, uploaded bytes come from a seeded generator,
// and a rejected request is followed by a check that nothing else changed (the
// client's listing, the server's memory and buffer count, and the bytes of any buffer
// the request named).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::gpucompute::testing::AsBytes;
using ::gpucompute::testing::DownloadArray;
using ::gpucompute::testing::DownloadBytes;
using ::gpucompute::testing::kGiB;
using ::gpucompute::testing::kMiB;
using ::gpucompute::testing::MemoryUsed;
using ::gpucompute::testing::Snapshot;
using ::gpucompute::testing::TakeSnapshot;
using ::gpucompute::testing::TestBackendName;
using ::gpucompute::testing::TestServer;
using ::gpucompute::testing::WaitForMemoryUsed;
using Code = absl::StatusCode;

// The code the server gives for a byte range outside a buffer (Upload and Download):
// INVALID_ARGUMENT, as the errors paragraph of gpucompute.proto promises.
constexpr Code kRangeError = Code::kInvalidArgument;

// ---------------------------------------------------------------------------
// Helpers

std::string ToString(std::string_view s) { return std::string(s.data(), s.size()); }

// The bytes of `value` as the server stores it (native little-endian layout).
template <typename T>
std::string BytesOf(T value) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

std::string Repeat(const std::string& element, uint64_t count) {
  std::string out;
  out.reserve(element.size() * count);
  for (uint64_t i = 0; i < count; ++i) out += element;
  return out;
}

// `n` bytes from a seeded generator; with `bool_values` each byte is 0 or 1.
std::string RandomBytes(uint64_t n, uint64_t seed, bool bool_values = false) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    out[i] = static_cast<char>(bool_values ? (r >> 17) & 1 : (r >> 17) & 0xff);
  }
  return out;
}

uint64_t ItemSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_BOOL:
      return 1;
    default:
      ADD_FAILURE() << "no itemsize for dtype " << dtype;
      return 0;
  }
}

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

v1::Scalar FloatScalar(double v) {
  v1::Scalar s;
  s.set_float_value(v);
  return s;
}
v1::Scalar IntScalar(int64_t v) {
  v1::Scalar s;
  s.set_int_value(v);
  return s;
}
v1::Scalar BoolScalar(bool v) {
  v1::Scalar s;
  s.set_bool_value(v);
  return s;
}

v1::CreateBufferRequest CreateRequest(v1::DType dtype, const std::vector<uint64_t>& shape,
                                      std::string_view name = {},
                                      std::optional<v1::Scalar> fill = std::nullopt,
                                      v1::Layout layout = v1::LAYOUT_UNSPECIFIED) {
  v1::CreateBufferRequest request;
  request.set_dtype(dtype);
  for (uint64_t d : shape) request.add_shape(d);
  request.set_layout(layout);
  request.set_name(ToString(name));
  if (fill.has_value()) *request.mutable_fill() = *fill;
  return request;
}

v1::UploadHeader CreateHeader(v1::DType dtype, const std::vector<uint64_t>& shape,
                              std::string_view name = {}) {
  v1::UploadHeader header;
  *header.mutable_create() = CreateRequest(dtype, shape, name);
  return header;
}

v1::UploadHeader RangeHeader(std::string_view buffer, uint64_t offset, uint64_t size = 0) {
  v1::UploadHeader header;
  header.set_buffer(ToString(buffer));
  header.set_offset_bytes(offset);
  header.set_size_bytes(size);
  return header;
}

v1::UploadRequest HeaderMessage(const v1::UploadHeader& header) {
  v1::UploadRequest request;
  *request.mutable_header() = header;
  return request;
}

v1::UploadRequest ChunkMessage(std::string bytes) {
  v1::UploadRequest request;
  request.set_chunk(std::move(bytes));
  return request;
}

bool IsBufferId(const std::string& id) {
  if (id.size() != 4 + 32 || id.rfind("buf-", 0) != 0) return false;
  return std::all_of(id.begin() + 4, id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string MustDownloadFrom(Client& client, std::string_view buffer) {
  absl::StatusOr<std::string> data = DownloadBytes(client, buffer);
  EXPECT_OK(data) << " downloading " << buffer;
  return data.ok() ? *data : std::string();
}

std::unique_ptr<grpc::ClientContext> RawContext(const std::string& client_name = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!client_name.empty()) context->AddMetadata("gpucompute-client", client_name);
  return context;
}

// Sends `messages` on a raw Upload stream, half-closes it and returns the status.
grpc::Status RawUpload(const TestServer& server, const std::vector<v1::UploadRequest>& messages,
                       const std::string& client_name = "") {
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server.RawChannel());
  std::unique_ptr<grpc::ClientContext> context = RawContext(client_name);
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      stub->Upload(context.get(), &response);
  for (const v1::UploadRequest& m : messages) {
    // False once the server has finished the call (it may reject early).
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

Code GrpcCode(const grpc::Status& s) { return static_cast<Code>(s.error_code()); }

// ---------------------------------------------------------------------------
// Fixture: one server per test, so memory, listings and stats start from zero.

class ServerBuffersTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kLimit = 256 * kMiB;

  void SetUp() override {
    server_ = TestServer::Start(kLimit, 2);
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("tester");
    ASSERT_NE(client_, nullptr);
  }

  // Creates a buffer and asserts success.
  v1::BufferInfo MustCreate(Client& client, const v1::CreateBufferRequest& request) {
    absl::StatusOr<v1::BufferInfo> info = client.CreateBuffer(request);
    EXPECT_OK(info) << " for " << request.ShortDebugString();
    return info.ok() ? *info : v1::BufferInfo();
  }

  // Uploads `data` into a new buffer and asserts success.
  v1::BufferInfo MustUploadNew(Client& client, v1::DType dtype, const std::vector<uint64_t>& shape,
                               const std::string& data, std::string_view name = {}) {
    absl::StatusOr<v1::UploadResponse> response =
        client.Upload(CreateHeader(dtype, shape, name), AsBytes(data));
    EXPECT_OK(response);
    return response.ok() ? response->buffer() : v1::BufferInfo();
  }

  std::string MustDownload(Client& client, std::string_view buffer, uint64_t offset = 0,
                           uint64_t size = 0) {
    absl::StatusOr<std::string> data = DownloadBytes(client, buffer, offset, size);
    EXPECT_OK(data) << " downloading " << buffer;
    return data.ok() ? *data : std::string();
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// ---------------------------------------------------------------------------
// 1. CreateBuffer, names, GetBuffer, ListBuffers, DeleteBuffer

// Every dtype, 0-d, 1-d, 2-d C and F, and empty shapes, filled with a value whose
// bytes the test computes by converting the value itself.
TEST_F(ServerBuffersTest, CreateBufferFillsEveryDtypeAndShape) {
  struct FillCase {
    v1::DType dtype;
    v1::Scalar fill;
    std::string element;  // the expected bytes of one element
  };
  const std::vector<FillCase> fills = {
      {v1::DTYPE_FLOAT32, FloatScalar(-2.5), BytesOf<float>(-2.5f)},
      {v1::DTYPE_FLOAT32, FloatScalar(0.1), BytesOf<float>(static_cast<float>(0.1))},
      {v1::DTYPE_FLOAT32, IntScalar(7), BytesOf<float>(7.0f)},
      {v1::DTYPE_FLOAT32, BoolScalar(true), BytesOf<float>(1.0f)},
      {v1::DTYPE_FLOAT64, FloatScalar(0.1), BytesOf<double>(0.1)},
      {v1::DTYPE_FLOAT64, IntScalar(-(int64_t{1} << 53)), BytesOf<double>(-9007199254740992.0)},
      {v1::DTYPE_INT32, IntScalar(-123456), BytesOf<int32_t>(-123456)},
      {v1::DTYPE_INT32, FloatScalar(3.0), BytesOf<int32_t>(3)},
      {v1::DTYPE_INT32, IntScalar(std::numeric_limits<int32_t>::min()),
       BytesOf<int32_t>(std::numeric_limits<int32_t>::min())},
      {v1::DTYPE_INT32, IntScalar(std::numeric_limits<int32_t>::max()),
       BytesOf<int32_t>(std::numeric_limits<int32_t>::max())},
      {v1::DTYPE_INT64, IntScalar((int64_t{1} << 40) + 3),
       BytesOf<int64_t>((int64_t{1} << 40) + 3)},
      {v1::DTYPE_INT64, IntScalar(std::numeric_limits<int64_t>::min()),
       BytesOf<int64_t>(std::numeric_limits<int64_t>::min())},
      {v1::DTYPE_INT64, FloatScalar(-4096.0), BytesOf<int64_t>(-4096)},
      {v1::DTYPE_BOOL, BoolScalar(true), std::string(1, '\x01')},
      {v1::DTYPE_BOOL, BoolScalar(false), std::string(1, '\x00')},
      {v1::DTYPE_BOOL, IntScalar(1), std::string(1, '\x01')},
  };
  struct ShapeCase {
    std::vector<uint64_t> shape;
    v1::Layout layout;
  };
  const std::vector<ShapeCase> shapes = {
      {{}, v1::LAYOUT_UNSPECIFIED},  // 0-d: one element
      {{5}, v1::LAYOUT_C},          {{2, 3}, v1::LAYOUT_C},           {{2, 3}, v1::LAYOUT_F},
      {{3, 1, 4}, v1::LAYOUT_F},    {{2, 3}, v1::LAYOUT_UNSPECIFIED},  // C by default
      {{0}, v1::LAYOUT_C},                                             // empty
      {{3, 0}, v1::LAYOUT_F},                                          // empty 2-d
  };
  std::set<std::string> ids;
  uint64_t expected_used = 0;
  for (const FillCase& f : fills) {
    for (const ShapeCase& sc : shapes) {
      SCOPED_TRACE(absl::StrCat(v1::DType_Name(f.dtype), " fill ", f.fill.ShortDebugString(),
                                " shape ", sc.shape.size(), "-d (", Elements(sc.shape),
                                " elements) layout ", v1::Layout_Name(sc.layout)));
      const int64_t before = NowUnixNanos();
      v1::BufferInfo info =
          MustCreate(*client_, CreateRequest(f.dtype, sc.shape, {}, f.fill, sc.layout));
      const int64_t after = NowUnixNanos();
      const uint64_t n = Elements(sc.shape);
      const uint64_t size = n * ItemSize(f.dtype);
      EXPECT_TRUE(IsBufferId(info.id())) << info.id();
      EXPECT_TRUE(ids.insert(info.id()).second) << "duplicate id " << info.id();
      EXPECT_EQ(info.name(), "");
      EXPECT_EQ(info.dtype(), f.dtype);
      EXPECT_EQ(std::vector<uint64_t>(info.shape().begin(), info.shape().end()), sc.shape);
      if (sc.shape.size() >= 2) {
        EXPECT_EQ(info.layout(), sc.layout == v1::LAYOUT_F ? v1::LAYOUT_F : v1::LAYOUT_C);
      }
      EXPECT_EQ(info.size_bytes(), size);
      EXPECT_EQ(info.device(), 0);
      EXPECT_GE(info.create_time_unix_nanos(), before);
      EXPECT_LE(info.create_time_unix_nanos(), after);
      expected_used += size;

      v1::DownloadRequest request;
      request.set_buffer(info.id());
      std::string data;
      absl::StatusOr<v1::DownloadResponse> response = client_->Download(request, &data);
      ASSERT_OK(response);
      EXPECT_TRUE(MessageDifferencer::Equals(response->buffer(), info))
          << response->buffer().ShortDebugString() << " vs " << info.ShortDebugString();
      EXPECT_EQ(data, Repeat(f.element, n));
    }
  }
  absl::StatusOr<v1::ServerInfo> server_info = client_->GetServerInfo();
  ASSERT_OK(server_info);
  EXPECT_EQ(server_info->memory_used_bytes(), expected_used);
  EXPECT_EQ(server_info->buffer_count(), fills.size() * shapes.size());
}

// A fill value that the dtype cannot hold exactly is INVALID_ARGUMENT and creates no
// buffer: the listing, the memory and the name are as before, and the name stays free.
TEST_F(ServerBuffersTest, CreateBufferRejectsFillThatDoesNotFit) {
  MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {4}, "existing", IntScalar(1)));
  struct BadFill {
    v1::DType dtype;
    v1::Scalar fill;
  };
  v1::Scalar no_value;  // a Scalar with no member of the oneof set
  const std::vector<BadFill> cases = {
      {v1::DTYPE_INT32, FloatScalar(1.5)},
      {v1::DTYPE_INT32, IntScalar(int64_t{1} << 40)},
      {v1::DTYPE_INT32, FloatScalar(std::ldexp(1.0, 40))},
      {v1::DTYPE_INT32, IntScalar(int64_t{std::numeric_limits<int32_t>::max()} + 1)},
      {v1::DTYPE_INT32, IntScalar(int64_t{std::numeric_limits<int32_t>::min()} - 1)},
      {v1::DTYPE_INT32, FloatScalar(std::numeric_limits<double>::infinity())},
      {v1::DTYPE_INT64, FloatScalar(std::numeric_limits<double>::quiet_NaN())},
      {v1::DTYPE_INT64, FloatScalar(1e19)},
      {v1::DTYPE_INT64, FloatScalar(-0.5)},
      {v1::DTYPE_BOOL, IntScalar(2)},
      {v1::DTYPE_BOOL, FloatScalar(0.5)},
      {v1::DTYPE_FLOAT32, no_value},
  };
  const Snapshot before = TakeSnapshot(*client_);
  for (const BadFill& c : cases) {
    SCOPED_TRACE(absl::StrCat(v1::DType_Name(c.dtype), " fill ", c.fill.ShortDebugString()));
    absl::StatusOr<v1::BufferInfo> info =
        client_->CreateBuffer(CreateRequest(c.dtype, {1024}, "victim", c.fill));
    EXPECT_EQ(info.status().code(), Code::kInvalidArgument) << info.status();
    EXPECT_EQ(TakeSnapshot(*client_), before);
    EXPECT_EQ(client_->GetBuffer("victim").status().code(), Code::kNotFound);
  }
  // The name was never taken.
  v1::BufferInfo ok =
      MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {2}, "victim", IntScalar(5)));
  EXPECT_EQ(MustDownload(*client_, "victim"), Repeat(BytesOf<int32_t>(5), 2));
}

// Names are unique per client: a duplicate is ALREADY_EXISTS and leaves the first
// buffer as it was; another client may use the same name; "buf-" is reserved.
TEST_F(ServerBuffersTest, CreateBufferNamesAreUniquePerClient) {
  v1::BufferInfo first =
      MustCreate(*client_, CreateRequest(v1::DTYPE_FLOAT64, {3}, "weights", FloatScalar(2.0)));
  EXPECT_EQ(first.name(), "weights");

  const Snapshot before = TakeSnapshot(*client_);
  absl::StatusOr<v1::BufferInfo> dup =
      client_->CreateBuffer(CreateRequest(v1::DTYPE_INT32, {100}, "weights", IntScalar(9)));
  EXPECT_EQ(dup.status().code(), Code::kAlreadyExists) << dup.status();
  // Without a fill as well, and through an upload that would create it.
  dup = client_->CreateBuffer(CreateRequest(v1::DTYPE_INT32, {100}, "weights"));
  EXPECT_EQ(dup.status().code(), Code::kAlreadyExists) << dup.status();
  absl::StatusOr<v1::UploadResponse> dup_upload = client_->Upload(
      CreateHeader(v1::DTYPE_BOOL, {3}, "weights"), AsBytes(std::string("\x01\x00\x01", 3)));
  EXPECT_EQ(dup_upload.status().code(), Code::kAlreadyExists) << dup_upload.status();
  EXPECT_EQ(TakeSnapshot(*client_), before);
  absl::StatusOr<v1::BufferInfo> still = client_->GetBuffer("weights");
  ASSERT_OK(still);
  EXPECT_TRUE(MessageDifferencer::Equals(*still, first));
  EXPECT_EQ(MustDownload(*client_, "weights"), Repeat(BytesOf<double>(2.0), 3));

  // The same name under another client is another buffer.
  std::unique_ptr<Client> other = server_->Connect("other");
  ASSERT_NE(other, nullptr);
  v1::BufferInfo theirs =
      MustCreate(*other, CreateRequest(v1::DTYPE_INT32, {2}, "weights", IntScalar(-1)));
  EXPECT_NE(theirs.id(), first.id());
  EXPECT_EQ(MustDownload(*other, "weights"), Repeat(BytesOf<int32_t>(-1), 2));
  EXPECT_EQ(MustDownload(*client_, "weights"), Repeat(BytesOf<double>(2.0), 3));

  // Names that look like ids, and other malformed names.
  const Snapshot before_bad = TakeSnapshot(*client_);
  for (const std::string& bad : {std::string("buf-"), std::string("buf-weights"),
                                 std::string("buf-0123456789abcdef0123456789abcdef"),
                                 std::string(257, 'n'), std::string("tab\there")}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<v1::BufferInfo> r =
        client_->CreateBuffer(CreateRequest(v1::DTYPE_INT32, {1}, bad));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    absl::StatusOr<v1::UploadResponse> u =
        client_->Upload(CreateHeader(v1::DTYPE_INT32, {1}, bad), AsBytes(BytesOf<int32_t>(1)));
    EXPECT_EQ(u.status().code(), Code::kInvalidArgument) << u.status();
    EXPECT_EQ(TakeSnapshot(*client_), before_bad);
  }
  // Close relatives of the reserved prefix are ordinary names.
  for (const std::string& fine :
       {std::string("buf"), std::string("Buf-x"), std::string("my-buf-1"), std::string(256, 'n')}) {
    v1::BufferInfo info =
        MustCreate(*client_, CreateRequest(v1::DTYPE_BOOL, {1}, fine, BoolScalar(true)));
    EXPECT_EQ(info.name(), fine);
    absl::StatusOr<v1::BufferInfo> by_name = client_->GetBuffer(fine);
    ASSERT_OK(by_name);
    EXPECT_EQ(by_name->id(), info.id());
  }
}

// GetBuffer by id and by name describe the same buffer; unknown ones are NOT_FOUND.
TEST_F(ServerBuffersTest, GetBufferByIdAndByName) {
  v1::BufferInfo created = MustCreate(
      *client_, CreateRequest(v1::DTYPE_FLOAT32, {4, 5}, "matrix", FloatScalar(1.0), v1::LAYOUT_F));
  absl::StatusOr<v1::BufferInfo> by_id = client_->GetBuffer(created.id());
  absl::StatusOr<v1::BufferInfo> by_name = client_->GetBuffer("matrix");
  ASSERT_OK(by_id);
  ASSERT_OK(by_name);
  EXPECT_TRUE(MessageDifferencer::Equals(*by_id, created)) << by_id->ShortDebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(*by_name, created)) << by_name->ShortDebugString();
  EXPECT_EQ(created.layout(), v1::LAYOUT_F);
  EXPECT_EQ(created.size_bytes(), 4u * 5u * 4u);

  EXPECT_EQ(client_->GetBuffer("matrix2").status().code(), Code::kNotFound);
  // A well-formed id that was never issued.
  EXPECT_EQ(client_->GetBuffer("buf-00000000000000000000000000000000").status().code(),
            Code::kNotFound);
  EXPECT_EQ(client_->GetBuffer("").status().code(), Code::kInvalidArgument);
}

// ListBuffers: the caller's buffers only, oldest first, with their total size.
TEST_F(ServerBuffersTest, ListBuffersSortedByCreationWithTotal) {
  std::unique_ptr<Client> other = server_->Connect("other");
  ASSERT_NE(other, nullptr);
  absl::StatusOr<v1::ListBuffersResponse> empty = client_->ListBuffers();
  ASSERT_OK(empty);
  EXPECT_EQ(empty->buffers_size(), 0);
  EXPECT_EQ(empty->total_bytes(), 0u);

  const std::vector<std::pair<v1::DType, std::vector<uint64_t>>> specs = {
      {v1::DTYPE_INT64, {10}},  {v1::DTYPE_BOOL, {3, 3}},  {v1::DTYPE_FLOAT32, {}},
      {v1::DTYPE_FLOAT64, {0}}, {v1::DTYPE_INT32, {7, 2}}, {v1::DTYPE_FLOAT32, {1000}}};
  std::vector<v1::BufferInfo> mine;
  uint64_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [dtype, shape] = specs[i];
    // Interleave another client's buffers, which must not be listed.
    MustCreate(*other, CreateRequest(v1::DTYPE_INT32, {16}));
    if (i % 2 == 0) {
      mine.push_back(MustCreate(*client_, CreateRequest(dtype, shape, absl::StrCat("b", i))));
    } else {
      std::string data = RandomBytes(Elements(shape) * ItemSize(dtype), i, dtype == v1::DTYPE_BOOL);
      mine.push_back(MustUploadNew(*client_, dtype, shape, data));
    }
    total += Elements(shape) * ItemSize(dtype);
  }
  absl::StatusOr<v1::ListBuffersResponse> list = client_->ListBuffers();
  ASSERT_OK(list);
  ASSERT_EQ(list->buffers_size(), static_cast<int>(mine.size()));
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(list->buffers(static_cast<int>(i)), mine[i]))
        << i << ": " << list->buffers(static_cast<int>(i)).ShortDebugString() << " vs "
        << mine[i].ShortDebugString();
    if (i > 0) {
      EXPECT_LE(list->buffers(static_cast<int>(i) - 1).create_time_unix_nanos(),
                list->buffers(static_cast<int>(i)).create_time_unix_nanos());
    }
  }
  EXPECT_EQ(list->total_bytes(), total);

  absl::StatusOr<v1::ListBuffersResponse> theirs = other->ListBuffers();
  ASSERT_OK(theirs);
  EXPECT_EQ(theirs->buffers_size(), static_cast<int>(specs.size()));
  EXPECT_EQ(theirs->total_bytes(), specs.size() * 16 * 4);

  // After a delete the rest keep their order.
  ASSERT_OK(client_->DeleteBuffer(mine[2].id()));
  mine.erase(mine.begin() + 2);
  list = client_->ListBuffers();
  ASSERT_OK(list);
  ASSERT_EQ(list->buffers_size(), static_cast<int>(mine.size()));
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_EQ(list->buffers(static_cast<int>(i)).id(), mine[i].id());
  EXPECT_EQ(list->total_bytes(), total - 4);
}

// DeleteBuffer: id and name stop resolving for every call, memory is returned, and the
// name can be used again for a new buffer with a new id.
TEST_F(ServerBuffersTest, DeleteBufferThenNotFound) {
  v1::BufferInfo keep =
      MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {8}, "keep", IntScalar(3)));
  const uint64_t used_before = MemoryUsed(*client_);
  v1::BufferInfo doomed =
      MustCreate(*client_, CreateRequest(v1::DTYPE_FLOAT64, {1000}, "doomed", FloatScalar(4.0)));
  EXPECT_EQ(MemoryUsed(*client_), used_before + 8000);
  ASSERT_OK(client_->DeleteBuffer("doomed"));
  EXPECT_EQ(MemoryUsed(*client_), used_before);

  for (const std::string& ref : {doomed.id(), std::string("doomed")}) {
    SCOPED_TRACE(ref);
    EXPECT_EQ(client_->GetBuffer(ref).status().code(), Code::kNotFound);
    EXPECT_EQ(DownloadBytes(*client_, ref).status().code(), Code::kNotFound);
    EXPECT_EQ(client_->DeleteBuffer(ref).code(), Code::kNotFound);
    absl::StatusOr<v1::UploadResponse> up =
        client_->Upload(RangeHeader(ref, 0), AsBytes(BytesOf<double>(1.0)));
    EXPECT_EQ(up.status().code(), Code::kNotFound) << up.status();
  }
  absl::StatusOr<v1::ListBuffersResponse> list = client_->ListBuffers();
  ASSERT_OK(list);
  ASSERT_EQ(list->buffers_size(), 1);
  EXPECT_EQ(list->buffers(0).id(), keep.id());
  EXPECT_EQ(MustDownload(*client_, "keep"), Repeat(BytesOf<int32_t>(3), 8));

  // Deleting by id works as well; then the name is free again.
  v1::BufferInfo again =
      MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {2}, "doomed", IntScalar(8)));
  EXPECT_NE(again.id(), doomed.id());
  EXPECT_EQ(MustDownload(*client_, "doomed"), Repeat(BytesOf<int32_t>(8), 2));
  ASSERT_OK(client_->DeleteBuffer(again.id()));
  EXPECT_EQ(client_->GetBuffer("doomed").status().code(), Code::kNotFound);
  EXPECT_EQ(MemoryUsed(*client_), used_before);
}

// Ids are "buf-" and 32 lowercase hex digits, all different.
TEST_F(ServerBuffersTest, BufferIdsAreDistinctHex) {
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    v1::BufferInfo info =
        i % 2 == 0 ? MustCreate(*client_, CreateRequest(v1::DTYPE_BOOL, {1}))
                   : MustUploadNew(*client_, v1::DTYPE_BOOL, {1}, std::string(1, '\x01'));
    EXPECT_TRUE(IsBufferId(info.id())) << info.id();
    EXPECT_TRUE(ids.insert(info.id()).second) << "repeated id " << info.id();
  }
}

// Malformed shapes and dtypes are INVALID_ARGUMENT and change nothing.
TEST_F(ServerBuffersTest, CreateBufferRejectsBadDtypeAndShape) {
  MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {4}, "existing", IntScalar(1)));
  const Snapshot before = TakeSnapshot(*client_);
  struct Bad {
    std::string what;
    v1::CreateBufferRequest request;
  };
  std::vector<Bad> cases;
  cases.push_back({"missing dtype", CreateRequest(v1::DTYPE_UNSPECIFIED, {4})});
  cases.push_back({"unknown dtype", CreateRequest(static_cast<v1::DType>(42), {4})});
  cases.push_back({"unknown layout",
                   CreateRequest(v1::DTYPE_INT32, {2, 2}, {}, {}, static_cast<v1::Layout>(9))});
  cases.push_back({"9 dimensions", CreateRequest(v1::DTYPE_INT32, {1, 1, 1, 1, 1, 1, 1, 1, 1})});
  cases.push_back({"9 dimensions with fill",
                   CreateRequest(v1::DTYPE_INT32, {1, 2, 1, 2, 1, 2, 1, 2, 1}, {}, IntScalar(1))});
  // 2^32 * 2^32 elements: the element count itself overflows 64 bits.
  cases.push_back({"element count overflows",
                   CreateRequest(v1::DTYPE_INT32, {uint64_t{1} << 32, uint64_t{1} << 32})});
  // 2^61 float64 elements are 2^64 bytes: only the byte size overflows.
  cases.push_back({"byte size overflows", CreateRequest(v1::DTYPE_FLOAT64, {uint64_t{1} << 61})});
  cases.push_back({"max extent", CreateRequest(v1::DTYPE_BOOL, {~uint64_t{0}, 2})});
  cases.push_back({"device 5", CreateRequest(v1::DTYPE_INT32, {4})});
  cases.back().request.set_device(5);
  cases.push_back({"device -1", CreateRequest(v1::DTYPE_INT32, {4})});
  cases.back().request.set_device(-1);
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<v1::BufferInfo> r = client_->CreateBuffer(c.request);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    // The same through an upload that would create the buffer.
    v1::UploadHeader header;
    *header.mutable_create() = c.request;
    header.mutable_create()->clear_fill();
    absl::StatusOr<v1::UploadResponse> u = client_->Upload(header, AsBytes(std::string(16, '\0')));
    EXPECT_EQ(u.status().code(), Code::kInvalidArgument) << u.status();
    EXPECT_EQ(TakeSnapshot(*client_), before);
  }
  // Eight dimensions are allowed.
  v1::BufferInfo eight = MustCreate(
      *client_, CreateRequest(v1::DTYPE_INT32, {1, 2, 1, 2, 1, 2, 1, 2}, {}, IntScalar(6)));
  EXPECT_EQ(eight.shape_size(), 8);
  EXPECT_EQ(eight.size_bytes(), 16u * 4u);
  EXPECT_EQ(MustDownload(*client_, eight.id()), Repeat(BytesOf<int32_t>(6), 16));
}

// ---------------------------------------------------------------------------
// 2. Upload and Download

// Random bytes of several sizes round-trip exactly, uploaded in many 64 KiB chunks.
TEST_F(ServerBuffersTest, UploadDownloadRoundTripInManyChunks) {
  constexpr uint64_t kChunk = 64 << 10;
  std::unique_ptr<Client> client = server_->Connect("chunky", kChunk);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> sizes = {0, 1, 4 * kMiB - 1, 4 * kMiB + 1, 10 * kMiB};
  uint64_t expected_used = 0;
  for (uint64_t size : sizes) {
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    // Sizes that are a whole number of int32s carry arbitrary bytes; the others go
    // into bool buffers (one byte per element), whose elements are 0 or 1.
    const bool as_int32 = size % 4 == 0;
    const v1::DType dtype = as_int32 ? v1::DTYPE_INT32 : v1::DTYPE_BOOL;
    const std::vector<uint64_t> shape = {as_int32 ? size / 4 : size};
    const std::string data = RandomBytes(size, 1000 + size, /*bool_values=*/!as_int32);
    uint64_t progress_calls = 0;
    uint64_t last_done = 0;
    absl::StatusOr<v1::UploadResponse> up =
        client->Upload(CreateHeader(dtype, shape, absl::StrCat("rt", size)), AsBytes(data),
                       [&](uint64_t done, uint64_t total) {
                         ++progress_calls;
                         EXPECT_EQ(total, size);
                         EXPECT_GT(done, last_done);
                         EXPECT_LE(done - last_done, kChunk);
                         last_done = done;
                       });
    ASSERT_OK(up);
    EXPECT_EQ(progress_calls, (size + kChunk - 1) / kChunk);
    EXPECT_EQ(last_done, size);
    const v1::BufferInfo& info = up->buffer();
    EXPECT_TRUE(IsBufferId(info.id())) << info.id();
    EXPECT_EQ(info.name(), absl::StrCat("rt", size));
    EXPECT_EQ(info.dtype(), dtype);
    EXPECT_EQ(std::vector<uint64_t>(info.shape().begin(), info.shape().end()), shape);
    EXPECT_EQ(info.size_bytes(), size);
    EXPECT_EQ(up->transfer().bytes(), size);
    expected_used += size;
    EXPECT_EQ(MemoryUsed(*client), expected_used);

    absl::StatusOr<v1::BufferInfo> got = client->GetBuffer(info.id());
    ASSERT_OK(got);
    EXPECT_TRUE(MessageDifferencer::Equals(*got, info));

    v1::DownloadRequest request;
    request.set_buffer(info.name());
    std::string back;
    absl::StatusOr<v1::DownloadResponse> down = client->Download(request, &back);
    ASSERT_OK(down);
    EXPECT_TRUE(MessageDifferencer::Equals(down->buffer(), info));
    EXPECT_EQ(down->transfer().bytes(), size);
    ASSERT_EQ(back.size(), data.size());
    EXPECT_TRUE(back == data) << "downloaded bytes differ from the uploaded ones";
  }
}

// An upload into a byte range of an existing buffer changes that range and nothing
// else, at unaligned offsets and lengths too.
TEST_F(ServerBuffersTest, UploadIntoExistingBufferAtOffset) {
  std::unique_ptr<Client> client = server_->Connect("ranges", 64 << 10);
  ASSERT_NE(client, nullptr);
  constexpr uint64_t kElements = 300000;
  v1::BufferInfo target =
      MustCreate(*client, CreateRequest(v1::DTYPE_INT32, {kElements}, "target", IntScalar(7)));
  const uint64_t size = target.size_bytes();
  std::string model = Repeat(BytesOf<int32_t>(7), kElements);
  const uint64_t used = MemoryUsed(*client);

  struct Range {
    uint64_t offset;
    uint64_t length;
  };
  const std::vector<Range> ranges = {{12347, 100001}, {0, 3},       {size - 5, 5}, {size, 0},
                                     {77, 0},         {4096, 4096}, {0, size},     {1, size - 2}};
  int seed = 0;
  for (const Range& r : ranges) {
    SCOPED_TRACE(absl::StrCat("offset ", r.offset, " length ", r.length));
    const std::string data = RandomBytes(r.length, 77 + seed++);
    absl::StatusOr<v1::UploadResponse> up = client->Upload(
        RangeHeader(seed % 2 == 0 ? target.id() : "target", r.offset), AsBytes(data));
    ASSERT_OK(up);
    EXPECT_TRUE(MessageDifferencer::Equals(up->buffer(), target))
        << up->buffer().ShortDebugString();
    EXPECT_EQ(up->transfer().bytes(), r.length);
    model.replace(r.offset, r.length, data);
    const std::string back = MustDownload(*client, "target");
    ASSERT_EQ(back.size(), model.size());
    EXPECT_TRUE(back == model) << "buffer differs from the model";
    // The staging memory of the upload is returned.
    EXPECT_EQ(WaitForMemoryUsed(*client, used), used);
  }
  // A header that declares the length explicitly works the same.
  const std::string data = RandomBytes(999, 5);
  absl::StatusOr<v1::UploadResponse> up =
      client->Upload(RangeHeader(target.id(), 50, 999), AsBytes(data));
  ASSERT_OK(up);
  model.replace(50, 999, data);
  EXPECT_TRUE(MustDownload(*client, "target") == model);
}

// A Download of a byte range returns exactly those bytes, with the buffer's info and
// the requested offset.
TEST_F(ServerBuffersTest, DownloadByteRange) {
  const std::string data = RandomBytes(kMiB, 42);
  v1::BufferInfo info = MustUploadNew(*client_, v1::DTYPE_INT64, {kMiB / 8}, data, "src");
  const uint64_t size = data.size();
  struct Range {
    uint64_t offset;
    uint64_t size;  // 0: to the end
  };
  const std::vector<Range> ranges = {{0, 1},        {1, 1000},    {size - 1, 1}, {size - 1, 0},
                                     {12345, 0},    {size, 0},    {0, size},     {0, 0},
                                     {333, 500001}, {size / 2, 7}};
  for (const Range& r : ranges) {
    SCOPED_TRACE(absl::StrCat("offset ", r.offset, " size ", r.size));
    v1::DownloadRequest request;
    request.set_buffer(r.offset % 2 == 0 ? "src" : info.id());
    request.set_offset_bytes(r.offset);
    request.set_size_bytes(r.size);
    std::string back;
    absl::StatusOr<v1::DownloadResponse> down = client_->Download(request, &back);
    ASSERT_OK(down);
    EXPECT_TRUE(MessageDifferencer::Equals(down->buffer(), info));
    EXPECT_EQ(down->offset_bytes(), r.offset);
    const uint64_t length = r.size == 0 ? size - r.offset : r.size;
    EXPECT_EQ(down->transfer().bytes(), length);
    ASSERT_EQ(back.size(), length);
    EXPECT_TRUE(back == data.substr(r.offset, length));
  }
}

// With chunk_bytes 4096 the server sends many messages, each at most 4096 bytes, at
// consecutive offsets.
TEST_F(ServerBuffersTest, DownloadInSmallChunks) {
  const std::string data = RandomBytes(3 * kMiB + 12, 9);
  v1::BufferInfo info = MustUploadNew(*client_, v1::DTYPE_INT32, {data.size() / 4}, data);
  struct Case {
    uint64_t offset;
    uint64_t size;
  };
  for (const Case& c :
       {Case{0, 0}, Case{1001, 50000}, Case{4096, 4096}, Case{5, 4095}, Case{7, 1}}) {
    SCOPED_TRACE(absl::StrCat("offset ", c.offset, " size ", c.size));
    const uint64_t length = c.size == 0 ? data.size() - c.offset : c.size;
    v1::DownloadRequest request;
    request.set_buffer(info.id());
    request.set_offset_bytes(c.offset);
    request.set_size_bytes(c.size);
    request.set_chunk_bytes(4096);
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // (offset, size)
    std::string back;
    absl::StatusOr<v1::DownloadResponse> down =
        client_->Download(request, [&](uint64_t offset, std::string_view chunk) {
          chunks.emplace_back(offset, chunk.size());
          back.append(chunk.data(), chunk.size());
          return absl::OkStatus();
        });
    ASSERT_OK(down);
    EXPECT_EQ(chunks.size(), (length + 4095) / 4096);
    uint64_t next = c.offset;
    for (const auto& [offset, n] : chunks) {
      EXPECT_EQ(offset, next);
      EXPECT_LE(n, 4096u);
      EXPECT_GT(n, 0u);
      next = offset + n;
    }
    EXPECT_EQ(next, c.offset + length);
    EXPECT_TRUE(back == data.substr(c.offset, length));
  }
  // chunk_bytes outside the server's limits is clamped, not refused.
  for (uint32_t chunk : {1u, 100u, std::numeric_limits<uint32_t>::max()}) {
    SCOPED_TRACE(absl::StrCat("chunk_bytes ", chunk));
    absl::StatusOr<std::string> back = DownloadBytes(*client_, info.id(), 0, 0, chunk);
    ASSERT_OK(back);
    EXPECT_TRUE(*back == data);
  }
}

// Byte ranges outside the buffer are refused for Upload and Download, and nothing
// changes.
TEST_F(ServerBuffersTest, OutOfRangeUploadAndDownloadAreRejected) {
  const std::string data = RandomBytes(4096, 3);
  v1::BufferInfo info = MustUploadNew(*client_, v1::DTYPE_INT32, {1024}, data, "small");
  const Snapshot before = TakeSnapshot(*client_);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  struct Range {
    uint64_t offset;
    uint64_t size;
  };
  const std::vector<Range> bad = {{4097, 0},
                                  {4097, 1},
                                  {4096, 1},
                                  {4000, 97},
                                  {0, 4097},
                                  {1, 4096},
                                  {kMax, 2},
                                  {2, kMax},
                                  {kMax, kMax},
                                  {kMax, 0},
                                  {uint64_t{1} << 63, uint64_t{1} << 63}};
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server_->RawChannel());
  for (const Range& r : bad) {
    SCOPED_TRACE(absl::StrCat("offset ", r.offset, " size ", r.size));
    // Download (size 0 means "to the end", which is out of range only for offset > 4096).
    if (r.size != 0 || r.offset > 4096) {
      absl::StatusOr<std::string> down = DownloadBytes(*client_, info.id(), r.offset, r.size);
      EXPECT_EQ(down.status().code(), kRangeError) << down.status();
    }
    // Upload: through the library when the bytes are few, else a bare header.
    if (r.size <= 4097 && r.size != 0) {
      absl::StatusOr<v1::UploadResponse> up =
          client_->Upload(RangeHeader("small", r.offset), AsBytes(RandomBytes(r.size, 8)));
      EXPECT_EQ(up.status().code(), kRangeError) << up.status();
    }
    grpc::Status raw = RawUpload(*server_,
                                 {HeaderMessage(RangeHeader(info.id(), r.offset, r.size)),
                                  ChunkMessage(std::string(16, 'x'))},
                                 "tester");
    EXPECT_EQ(GrpcCode(raw), kRangeError) << raw.error_message();
    EXPECT_EQ(TakeSnapshot(*client_), before);
    EXPECT_TRUE(MustDownload(*client_, "small") == data);
  }
}

// Malformed upload streams (sent with a raw stub) are INVALID_ARGUMENT and change
// nothing: no buffer is created, no memory stays charged, and an existing target keeps
// every byte.
TEST_F(ServerBuffersTest, MalformedUploadStreamsChangeNothing) {
  const std::string original = RandomBytes(4096, 11);
  v1::BufferInfo target = MustUploadNew(*client_, v1::DTYPE_INT32, {1024}, original, "target");
  const v1::UploadHeader create = CreateHeader(v1::DTYPE_INT32, {1024}, "fresh");  // 4096 bytes
  auto with_size = [](v1::UploadHeader h, uint64_t size) {
    h.set_size_bytes(size);
    return h;
  };
  auto chunk = [](uint64_t n, char c = 'z') { return ChunkMessage(std::string(n, c)); };
  v1::UploadHeader create_with_fill = create;
  *create_with_fill.mutable_create()->mutable_fill() = IntScalar(0);
  v1::UploadHeader create_at_offset = with_size(create, 4096);
  create_at_offset.set_offset_bytes(4);

  struct Case {
    std::string what;
    std::vector<v1::UploadRequest> messages;
  };
  const std::vector<Case> cases = {
      // Streams that end before every declared byte arrived.
      {"create, ends early", {HeaderMessage(with_size(create, 4096)), chunk(1000), chunk(96)}},
      {"create with size 0 (= buffer size), ends early", {HeaderMessage(create), chunk(4095)}},
      {"create, header only", {HeaderMessage(with_size(create, 4096))}},
      {"existing, ends early", {HeaderMessage(RangeHeader("target", 100, 2000)), chunk(1999)}},
      {"existing, header only", {HeaderMessage(RangeHeader(target.id(), 0, 4096))}},
      // Ordering of header and chunks.
      {"no messages at all", {}},
      {"chunk first", {chunk(16), HeaderMessage(with_size(create, 4096))}},
      {"chunk first (existing)",
       {chunk(16), HeaderMessage(RangeHeader("target", 0, 16)), chunk(16)}},
      {"empty message first", {v1::UploadRequest()}},
      {"second header (create)",
       {HeaderMessage(with_size(create, 4096)), chunk(2048), HeaderMessage(with_size(create, 4096)),
        chunk(2048)}},
      {"second header right away",
       {HeaderMessage(RangeHeader("target", 0, 8)), HeaderMessage(RangeHeader("target", 0, 8)),
        chunk(8)}},
      {"empty message after the header",
       {HeaderMessage(RangeHeader("target", 0, 8)), v1::UploadRequest(), chunk(8)}},
      // More bytes than declared.
      {"create, one oversized chunk", {HeaderMessage(with_size(create, 4096)), chunk(4097)}},
      {"create, extra chunk", {HeaderMessage(with_size(create, 4096)), chunk(4096), chunk(1)}},
      {"existing, one oversized chunk", {HeaderMessage(RangeHeader("target", 8, 16)), chunk(17)}},
      {"existing, extra chunk",
       {HeaderMessage(RangeHeader("target", 8, 16)), chunk(16), chunk(16)}},
      {"existing, size 0 then a chunk", {HeaderMessage(RangeHeader("target", 8, 0)), chunk(1)}},
      // A create whose declared size is not the buffer's.
      {"create, size 4095", {HeaderMessage(with_size(create, 4095)), chunk(4095)}},
      {"create, size 4097", {HeaderMessage(with_size(create, 4097)), chunk(4097)}},
      {"create, size 8192", {HeaderMessage(with_size(create, 8192)), chunk(4096), chunk(4096)}},
      // Other malformed headers.
      {"create with a fill", {HeaderMessage(with_size(create_with_fill, 4096)), chunk(4096)}},
      {"create at an offset", {HeaderMessage(create_at_offset), chunk(4096)}},
      {"header without a target", {HeaderMessage(v1::UploadHeader()), chunk(4)}},
      {"existing, empty reference", {HeaderMessage(RangeHeader("", 0, 4)), chunk(4)}},
  };
  const Snapshot before = TakeSnapshot(*client_);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    grpc::Status status = RawUpload(*server_, c.messages, "tester");
    EXPECT_EQ(GrpcCode(status), Code::kInvalidArgument) << status.error_message();
    // The server returns the memory of a rejected upload only after it has answered
    // (UploadMemoryIsReturnedBeforeTheAnswer shows it), so wait for it here and
    // then require everything else to be exactly as before.
    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
    EXPECT_EQ(client_->GetBuffer("fresh").status().code(), Code::kNotFound);
    EXPECT_TRUE(MustDownload(*client_, "target") == original) << "the target changed";
  }

  // The library refuses a mismatch between the header and the data before sending.
  absl::StatusOr<v1::UploadResponse> lib =
      client_->Upload(with_size(create, 4096), AsBytes(std::string(100, 'q')));
  EXPECT_EQ(lib.status().code(), Code::kInvalidArgument) << lib.status();
  // Without a declared size the server sees 100 bytes for a 4096-byte buffer.
  lib = client_->Upload(create, AsBytes(std::string(100, 'q')));
  EXPECT_EQ(lib.status().code(), Code::kInvalidArgument) << lib.status();
  EXPECT_EQ(TakeSnapshot(*client_), before);

  // A well-formed raw stream, for contrast, creates the buffer.
  grpc::Status ok = RawUpload(
      *server_, {HeaderMessage(with_size(create, 4096)), chunk(4000, 'a'), chunk(96, 'b')},
      "tester");
  ASSERT_OK(ok);
  EXPECT_EQ(MustDownload(*client_, "fresh"), std::string(4000, 'a') + std::string(96, 'b'));
}

// A client that cancels an upload part-way leaves the server healthy and returns the
// memory the upload held.
// A client that abandons a download part-way must not leave the buffer held: a later
// writer goes ahead, and deleting the buffer gives its memory back.
TEST_F(ServerBuffersTest, CancelledDownloadReleasesTheBuffer) {
  const std::string original = RandomBytes(8 * kMiB, 22);
  const uint64_t before = MemoryUsed(*client_);
  v1::BufferInfo target =
      MustUploadNew(*client_, v1::DTYPE_FLOAT32, {2 * kMiB}, original, "abandoned");
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server_->RawChannel());
  {
    std::unique_ptr<grpc::ClientContext> context = RawContext("tester");
    v1::DownloadRequest request;
    request.set_buffer(target.id());
    request.set_chunk_bytes(64 * 1024);
    std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
        stub->Download(context.get(), request);
    v1::DownloadResponse first;
    ASSERT_TRUE(reader->Read(&first));
    EXPECT_EQ(first.data(), original.substr(0, 64 * 1024));
    context->TryCancel();
    while (reader->Read(&first)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A writer after the abandoned reader: it would wait forever if the read were still held.
  v1::SubmitRequest fill =
      Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_FLOAT32, 3, ExistingOutput(target.id()));
  fill.set_wait(true);
  fill.set_wait_timeout_seconds(30);
  absl::StatusOr<v1::Operation> op = client_->Submit(fill);
  ASSERT_OK(op);
  EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED)
      << "a writer is still held back by a cancelled download";
  ASSERT_OK(client_->DeleteBuffer(target.id()));
  EXPECT_EQ(WaitForMemoryUsed(*client_, before), before);
}

const v1::KindStats* FindKind(const v1::Stats& stats, v1::OperationKind kind) {
  for (const v1::KindStats& k : stats.kinds()) {
    if (k.kind() == kind) return &k;
  }
  return nullptr;
}

// Uploads the server has counted as failed (GetStats).
uint64_t FailedUploads(Client& client) {
  absl::StatusOr<v1::Stats> stats = client.GetStats();
  EXPECT_OK(stats);
  if (!stats.ok()) return 0;
  const v1::KindStats* upload = FindKind(*stats, v1::OPERATION_KIND_UPLOAD);
  return upload == nullptr ? 0 : upload->failed();
}

TEST_F(ServerBuffersTest, CancelledUploadReleasesMemory) {
  const std::string original = RandomBytes(8 * kMiB, 21);
  v1::BufferInfo target =
      MustUploadNew(*client_, v1::DTYPE_FLOAT32, {2 * kMiB}, original, "target");
  const Snapshot before = TakeSnapshot(*client_);
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server_->RawChannel());

  const std::vector<v1::UploadHeader> headers = {
      CreateHeader(v1::DTYPE_FLOAT32, {8 * kMiB}, "partial"),  // 32 MiB
      RangeHeader("target", 4, 8 * kMiB - 8),
  };
  for (const v1::UploadHeader& header : headers) {
    SCOPED_TRACE(header.ShortDebugString());
    std::unique_ptr<grpc::ClientContext> context = RawContext("tester");
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        stub->Upload(context.get(), &response);
    ASSERT_TRUE(writer->Write(HeaderMessage(header)));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer->Write(ChunkMessage(RandomBytes(kMiB, i))));
    // Let the server take the chunks in (and charge the memory) before cancelling.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // The upload holds memory now (the new buffer, or staging for the range).
    EXPECT_GT(MemoryUsed(*client_), before.memory_used_bytes);
    context->TryCancel();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();

    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
    EXPECT_EQ(client_->GetBuffer("partial").status().code(), Code::kNotFound);
    EXPECT_TRUE(MustDownload(*client_, "target") == original) << "the target changed";
  }

  // A reader that fails part-way makes the library cancel; nothing changes either.
  const uint64_t failed_before = FailedUploads(*client_);
  std::unique_ptr<Client> chunky = server_->Connect("tester", 64 << 10);
  ASSERT_NE(chunky, nullptr);
  uint64_t served = 0;
  absl::StatusOr<v1::UploadResponse> failed =
      chunky->Upload(CreateHeader(v1::DTYPE_INT64, {kMiB}, "partial"), 8 * kMiB,
                     [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
                       if (served >= kMiB) return absl::DataLossError("the source broke");
                       std::memset(out.data(), 1, out.size());
                       served += out.size();
                       return out.size();
                     });
  EXPECT_EQ(failed.status().code(), Code::kDataLoss) << failed.status();
  // The library returns as soon as it cancels; the server may take the header in (and
  // the memory it asks for) only after that. Once it counts the failed upload it is done
  // with it (a call cancelled before its header was read allocated nothing, and is not
  // counted: the wait then ends at its bound).
  for (int i = 0; i < 100 && FailedUploads(*client_) == failed_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client_), before);

  // The server still serves: a full round trip works.
  const std::string data = RandomBytes(5 * kMiB, 33);
  v1::BufferInfo after =
      MustUploadNew(*client_, v1::DTYPE_INT64, {data.size() / 8}, data, "partial");
  EXPECT_TRUE(MustDownload(*client_, after.id()) == data);
  EXPECT_EQ(MemoryUsed(*client_), before.memory_used_bytes + data.size());
}

// The memory an upload holds (a new buffer not yet registered, or staging for a range
// of an existing one) must be returned by the time the client hears the answer: "a
// rejected request changes nothing", and memory_used_bytes counts what buffers hold.
// The server releases it only when the call's reactor is destroyed, after the status
// is on the wire, so a client that checks (or allocates) right after the answer can
// see the rejected upload's bytes still charged. Each check is made right after the
// answer, many times, so the race shows reliably.
TEST_F(ServerBuffersTest, UploadMemoryIsReturnedBeforeTheAnswer) {
  MustCreate(*client_, CreateRequest(v1::DTYPE_INT32, {1024}, "target", IntScalar(0)));
  const uint64_t base = MemoryUsed(*client_);
  v1::UploadHeader create = CreateHeader(v1::DTYPE_INT32, {1024}, "fresh");
  create.set_size_bytes(4096);
  constexpr int kRounds = 100;
  int create_seen = 0, existing_seen = 0, success_seen = 0;
  for (int i = 0; i < kRounds; ++i) {
    // A create-upload that ends after its header.
    grpc::Status s = RawUpload(*server_, {HeaderMessage(create)}, "tester");
    ASSERT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    if (MemoryUsed(*client_) != base) ++create_seen;
    // A range upload into an existing buffer that ends early.
    s = RawUpload(*server_, {HeaderMessage(RangeHeader("target", 0, 4096)), ChunkMessage("abc")},
                  "tester");
    ASSERT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    if (MemoryUsed(*client_) != base) ++existing_seen;
    // A successful range upload: its staging memory is not a buffer either.
    absl::StatusOr<v1::UploadResponse> ok =
        client_->Upload(RangeHeader("target", 0, 4096), AsBytes(std::string(4096, 'k')));
    ASSERT_OK(ok);
    if (MemoryUsed(*client_) != base) ++success_seen;
  }
  EXPECT_EQ(create_seen, 0) << "rejected create-uploads still charged right after the answer, in "
                            << create_seen << " of " << kRounds << " rounds";
  EXPECT_EQ(existing_seen, 0) << "rejected range uploads still charged right after the answer, in "
                              << existing_seen << " of " << kRounds << " rounds";
  EXPECT_EQ(success_seen, 0)
      << "staging of finished range uploads still charged after the answer, in " << success_seen
      << " of " << kRounds << " rounds";
  EXPECT_EQ(WaitForMemoryUsed(*client_, base), base);

  // What it costs a client: near the limit, an allocation right after a rejected
  // upload is refused for memory that holds nothing.
  std::unique_ptr<TestServer> small = TestServer::Start(64 * kMiB, 2);
  ASSERT_NE(small, nullptr);
  std::unique_ptr<Client> client = small->Connect("tester");
  ASSERT_NE(client, nullptr);
  v1::UploadHeader big = CreateHeader(v1::DTYPE_FLOAT32, {10 * kMiB}, "big");  // 40 MiB
  big.set_size_bytes(40 * kMiB);
  constexpr int kBigRounds = 200;
  int refused = 0;
  for (int i = 0; i < kBigRounds; ++i) {
    grpc::Status s =
        RawUpload(*small, {HeaderMessage(big), ChunkMessage(std::string(4096, 'b'))}, "tester");
    ASSERT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    absl::StatusOr<v1::BufferInfo> again =
        client->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT32, {10 * kMiB}));
    if (!again.ok()) {
      EXPECT_EQ(again.status().code(), Code::kResourceExhausted) << again.status();
      ++refused;
    } else {
      ASSERT_OK(client->DeleteBuffer(again->id()));
    }
  }
  EXPECT_EQ(refused, 0)
      << "a 40 MiB CreateBuffer on an empty 64 MiB server was refused right after "
         "a rejected 40 MiB upload, in "
      << refused << " of " << kBigRounds << " rounds";
}

// ---------------------------------------------------------------------------
// 3. Arrays over 2 GiB

// Byte p of the float32 array whose element i is i % 7.
uint8_t PatternByte(uint64_t p) {
  const float v = static_cast<float>((p / 4) % 7);
  uint8_t bytes[4];
  std::memcpy(bytes, &v, 4);
  return bytes[p % 4];
}

// A float32 array of 2 GiB + 4 KiB (more elements than int32 can index bytes of),
// generated chunk by chunk by the upload reader and never held by the test: its sum,
// and a byte range across byte 2^31, come back exact.
TEST(ServerBuffersLargeTest, ArrayOver2GiBUploadReduceAndRangeDownload) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t limit = 5 * kGiB / 2;
  std::unique_ptr<TestServer> server = TestServer::Start(limit, 2);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->Connect("large", 16 * kMiB);
  ASSERT_NE(client, nullptr);

  const uint64_t size = 2 * kGiB + 4096;
  const uint64_t n = size / 4;
  ASSERT_GT(size, uint64_t{1} << 31);
  uint64_t position = 0;
  UploadReader reader = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
    uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());
    size_t k = 0;
    // Byte by byte up to an element boundary, then whole elements, then the tail.
    for (; k < out.size() && (position + k) % 4 != 0; ++k) dst[k] = PatternByte(position + k);
    static const float kValues[7] = {0, 1, 2, 3, 4, 5, 6};
    uint64_t element = (position + k) / 4;
    uint64_t residue = element % 7;
    for (; k + 4 <= out.size(); k += 4) {
      std::memcpy(dst + k, &kValues[residue], 4);
      if (++residue == 7) residue = 0;
    }
    for (; k < out.size(); ++k) dst[k] = PatternByte(position + k);
    position += out.size();
    return out.size();
  };
  v1::UploadHeader header = CreateHeader(v1::DTYPE_FLOAT32, {n}, "big");
  absl::StatusOr<v1::UploadResponse> up = client->Upload(header, size, reader);
  ASSERT_OK(up);
  const double upload_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(position, size);
  EXPECT_EQ(up->buffer().size_bytes(), size);
  ASSERT_EQ(up->buffer().shape_size(), 1);
  EXPECT_EQ(up->buffer().shape(0), n);
  EXPECT_EQ(up->transfer().bytes(), size);
  EXPECT_EQ(MemoryUsed(*client), size);

  // The exact sum: each run of 7 elements adds 0 + 1 + ... + 6 = 21. Every partial sum
  // is an integer below 2^53, so the server's float64 accumulation is exact in any
  // order; the float32 result is that integer rounded once to float32, which is what
  // static_cast<float> gives here. No tolerance is needed.
  const uint64_t q = n / 7, r = n % 7;
  const uint64_t exact = 21 * q + r * (r - 1) / 2;
  const double expected = static_cast<double>(static_cast<float>(static_cast<double>(exact)));
  v1::SubmitRequest request = Reduce(v1::REDUCE_KIND_SUM, "big");
  request.set_wait(true);
  absl::StatusOr<v1::Operation> op = client->Submit(request);
  ASSERT_OK(op);
  EXPECT_TRUE(op->done());
  EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED) << op->error_message();
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_REDUCE);
  ASSERT_EQ(op->values_size(), 1);
  ASSERT_TRUE(op->values(0).has_float_value()) << op->values(0).ShortDebugString();
  EXPECT_EQ(op->values(0).float_value(), expected) << "exact sum " << exact;
  // The new 0-d output holds the same float32.
  ASSERT_EQ(op->outputs_size(), 1);
  EXPECT_EQ(op->outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(op->outputs(0).shape_size(), 0);
  EXPECT_EQ(MustDownloadFrom(*client, op->outputs(0).id()),
            BytesOf<float>(static_cast<float>(expected)));
  const double reduce_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
      upload_seconds;

  // 1 MiB across byte 2^31 (ending 2050 bytes past it, inside the last 4 KiB),
  // starting mid-element.
  const uint64_t offset = (uint64_t{1} << 31) - kMiB + 2048 + 2;
  ASSERT_LT(offset, uint64_t{1} << 31);
  ASSERT_GT(offset + kMiB, uint64_t{1} << 31);
  absl::StatusOr<std::string> range = DownloadBytes(*client, "big", offset, kMiB);
  ASSERT_OK(range);
  ASSERT_EQ(range->size(), kMiB);
  uint64_t mismatches = 0, first_mismatch = 0;
  for (uint64_t k = 0; k < kMiB; ++k) {
    if (static_cast<uint8_t>((*range)[k]) != PatternByte(offset + k) && mismatches++ == 0)
      first_mismatch = k;
  }
  EXPECT_EQ(mismatches, 0u) << "first at byte " << offset + first_mismatch;
  // And the last 4 KiB, all past 2^31.
  absl::StatusOr<std::string> tail = DownloadBytes(*client, up->buffer().id(), size - 4096, 0);
  ASSERT_OK(tail);
  ASSERT_EQ(tail->size(), 4096u);
  for (uint64_t k = 0; k < 4096; ++k) {
    ASSERT_EQ(static_cast<uint8_t>((*tail)[k]), PatternByte(size - 4096 + k))
        << "byte " << size - 4096 + k;
  }

  ASSERT_OK(client->DeleteBuffer("big"));
  EXPECT_EQ(MemoryUsed(*client), 4u);  // the reduction's 0-d output remains
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ timing   ] 2 GiB + 4 KiB: upload " << upload_seconds << " s ("
            << static_cast<double>(size) / upload_seconds / 1e9 << " GB/s), reduce "
            << reduce_seconds << " s, total " << total << " s\n";
  // ThreadSanitizer makes every memory access several times slower: no bound there.
#ifndef ABSL_HAVE_THREAD_SANITIZER
  EXPECT_LT(total, 120.0);
#endif
}

// ---------------------------------------------------------------------------
// 4. Memory limit

TEST(ServerBuffersLimitTest, CreateBeyondMemoryLimitIsResourceExhausted) {
  const uint64_t limit = 64 * kMiB;
  std::unique_ptr<TestServer> server = TestServer::Start(limit, 2);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->Connect("limited");
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::BufferInfo> a =
      client->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT32, {10 * kMiB}, "a", FloatScalar(1.5)));
  ASSERT_OK(a);
  EXPECT_EQ(MemoryUsed(*client), 40 * kMiB);
  const Snapshot before = TakeSnapshot(*client);

  std::vector<v1::CreateBufferRequest> too_big = {
      CreateRequest(v1::DTYPE_INT64, {30 * kMiB / 8}, "b"),
      CreateRequest(v1::DTYPE_INT64, {30 * kMiB / 8}, "b", IntScalar(3)),
      CreateRequest(v1::DTYPE_BOOL, {24 * kMiB + 1}),
      CreateRequest(v1::DTYPE_FLOAT32, {uint64_t{1} << 40}),
  };
  for (const v1::CreateBufferRequest& request : too_big) {
    SCOPED_TRACE(request.ShortDebugString());
    absl::StatusOr<v1::BufferInfo> r = client->CreateBuffer(request);
    ASSERT_EQ(r.status().code(), Code::kResourceExhausted) << r.status();
    EXPECT_NE(r.status().message().find("limit"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(absl::StrCat(limit)), std::string::npos)
        << "the message does not give the limit: " << r.status();
    EXPECT_EQ(TakeSnapshot(*client), before);
  }
  // An upload that would create too large a buffer is refused at its header.
  absl::StatusOr<v1::UploadResponse> up = client->Upload(
      CreateHeader(v1::DTYPE_INT32, {8 * kMiB}, "b"), AsBytes(std::string(32 * kMiB, '\0')));
  EXPECT_EQ(up.status().code(), Code::kResourceExhausted) << up.status();
  EXPECT_EQ(WaitForMemoryUsed(*client, before.memory_used_bytes), before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client), before);

  // The server still serves, up to exactly the limit.
  EXPECT_EQ(MustDownloadFrom(*client, "a"), Repeat(BytesOf<float>(1.5f), 10 * kMiB));
  absl::StatusOr<v1::BufferInfo> c =
      client->CreateBuffer(CreateRequest(v1::DTYPE_BOOL, {24 * kMiB}, "c", BoolScalar(true)));
  ASSERT_OK(c);
  EXPECT_EQ(MemoryUsed(*client), limit);
  absl::StatusOr<v1::BufferInfo> one_more =
      client->CreateBuffer(CreateRequest(v1::DTYPE_BOOL, {1}));
  EXPECT_EQ(one_more.status().code(), Code::kResourceExhausted) << one_more.status();
  absl::StatusOr<v1::BufferInfo> empty =
      client->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT64, {0}, "empty"));
  EXPECT_OK(empty);
  EXPECT_EQ(MemoryUsed(*client), limit);

  // Deletes return exactly what the buffers held.
  ASSERT_OK(client->DeleteBuffer("c"));
  EXPECT_EQ(MemoryUsed(*client), 40 * kMiB);
  ASSERT_OK(client->DeleteBuffer(a->id()));
  EXPECT_EQ(MemoryUsed(*client), 0u);
  // Now the refused request fits.
  absl::StatusOr<v1::BufferInfo> b = client->CreateBuffer(too_big[1]);
  ASSERT_OK(b);
  EXPECT_EQ(MemoryUsed(*client), 30 * kMiB);
  EXPECT_EQ(MustDownloadFrom(*client, "b"), Repeat(BytesOf<int64_t>(3), 30 * kMiB / 8));
  absl::StatusOr<v1::Stats> stats = client->GetStats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->memory_peak_bytes(), limit);
  EXPECT_EQ(stats->memory_used_bytes(), 30 * kMiB);
}

// ---------------------------------------------------------------------------
// 5. GetServerInfo and GetStats

TEST_F(ServerBuffersTest, GetServerInfoDescribesTheServer) {
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->backend(), TestBackendName());
  const bool cpu = TestBackendName() == "cpu";
  EXPECT_EQ(info->api(), "gpucompute.v1");
  EXPECT_FALSE(info->version().empty());
  // One device on the CPU backend; every GPU the server sees on CUDA.
  if (cpu) {
    ASSERT_EQ(info->devices_size(), 1);
  } else {
    ASSERT_GE(info->devices_size(), 1);
  }
  EXPECT_EQ(info->devices(0).index(), 0);
  EXPECT_FALSE(info->devices(0).name().empty());
  EXPECT_GT(info->devices(0).total_memory_bytes(), 0u);
  // Worker threads on the CPU; a GPU reports its multiprocessors.
  if (cpu) {
    EXPECT_EQ(info->devices(0).compute_units(), server_->cpu_threads());
  }
  EXPECT_EQ(info->default_device(), 0);
  EXPECT_EQ(info->memory_limit_bytes(), kLimit);
  EXPECT_EQ(info->memory_used_bytes(), 0u);
  EXPECT_EQ(info->buffer_count(), 0u);
  ASSERT_TRUE(info->has_limits());
  EXPECT_EQ(info->limits().max_message_bytes(), kMaxMessageBytes);
  EXPECT_EQ(info->limits().max_dimensions(), 8u);
  EXPECT_GT(info->limits().max_streams_per_client(), 0u);
  EXPECT_GT(info->limits().max_expression_bytes(), 0u);
  EXPECT_EQ(info->limits().max_inline_values(), 4096u);

  // memory_used and buffer_count cover every client.
  std::unique_ptr<Client> other = server_->Connect("other");
  ASSERT_NE(other, nullptr);
  MustCreate(*client_, CreateRequest(v1::DTYPE_INT64, {100}));
  MustCreate(*other, CreateRequest(v1::DTYPE_BOOL, {7}));
  MustUploadNew(*other, v1::DTYPE_FLOAT32, {3}, std::string(12, '\0'));
  info = other->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->memory_used_bytes(), 800u + 7u + 12u);
  EXPECT_EQ(info->buffer_count(), 3u);

  // Another server reports the limit it was started with, and its thread count.
  std::unique_ptr<TestServer> odd = TestServer::Start(123456789, 1);
  ASSERT_NE(odd, nullptr);
  std::unique_ptr<Client> odd_client = odd->Connect();
  ASSERT_NE(odd_client, nullptr);
  absl::StatusOr<v1::ServerInfo> odd_info = odd_client->GetServerInfo();
  ASSERT_OK(odd_info);
  EXPECT_EQ(odd_info->memory_limit_bytes(), 123456789u);
  ASSERT_EQ(odd_info->devices_size(), info->devices_size());
  if (cpu) {
    EXPECT_EQ(odd_info->devices(0).compute_units(), 1);
  }
}

// The pool of device 0 as GetServerInfo reports it.
std::pair<uint64_t, uint64_t> Pool0(Client& client) {
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  EXPECT_OK(info);
  if (!info.ok() || info->devices_size() == 0) return {~uint64_t{0}, ~uint64_t{0}};
  return {info->devices(0).pool_reserved_bytes(), info->devices(0).pool_used_bytes()};
}

// What the pool counts as used for a buffer of `bytes` (the API's pool_used_bytes): the
// bytes themselves on the CPU backend; on CUDA at least those and at most the next power
// of two from 256 bytes, the small-block cache's granularity (larger blocks come from the
// stream-ordered pool, which rounds less).
uint64_t MaxPoolBytes(uint64_t bytes) {
  if (TestBackendName() == "cpu") return bytes;
  return std::max<uint64_t>(256, std::bit_ceil(bytes));
}

// Used bytes follow the buffers: exactly on the CPU backend, rounded up on CUDA (by at most
// MaxPoolBytes). The CPU backend reserves what it uses plus the freed blocks of 1 MiB and
// more it keeps (none of these small buffers); a CUDA pool reserves in large granules and
// keeps freed memory, so it only holds at least what is used.
void ExpectPool(Client& client, uint64_t used_at_least, uint64_t used_at_most,
                uint64_t cpu_reserved) {
  const auto [reserved, got_used] = Pool0(client);
  EXPECT_GE(got_used, used_at_least);
  EXPECT_LE(got_used, used_at_most);
  if (TestBackendName() == "cpu") {
    EXPECT_EQ(reserved, cpu_reserved);
  } else {
    EXPECT_GE(reserved, got_used);
  }
}

TEST_F(ServerBuffersTest, PoolUsageFollowsBuffers) {
  const auto [reserved0, used0] = Pool0(*client_);
  EXPECT_GE(reserved0, used0);

  const uint64_t a_max = MaxPoolBytes(8000), b_max = MaxPoolBytes(100);
  v1::BufferInfo a = MustCreate(*client_, CreateRequest(v1::DTYPE_FLOAT64, {1000}));
  ExpectPool(*client_, used0 + 8000, used0 + a_max, reserved0 + 8000);
  v1::BufferInfo b = MustUploadNew(*client_, v1::DTYPE_INT32, {25}, std::string(100, '\1'));
  ExpectPool(*client_, used0 + 8100, used0 + a_max + b_max, reserved0 + 8100);
  const auto [reserved_both, used_both] = Pool0(*client_);
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_OK(stats);
  ASSERT_GE(stats->pools_size(), 1);
  EXPECT_EQ(stats->pools(0).device(), 0);
  EXPECT_EQ(stats->pools(0).used_bytes(), used_both);
  EXPECT_GE(stats->pools(0).reserved_bytes(), used_both);
  EXPECT_EQ(stats->backend_error(), "");

  ASSERT_OK(client_->DeleteBuffer(a.id()));
  ExpectPool(*client_, used0 + 100, used0 + b_max, reserved0 + 100);
  ASSERT_OK(client_->DeleteBuffer(b.id()));
  ExpectPool(*client_, used0, used0, reserved0);
}

// Trimming returns the memory kept beyond the live buffers and never what they use. On
// the CPU backend a freed 2 MiB buffer is kept until then.
TEST_F(ServerBuffersTest, TrimMemoryPoolReportsEachDevice) {
  MustCreate(*client_, CreateRequest(v1::DTYPE_INT64, {64}));
  const v1::BufferInfo freed = MustCreate(*client_, CreateRequest(v1::DTYPE_FLOAT64, {1 << 18}));
  ASSERT_OK(client_->DeleteBuffer(freed.id()));
  const auto [reserved, used] = Pool0(*client_);
  if (TestBackendName() == "cpu") {
    EXPECT_GE(reserved, used + (2 << 20));
  }
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_OK(info);
  const int devices = info->devices_size();
  for (std::optional<int> device : {std::optional<int>(), std::optional<int>(0)}) {
    absl::StatusOr<v1::TrimMemoryPoolResponse> trimmed = client_->TrimMemoryPool(device, 0);
    ASSERT_OK(trimmed);
    // Every device's pool when none is named, in order; else the one named.
    ASSERT_EQ(trimmed->pools_size(), device.has_value() ? 1 : devices)
        << trimmed->ShortDebugString();
    for (int i = 0; i < trimmed->pools_size(); ++i) EXPECT_EQ(trimmed->pools(i).device(), i);
    EXPECT_LE(trimmed->pools(0).reserved_bytes(), reserved);
    EXPECT_GE(trimmed->pools(0).reserved_bytes(), used);
    if (TestBackendName() == "cpu") {
      EXPECT_EQ(trimmed->pools(0).reserved_bytes(), used);
    }
    EXPECT_EQ(trimmed->pools(0).used_bytes(), used);
    EXPECT_GE(trimmed->pools(0).used_bytes(), 512u);
  }
  const Snapshot snapshot = TakeSnapshot(*client_);
  for (int device : {devices, -1, 1000}) {
    absl::StatusOr<v1::TrimMemoryPoolResponse> trimmed = client_->TrimMemoryPool(device, 1 << 20);
    EXPECT_EQ(trimmed.status().code(), Code::kInvalidArgument)
        << device << ": " << trimmed.status();
  }
  EXPECT_EQ(TakeSnapshot(*client_), snapshot);
}

TEST_F(ServerBuffersTest, ProfilerIsFailedPreconditionOnCpu) {
  if (TestBackendName() != "cpu") {
    // CUDA starts and stops the profiler's capture range.
    EXPECT_OK(client_->StartProfiler());
    EXPECT_OK(client_->StopProfiler());
    return;
  }
  absl::Status start = client_->StartProfiler();
  EXPECT_EQ(start.code(), Code::kFailedPrecondition) << start;
  EXPECT_NE(start.message().find("cpu"), std::string_view::npos) << start;
  absl::Status stop = client_->StopProfiler();
  EXPECT_EQ(stop.code(), Code::kFailedPrecondition) << stop;
}

TEST_F(ServerBuffersTest, GetStatsCountsTransfers) {
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_OK(stats);
  EXPECT_EQ(FindKind(*stats, v1::OPERATION_KIND_UPLOAD), nullptr);
  EXPECT_EQ(FindKind(*stats, v1::OPERATION_KIND_DOWNLOAD), nullptr);

  // Three uploads: two that create, one into a range of an existing buffer.
  v1::BufferInfo a = MustUploadNew(*client_, v1::DTYPE_BOOL, {1000}, RandomBytes(1000, 1, true));
  v1::BufferInfo b = MustUploadNew(*client_, v1::DTYPE_INT32, {1024}, RandomBytes(4096, 2));
  ASSERT_OK(client_->Upload(RangeHeader(b.id(), 10, 100), AsBytes(RandomBytes(100, 3))));
  // Two downloads: a whole buffer and a range.
  EXPECT_EQ(MustDownload(*client_, a.id()).size(), 1000u);
  EXPECT_EQ(MustDownload(*client_, b.id(), 7, 10).size(), 10u);
  // Transfers refused at their header count for nothing.
  EXPECT_FALSE(client_->Upload(RangeHeader(b.id(), 4090, 100), AsBytes(RandomBytes(100, 3))).ok());
  EXPECT_FALSE(DownloadBytes(*client_, b.id(), 4097, 0).ok());
  // One that started and ended short counts as a failed upload (not cancelled, not timed
  // out).
  EXPECT_EQ(
      GrpcCode(RawUpload(*server_, {HeaderMessage(RangeHeader(b.id(), 0, 8)), ChunkMessage("x")})),
      Code::kInvalidArgument);

  // Upload staging memory is returned only after the answer (see
  // UploadMemoryIsReturnedBeforeTheAnswer); wait for it so memory_used is settled.
  EXPECT_EQ(WaitForMemoryUsed(*client_, 1000 + 4096), 1000u + 4096u);
  stats = client_->GetStats();
  ASSERT_OK(stats);
  const v1::KindStats* upload = FindKind(*stats, v1::OPERATION_KIND_UPLOAD);
  const v1::KindStats* download = FindKind(*stats, v1::OPERATION_KIND_DOWNLOAD);
  ASSERT_NE(upload, nullptr) << stats->ShortDebugString();
  ASSERT_NE(download, nullptr) << stats->ShortDebugString();
  EXPECT_EQ(upload->count(), 4u);
  EXPECT_EQ(upload->failed(), 1u);
  EXPECT_EQ(upload->cancelled(), 0u);
  EXPECT_EQ(upload->timed_out(), 0u);
  EXPECT_EQ(upload->bytes_written(), 1000u + 4096u + 100u);
  EXPECT_EQ(upload->bytes_read(), 0u);
  EXPECT_EQ(download->count(), 2u);
  EXPECT_EQ(download->failed(), 0u);
  EXPECT_EQ(download->cancelled(), 0u);
  EXPECT_EQ(download->bytes_read(), 1000u + 10u);
  EXPECT_EQ(download->bytes_written(), 0u);
  for (const v1::KindStats& k : stats->kinds()) EXPECT_GT(k.count(), 0u) << k.ShortDebugString();
  EXPECT_EQ(stats->memory_used_bytes(), 1000u + 4096u);
  EXPECT_GE(stats->memory_peak_bytes(), 1000u + 4096u);
  EXPECT_GT(stats->uptime_seconds(), 0.0);
}

// ---------------------------------------------------------------------------
// 6. Health

// The services the health service reports on, besides "" (the server as a whole).
const char* const kServiceNames[] = {"gpucompute.v1.BufferService", "gpucompute.v1.StreamService",
                                     "gpucompute.v1.OperationService",
                                     "gpucompute.v1.ServerService"};

// grpc.health.v1.Health/Check for `service` ("" is the server as a whole), hand-encoded:
// HealthCheckRequest{service} is field 1, length-delimited. Returns the call's status
// and the raw HealthCheckResponse bytes.
std::pair<grpc::Status, std::string> HealthCheck(const TestServer& server,
                                                 const std::string& service) {
  grpc::GenericStub stub(server.RawChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const std::string request_bytes =
      service.empty() ? std::string()
                      : std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  std::string bytes;
  std::vector<grpc::Slice> slices;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return {status, bytes};
}

// HealthCheckResponse{status: SERVING} and {status: NOT_SERVING}: field 1, varint.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

TEST_F(ServerBuffersTest, HealthCheckIsServing) {
  // HealthCheckRequest{} is the empty message: the server as a whole.
  auto [status, bytes] = HealthCheck(*server_, "");
  ASSERT_OK(status);
  EXPECT_EQ(bytes, kServing);
  for (const char* service : kServiceNames) {
    auto [service_status, service_bytes] = HealthCheck(*server_, service);
    ASSERT_OK(service_status) << service;
    EXPECT_EQ(service_bytes, kServing) << service;
  }

  // A service the server does not know is NOT_FOUND.
  auto [unknown, unknown_bytes] = HealthCheck(*server_, "no.such.S");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
}

// After the backend reports a failure, the server says NOT_SERVING, refuses every call
// that would touch the device with UNAVAILABLE, and still answers queries and deletes.
TEST_F(ServerBuffersTest, BackendFailureRefusesWorkAndReportsNotServing) {
  v1::BufferInfo kept =
      MustUploadNew(*client_, v1::DTYPE_INT32, {4}, std::string(16, '\x07'), "kept");
  v1::BufferInfo doomed = MustCreate(*client_, CreateRequest(v1::DTYPE_FLOAT64, {8}, "doomed"));
  absl::StatusOr<v1::StreamInfo> stream = client_->CreateStream();
  ASSERT_OK(stream);
  absl::StatusOr<v1::Operation> before = client_->Submit([&] {
    v1::SubmitRequest r =
        Elementwise("x + 1", {{"x", BufferOperand("kept")}}, ExistingOutput("kept"));
    r.set_wait(true);
    return r;
  }());
  ASSERT_OK(before);
  const Snapshot snapshot = TakeSnapshot(*client_);

  server_->server().backend().ReportFailure(absl::InternalError("injected"));
  // The first report wins; a second changes nothing.
  server_->server().backend().ReportFailure(absl::DataLossError("second"));

  std::vector<std::string> services = {""};
  services.insert(services.end(), std::begin(kServiceNames), std::end(kServiceNames));
  for (const std::string& service : services) {
    auto [status, bytes] = HealthCheck(*server_, service);
    ASSERT_OK(status) << "'" << service << "'";
    EXPECT_EQ(bytes, kNotServing) << "'" << service << "'";
  }

  auto expect_refused = [](const absl::Status& status, std::string_view what) {
    EXPECT_EQ(status.code(), Code::kUnavailable) << what << ": " << status;
    EXPECT_NE(status.message().find(
                  absl::StrCat(TestBackendName(), " backend failed (INTERNAL: injected)")),
              std::string_view::npos)
        << what << ": " << status;
    EXPECT_NE(status.message().find("until it is restarted"), std::string_view::npos)
        << what << ": " << status;
  };
  expect_refused(client_->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT32, {4})).status(),
                 "CreateBuffer");
  expect_refused(
      client_->Upload(CreateHeader(v1::DTYPE_INT32, {4}), AsBytes(std::string(16, '\0'))).status(),
      "Upload new");
  expect_refused(
      client_->Upload(RangeHeader(kept.id(), 0, 4), AsBytes(std::string(4, '\0'))).status(),
      "Upload range");
  expect_refused(DownloadBytes(*client_, kept.id()).status(), "Download");
  expect_refused(client_->Submit(Elementwise("x * 2", {{"x", BufferOperand("kept")}})).status(),
                 "Submit");
  expect_refused(client_->CreateStream().status(), "CreateStream");
  expect_refused(client_->SynchronizeStream(stream->id()).status(), "SynchronizeStream");
  expect_refused(client_->SynchronizeStream("").status(), "SynchronizeStream default");

  // Queries answer, and nothing changed.
  EXPECT_EQ(TakeSnapshot(*client_), snapshot);
  absl::StatusOr<v1::BufferInfo> got = client_->GetBuffer("kept");
  ASSERT_OK(got);
  EXPECT_EQ(got->id(), kept.id());
  absl::StatusOr<v1::Operation> op = client_->GetOperation(before->id());
  ASSERT_OK(op);
  EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  absl::StatusOr<v1::ListStreamsResponse> streams = client_->ListStreams();
  ASSERT_OK(streams);
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_OK(info);
  EXPECT_EQ(info->backend_error(), "INTERNAL: injected");
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->backend_error(), "INTERNAL: injected");
  // Deletes still release what the server holds.
  EXPECT_OK(client_->DeleteBuffer("doomed"));
  EXPECT_OK(client_->DeleteStream(stream->id()));
  EXPECT_EQ(WaitForMemoryUsed(*client_, 16), 16u);
  absl::StatusOr<v1::ListBuffersResponse> list = client_->ListBuffers();
  ASSERT_OK(list);
  ASSERT_EQ(list->buffers_size(), 1);
  EXPECT_EQ(list->buffers(0).id(), kept.id());
  (void)doomed;
}

// Server reflection lists the API's services (grpc.reflection.v1alpha, as grpc_cli and
// grpcurl use it). Hand-encoded: ServerReflectionRequest{list_services: ""} is field 7,
// length 0.
TEST_F(ServerBuffersTest, ReflectionListsTheServices) {
  grpc::GenericStub stub(server_->RawChannel());
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto next = [&](void* want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, want);
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  int tags[5];
  call->StartCall(&tags[0]);
  ASSERT_TRUE(next(&tags[0]));
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, &tags[1]);
  ASSERT_TRUE(next(&tags[1]));
  call->WritesDone(&tags[2]);
  ASSERT_TRUE(next(&tags[2]));
  grpc::ByteBuffer response;
  call->Read(&response, &tags[3]);
  ASSERT_TRUE(next(&tags[3]));
  grpc::Status status;
  call->Finish(&status, &tags[4]);
  next(&tags[4]);
  EXPECT_OK(status);
  std::vector<grpc::Slice> slices;
  ASSERT_OK(response.Dump(&slices));
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  for (const char* service :
       {"gpucompute.v1.BufferService", "gpucompute.v1.StreamService",
        "gpucompute.v1.OperationService", "gpucompute.v1.ServerService", "grpc.health.v1.Health"}) {
    EXPECT_NE(bytes.find(service), std::string::npos) << service << " is not listed";
  }
}

// ---------------------------------------------------------------------------
// 7. Bad client metadata

TEST_F(ServerBuffersTest, MalformedClientNameIsInvalidArgument) {
  // A buffer of the client "default", reachable by id for the calls that need one.
  std::unique_ptr<v1::BufferService::Stub> stub = v1::BufferService::NewStub(server_->RawChannel());
  v1::CreateBufferResponse created;
  {
    std::unique_ptr<grpc::ClientContext> context = RawContext();
    ASSERT_OK(stub->CreateBuffer(
        context.get(), CreateRequest(v1::DTYPE_INT32, {4}, "mine", IntScalar(2)), &created));
  }
  std::unique_ptr<Client> as_default = server_->Connect("default");
  ASSERT_NE(as_default, nullptr);
  const Snapshot before = TakeSnapshot(*as_default);

  for (const std::string& name : {std::string(200, 'x'), std::string(129, 'y'), std::string()}) {
    SCOPED_TRACE(absl::StrCat("client name of ", name.size(), " characters"));
    auto context = [&] {
      auto c = std::make_unique<grpc::ClientContext>();
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      c->AddMetadata("gpucompute-client", name);
      return c;
    };
    {
      v1::CreateBufferResponse response;
      grpc::Status s =
          stub->CreateBuffer(context().get(), CreateRequest(v1::DTYPE_INT32, {4}, "n"), &response);
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    }
    {
      v1::GetBufferRequest request;
      request.set_buffer(created.buffer().id());
      v1::BufferInfo response;
      grpc::Status s = stub->GetBuffer(context().get(), request, &response);
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    }
    {
      v1::ListBuffersResponse response;
      grpc::Status s = stub->ListBuffers(context().get(), v1::ListBuffersRequest(), &response);
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    }
    {
      v1::DeleteBufferRequest request;
      request.set_buffer(created.buffer().id());
      v1::DeleteBufferResponse response;
      grpc::Status s = stub->DeleteBuffer(context().get(), request, &response);
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    }
    {
      v1::DownloadRequest request;
      request.set_buffer(created.buffer().id());
      auto c = context();
      std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
          stub->Download(c.get(), request);
      v1::DownloadResponse message;
      int messages = 0;
      while (reader->Read(&message)) ++messages;
      grpc::Status s = reader->Finish();
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
      EXPECT_EQ(messages, 0);
    }
    {
      auto c = context();
      v1::UploadResponse response;
      std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
          stub->Upload(c.get(), &response);
      if (writer->Write(HeaderMessage(RangeHeader(created.buffer().id(), 0, 4)))) {
        writer->Write(ChunkMessage(BytesOf<int32_t>(99)));
      }
      writer->WritesDone();
      grpc::Status s = writer->Finish();
      EXPECT_EQ(GrpcCode(s), Code::kInvalidArgument) << s.error_message();
    }
    EXPECT_EQ(TakeSnapshot(*as_default), before);
    EXPECT_EQ(MustDownload(*as_default, "mine"), Repeat(BytesOf<int32_t>(2), 4));
  }

  // 128 characters is the longest allowed name.
  std::unique_ptr<Client> longest = server_->Connect(std::string(128, 'z'));
  ASSERT_NE(longest, nullptr);
  EXPECT_OK(longest->CreateBuffer(CreateRequest(v1::DTYPE_INT32, {1}, "n")));
  // The library itself refuses a name the server would refuse.
  ClientOptions options;
  options.target = server_->target();
  options.client_name = std::string(200, 'x');
  EXPECT_EQ(Client::Connect(options).status().code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// 8. Names and listings are per client; ids are capabilities

TEST_F(ServerBuffersTest, NamesAndListingsArePerClient) {
  std::unique_ptr<Client> a = server_->Connect("a");
  std::unique_ptr<Client> b = server_->Connect("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  v1::BufferInfo b_x = MustCreate(*b, CreateRequest(v1::DTYPE_INT32, {3}, "x", IntScalar(11)));
  v1::BufferInfo b_y =
      MustUploadNew(*b, v1::DTYPE_FLOAT64, {2}, BytesOf<double>(0.5) + BytesOf<double>(-1.0), "y");

  // By name, a sees nothing of b's.
  EXPECT_EQ(a->GetBuffer("x").status().code(), Code::kNotFound);
  EXPECT_EQ(DownloadBytes(*a, "y").status().code(), Code::kNotFound);
  EXPECT_EQ(a->DeleteBuffer("x").code(), Code::kNotFound);
  EXPECT_EQ(a->Upload(RangeHeader("x", 0), AsBytes(BytesOf<int32_t>(0))).status().code(),
            Code::kNotFound);
  absl::StatusOr<v1::ListBuffersResponse> a_list = a->ListBuffers();
  ASSERT_OK(a_list);
  EXPECT_EQ(a_list->buffers_size(), 0);
  EXPECT_EQ(a_list->total_bytes(), 0u);
  // Neither does the default client.
  EXPECT_EQ(client_->GetBuffer("x").status().code(), Code::kNotFound);

  // By id, a reaches them: the id is the capability.
  absl::StatusOr<v1::BufferInfo> by_id = a->GetBuffer(b_x.id());
  ASSERT_OK(by_id);
  EXPECT_TRUE(MessageDifferencer::Equals(*by_id, b_x));
  EXPECT_EQ(MustDownload(*a, b_y.id()), BytesOf<double>(0.5) + BytesOf<double>(-1.0));

  // a may use the same names for its own buffers; each client resolves its own.
  v1::BufferInfo a_x = MustCreate(*a, CreateRequest(v1::DTYPE_INT32, {3}, "x", IntScalar(22)));
  EXPECT_NE(a_x.id(), b_x.id());
  EXPECT_EQ(MustDownload(*a, "x"), Repeat(BytesOf<int32_t>(22), 3));
  EXPECT_EQ(MustDownload(*b, "x"), Repeat(BytesOf<int32_t>(11), 3));
  a_list = a->ListBuffers();
  ASSERT_OK(a_list);
  ASSERT_EQ(a_list->buffers_size(), 1);
  EXPECT_EQ(a_list->buffers(0).id(), a_x.id());
  EXPECT_EQ(a_list->total_bytes(), 12u);
  absl::StatusOr<v1::ListBuffersResponse> b_list = b->ListBuffers();
  ASSERT_OK(b_list);
  ASSERT_EQ(b_list->buffers_size(), 2);
  EXPECT_EQ(b_list->buffers(0).id(), b_x.id());
  EXPECT_EQ(b_list->buffers(1).id(), b_y.id());
  EXPECT_EQ(b_list->total_bytes(), 12u + 16u);

  // a writes into b's buffer by id, and b sees it by name.
  ASSERT_OK(a->Upload(RangeHeader(b_x.id(), 4), AsBytes(BytesOf<int32_t>(-5))));
  EXPECT_EQ(MustDownload(*b, "x"),
            BytesOf<int32_t>(11) + BytesOf<int32_t>(-5) + BytesOf<int32_t>(11));
  // Deleting "x" as a deletes a's own; b's stays.
  ASSERT_OK(a->DeleteBuffer("x"));
  EXPECT_EQ(a->GetBuffer(a_x.id()).status().code(), Code::kNotFound);
  EXPECT_OK(b->GetBuffer("x"));
  // Deleting b's buffer by id as a removes it, name and all, for b too.
  ASSERT_OK(a->DeleteBuffer(b_x.id()));
  EXPECT_EQ(b->GetBuffer("x").status().code(), Code::kNotFound);
  b_list = b->ListBuffers();
  ASSERT_OK(b_list);
  ASSERT_EQ(b_list->buffers_size(), 1);
  EXPECT_EQ(b_list->buffers(0).id(), b_y.id());

  // Calls without a client name belong to "default".
  std::unique_ptr<Client> unnamed = server_->Connect("");
  std::unique_ptr<Client> named_default = server_->Connect("default");
  ASSERT_NE(unnamed, nullptr);
  ASSERT_NE(named_default, nullptr);
  v1::BufferInfo d =
      MustCreate(*unnamed, CreateRequest(v1::DTYPE_BOOL, {2}, "d", BoolScalar(true)));
  absl::StatusOr<v1::BufferInfo> d_again = named_default->GetBuffer("d");
  ASSERT_OK(d_again);
  EXPECT_EQ(d_again->id(), d.id());
  EXPECT_EQ(a->GetBuffer("d").status().code(), Code::kNotFound);
}

// ---------------------------------------------------------------------------
// Freed memory: a buffer no write has covered reads as zeros, never as the bytes of a
// buffer freed before it (the block caches recycle blocks).

// Alice's freed 2^20 float64 of 7.25, then Bob's new buffer of the same size without
// fill: every element Bob downloads is 0.0.
TEST(ServerBuffersTenantsTest, UnfilledBufferNeverShowsAnotherTenantsFreedBytes) {
  const std::filesystem::path tokens = std::filesystem::temp_directory_path() /
                                       absl::StrCat("gpucompute_zeroing_tokens_", ::getpid());
  std::ofstream(tokens, std::ios::trunc) << "alice-token-5e1 alice\nbob-token-0b2 bob\n";
  std::unique_ptr<TestServer> server =
      TestServer::StartWith(nullptr, 256 * kMiB, 2, [&](ServerOptions& o) {
        o.tokens_file = tokens.string();
      });
  std::filesystem::remove(tokens);
  ASSERT_NE(server, nullptr);
  auto as = [&](const std::string& token) -> std::unique_ptr<Client> {
    absl::StatusOr<std::unique_ptr<Client>> client =
        server->ConnectWith([&](ClientOptions& o) { o.token = token; });
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  };
  std::unique_ptr<Client> alice = as("alice-token-5e1");
  std::unique_ptr<Client> bob = as("bob-token-0b2");
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);

  constexpr uint64_t kCount = uint64_t{1} << 20;
  absl::StatusOr<v1::BufferInfo> secret =
      alice->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT64, {kCount}, "", FloatScalar(7.25)));
  ASSERT_OK(secret);
  absl::StatusOr<std::vector<double>> written = DownloadArray<double>(*alice, secret->id());
  ASSERT_OK(written);
  ASSERT_EQ(written->size(), kCount);
  ASSERT_EQ((*written)[kCount - 1], 7.25);
  ASSERT_OK(alice->DeleteBuffer(secret->id()));

  absl::StatusOr<v1::BufferInfo> fresh =
      bob->CreateBuffer(CreateRequest(v1::DTYPE_FLOAT64, {kCount}));
  ASSERT_OK(fresh);
  absl::StatusOr<std::vector<double>> seen = DownloadArray<double>(*bob, fresh->id());
  ASSERT_OK(seen);
  ASSERT_EQ(seen->size(), kCount);
  const auto not_zero = std::count_if(seen->begin(), seen->end(), [](double v) {
    return std::bit_cast<uint64_t>(v) != 0;
  });
  EXPECT_EQ(not_zero, 0) << "of " << kCount << " elements; the first is " << seen->front();
}

// Within one client too, for every dtype: create, fill, delete, create without fill.
TEST_F(ServerBuffersTest, UnfilledBufferAfterADeleteReadsAsZeros) {
  for (const auto& [dtype, fill] :
       {std::pair{v1::DTYPE_FLOAT64, FloatScalar(-3.5)},
        std::pair{v1::DTYPE_FLOAT32, FloatScalar(2.0)}, std::pair{v1::DTYPE_INT64, IntScalar(-1)}, std::pair{v1::DTYPE_INT32, IntScalar(77)},
        std::pair{v1::DTYPE_BOOL, BoolScalar(true)}}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const std::vector<uint64_t> shape = {256, 1024};
    const uint64_t bytes = Elements(shape) * ItemSize(dtype);
    v1::BufferInfo old = MustCreate(*client_, CreateRequest(dtype, shape, "old", fill));
    ASSERT_NE(MustDownload(*client_, old.id()), std::string(bytes, '\0'));
    ASSERT_OK(client_->DeleteBuffer(old.id()));
    v1::BufferInfo fresh = MustCreate(*client_, CreateRequest(dtype, shape, "fresh"));
    const std::string seen = MustDownload(*client_, fresh.id());
    EXPECT_EQ(seen.size(), bytes);
    EXPECT_EQ(seen.find_first_not_of('\0'), std::string::npos) << "a byte is not zero";
    ASSERT_OK(client_->DeleteBuffer(fresh.id()));
  }
}

}  // namespace
}  // namespace gpucompute

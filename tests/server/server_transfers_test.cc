// End-to-end tests of the transfer paths over a real socket: zero-copy chunks, multi-range
// uploads (BufferService.BeginUpload) split every way, parallel downloads, CRC32C, and the
// failures of each (a corrupted chunk, a cancelled range, bad range headers, an idle
// upload), each followed by a check that nothing changed and no memory stayed held.
// Expected bytes come from a seeded generator; CRC32C from the table implementation and a
// published check value.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "common/crc32c.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "common/grpc_tuning.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using ::gpucompute::testing::AsBytes;
using ::gpucompute::testing::CreateFloat64;
using ::gpucompute::testing::DownloadBytes;
using ::gpucompute::testing::MemoryUsed;
using ::gpucompute::testing::Snapshot;
using ::gpucompute::testing::TakeSnapshot;
using ::gpucompute::testing::TestServer;
using ::gpucompute::testing::WaitForMemoryUsed;
using Code = absl::StatusCode;

std::string RandomBytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

v1::UploadHeader IntoBuffer(const std::string& id, uint64_t offset, uint64_t size) {
  v1::UploadHeader header;
  header.set_buffer(id);
  header.set_offset_bytes(offset);
  header.set_size_bytes(size);
  return header;
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& client_name = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!client_name.empty()) context->AddMetadata(kClientMetadataKey, client_name);
  return context;
}

Code GrpcCode(const grpc::Status& s) { return static_cast<Code>(s.error_code()); }

// Sends `header`, then `bytes` in chunks of 1024 each with its CRC32C, over a plain
// protobuf stub; the chunk at `corrupt_at` carries a wrong CRC.
grpc::Status SendWithCrc(v1::BufferService::Stub& stub, const v1::UploadHeader& header,
                         std::string_view bytes, uint64_t corrupt_at = UINT64_MAX) {
  auto context = Context();
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      stub.Upload(context.get(), &response);
  v1::UploadRequest request;
  *request.mutable_header() = header;
  writer->Write(request);
  for (uint64_t at = 0; at < bytes.size(); at += 1024) {
    v1::UploadRequest chunk;
    chunk.set_chunk(std::string(bytes.substr(at, 1024)));
    const uint32_t crc = ExtendCrc32cPortable(0, chunk.chunk().data(), chunk.chunk().size());
    chunk.set_chunk_crc32c(at == corrupt_at ? crc ^ 1 : crc);
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

class ServerTransfersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("", /*chunk_bytes=*/1000);
    ASSERT_NE(client_, nullptr);
  }

  // A plain protobuf stub, as an older client or another language uses.
  std::unique_ptr<v1::BufferService::Stub> Stub() {
    return v1::BufferService::NewStub(server_->RawChannel());
  }

  // Uploads the ranges [splits[i], splits[i+1]) of `data` concurrently, each on its own
  // connection, into a multi-range upload of `header`; returns each range's outcome.
  std::vector<absl::StatusOr<v1::UploadResponse>> UploadSplit(const v1::UploadHeader& header,
                                                              const std::string& data,
                                                              const std::vector<uint64_t>& splits) {
    v1::BeginUploadRequest begin;
    *begin.mutable_header() = header;
    begin.mutable_header()->set_size_bytes(data.size());
    absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
    EXPECT_OK(started);
    if (!started.ok()) return {started.status()};
    EXPECT_EQ(started->size_bytes(), data.size());
    std::vector<absl::StatusOr<v1::UploadResponse>> results(splits.size() - 1,
                                                            absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i + 1 < splits.size(); ++i) {
      threads.emplace_back([&, i] {
        const std::string_view range =
            std::string_view(data).substr(splits[i], splits[i + 1] - splits[i]);
        results[i] = client_->UploadRange(started->transfer_id(), splits[i], AsBytes(range),
                                          static_cast<int>(i));
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// The published check value of CRC32C, and the SSE4.2 path against the table.
TEST(Crc32cTest, MatchesCheckValueAndTable) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  const std::string data = RandomBytes(100003, 1);
  for (size_t n : {0, 1, 7, 8, 9, 63, 4096, 100003}) {
    EXPECT_EQ(ExtendCrc32c(0, data.data(), n), ExtendCrc32cPortable(0, data.data(), n)) << n;
  }
  EXPECT_EQ(ExtendCrc32c(ExtendCrc32c(0, data.data(), 1000), data.data() + 1000, 99003),
            Crc32c(data));
}

// Every split of an upload into ranges: one range, halves, ranges ending inside an
// element, uneven last ranges, one-byte ranges, ranges sent in reverse order; into a new
// buffer and into a byte range of an existing one.
TEST_F(ServerTransfersTest, MultiRangeUploadEverySplit) {
  constexpr uint64_t kElements = 1000;
  const uint64_t bytes = kElements * 8;
  const std::vector<std::vector<uint64_t>> splits = {
      {0, bytes},
      {0, bytes / 2, bytes},
      {0, 3, bytes},                     // ends inside the first element
      {0, 5, 13, 4001, bytes - 1, bytes},  // mid-element everywhere, one-byte last
      {0, 2667, 5334, bytes},            // three, the last uneven
      {0, 1, 2, 3, 4, 5, 6, 7, 8, bytes},
  };
  uint64_t seed = 10;
  for (const std::vector<uint64_t>& split : splits) {
    SCOPED_TRACE(absl::StrCat(split.size() - 1, " ranges, the second boundary ", split[1]));
    const std::string data = RandomBytes(bytes, ++seed);
    const uint64_t before = MemoryUsed(*client_);
    std::vector<absl::StatusOr<v1::UploadResponse>> results =
        UploadSplit(CreateFloat64(kElements), data, split);
    std::string id;
    for (const absl::StatusOr<v1::UploadResponse>& r : results) {
      ASSERT_OK(r);
      if (id.empty()) id = r->buffer().id();
      EXPECT_EQ(r->buffer().id(), id) << "every range answers with the one buffer";
      EXPECT_EQ(r->buffer().size_bytes(), bytes);
    }
    absl::StatusOr<std::string> back = DownloadBytes(*client_, id);
    ASSERT_OK(back);
    EXPECT_TRUE(*back == data);
    EXPECT_EQ(MemoryUsed(*client_), before + bytes);

    // The same split into bytes [24, 24 + bytes) of a larger existing buffer.
    const std::string base = RandomBytes(bytes + 64, ++seed);
    absl::StatusOr<v1::UploadResponse> existing =
        client_->Upload(CreateFloat64(kElements + 8), AsBytes(base));
    ASSERT_OK(existing);
    const uint64_t with_target = MemoryUsed(*client_);
    results = UploadSplit(IntoBuffer(existing->buffer().id(), 24, bytes), data, split);
    for (const absl::StatusOr<v1::UploadResponse>& r : results) ASSERT_OK(r);
    std::string expected = base;
    expected.replace(24, bytes, data);
    back = DownloadBytes(*client_, existing->buffer().id());
    ASSERT_OK(back);
    EXPECT_TRUE(*back == expected);
    EXPECT_EQ(WaitForMemoryUsed(*client_, with_target), with_target) << "staging is released";
  }
}

// The library's own split (transfer_streams) and its parallel download, also with
// checksums, for stream counts that leave an uneven last range.
TEST_F(ServerTransfersTest, ClientSplitsUploadsAndDownloads) {
  const std::string data = RandomBytes(8 * 10007, 3);
  for (int streams : {1, 2, 3, 7}) {
    for (bool checksums : {false, true}) {
      SCOPED_TRACE(absl::StrCat(streams, " streams, checksums ", checksums));
      ClientOptions options;
      options.target = server_->target();
      options.chunk_bytes = 4096;
      options.transfer_streams = streams;
      options.checksums = checksums;
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      ASSERT_OK(client);
      absl::StatusOr<v1::UploadResponse> up =
          (*client)->Upload(CreateFloat64(10007), AsBytes(data));
      ASSERT_OK(up);
      for (auto [offset, size] : {std::pair<uint64_t, uint64_t>{0, 0}, {5, 0}, {13, 70001}}) {
        v1::DownloadRequest request;
        request.set_buffer(up->buffer().id());
        request.set_offset_bytes(offset);
        request.set_size_bytes(size);
        std::string back;
        absl::StatusOr<v1::DownloadResponse> down = (*client)->Download(request, &back);
        ASSERT_OK(down);
        const uint64_t length = size == 0 ? data.size() - offset : size;
        EXPECT_TRUE(back == data.substr(offset, length)) << "offset " << offset;
        EXPECT_EQ(down->buffer().id(), up->buffer().id());
        EXPECT_EQ(down->transfer().bytes(), length);
      }
      ASSERT_OK((*client)->DeleteBuffer(up->buffer().id()));
    }
  }
}

// The environment's gRPC channel arguments: parsed strictly, applied by the server and by
// every channel of the client (transfers in one and in several streams still move the
// bytes exactly), and a malformed value stops both with the entry named.
TEST(GrpcArgsTest, EnvironmentArgumentsApplyToBothSidesAndBadOnesAreRefused) {
  ASSIGN_OR_FAIL(const GrpcIntArgs parsed,
                       ParseGrpcArgs(" grpc.http2.max_frame_size=16777215, a.b=-2,,"));
  EXPECT_EQ(parsed, (GrpcIntArgs{{"grpc.http2.max_frame_size", 16777215}, {"a.b", -2}}));
  EXPECT_TRUE(ParseGrpcArgs("").ok());
  for (const char* bad : {"a", "=1", "a=", "a=x", "a=1.5", "a=99999999999"}) {
    absl::StatusOr<GrpcIntArgs> refused = ParseGrpcArgs(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(refused.status().message(),
              absl::StrCat("'", bad, "' is not NAME=INTEGER (a gRPC channel argument)"));
  }

  struct Unset {
    ~Unset() { unsetenv(kGrpcArgsEnvironmentVariable); }
  } unset;
  ASSERT_EQ(setenv(kGrpcArgsEnvironmentVariable,
                   "grpc.http2.max_frame_size=16777215,grpc.http2.lookahead_bytes=1048576,"
                   "grpc.experimental.tcp_read_chunk_size=65536",
                   1),
            0);
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  const std::string data = RandomBytes(8 * 30011, 5);
  for (int streams : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(streams, " streams"));
    ASSIGN_OR_FAIL(std::unique_ptr<Client> client,
                         server->ConnectWith([&](ClientOptions& options) {
                           options.chunk_bytes = 4096;
                           options.transfer_streams = streams;
                         }));
    ASSIGN_OR_FAIL(const v1::UploadResponse up,
                         client->Upload(CreateFloat64(30011), AsBytes(data)));
    v1::DownloadRequest request;
    request.set_buffer(up.buffer().id());
    std::string back;
    ASSERT_OK(client->Download(request, &back));
    EXPECT_TRUE(back == data);
    ASSERT_OK(client->DeleteBuffer(up.buffer().id()));
  }

  ASSERT_EQ(setenv(kGrpcArgsEnvironmentVariable, "grpc.http2.max_frame_size=16777215,window", 1),
            0);
  const std::string message =
      "GPUCOMPUTE_GRPC_ARGS: 'window' is not NAME=INTEGER (a gRPC channel argument)";
  absl::StatusOr<std::unique_ptr<Client>> client =
      server->ConnectWith([](ClientOptions&) {});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.status().message(), message);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.backend = "cpu";
  options.cpu_threads = 1;
  options.measure_copy_ceiling = false;
  absl::StatusOr<std::unique_ptr<Server>> refused = Server::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), message);
}

// A single-stream download large enough that the client copies each chunk out on a
// thread behind the one receiving the next: every byte lands in place, whole and in a
// range that starts and ends mid-chunk, with and without checksums.
TEST_F(ServerTransfersTest, LargeSingleStreamDownloadsCopyBehindTheReader) {
  const uint64_t elements = (uint64_t{24} << 20) / 8 + 3;
  const std::string data = RandomBytes(8 * elements, 11);
  for (bool checksums : {false, true}) {
    SCOPED_TRACE(absl::StrCat("checksums ", checksums));
    ASSIGN_OR_FAIL(std::unique_ptr<Client> client,
                   server_->ConnectWith([&](ClientOptions& options) {
                     options.chunk_bytes = 1 << 20;
                     options.transfer_streams = 1;
                     options.checksums = checksums;
                   }));
    ASSIGN_OR_FAIL(const v1::UploadResponse up,
                   client->Upload(CreateFloat64(elements), AsBytes(data)));
    for (auto [offset, size] :
         {std::pair<uint64_t, uint64_t>{0, 0}, {5, (uint64_t{20} << 20) + 3}}) {
      v1::DownloadRequest request;
      request.set_buffer(up.buffer().id());
      request.set_offset_bytes(offset);
      request.set_size_bytes(size);
      request.set_chunk_bytes(1 << 20);
      std::string back = "stale";
      ASSIGN_OR_FAIL(const v1::DownloadResponse down, client->Download(request, &back));
      const uint64_t length = size == 0 ? data.size() - offset : size;
      EXPECT_EQ(back.size(), length);
      EXPECT_TRUE(back == data.substr(offset, length)) << "offset " << offset;
      EXPECT_EQ(down.transfer().bytes(), length);
    }
    ASSERT_OK(client->DeleteBuffer(up.buffer().id()));
  }
}

// A chunk whose CRC32C does not match fails with DATA_LOSS and changes nothing, on a plain
// upload into a new or an existing buffer and on one range of a multi-range upload (whose
// other range hears the same). A matching CRC is accepted.
TEST_F(ServerTransfersTest, CorruptedChunkIsDataLoss) {
  const std::string data = RandomBytes(8 * 512, 4);
  absl::StatusOr<v1::UploadResponse> existing = client_->Upload(CreateFloat64(512), AsBytes(data));
  ASSERT_OK(existing);
  const std::string id = existing->buffer().id();
  const Snapshot before = TakeSnapshot(*client_);
  const std::string other = RandomBytes(data.size(), 5);

  v1::UploadHeader create = CreateFloat64(512);
  create.set_size_bytes(data.size());
  grpc::Status s = SendWithCrc(*Stub(), create, other, 2048);
  EXPECT_EQ(GrpcCode(s), Code::kDataLoss) << s.error_message();
  s = SendWithCrc(*Stub(), IntoBuffer(id, 0, data.size()), other, 2048);
  EXPECT_EQ(GrpcCode(s), Code::kDataLoss) << s.error_message();
  EXPECT_EQ(TakeSnapshot(*client_), before);
  absl::StatusOr<std::string> back = DownloadBytes(*client_, id);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == data);

  // A range of a multi-range upload: the whole upload fails.
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = IntoBuffer(id, 0, data.size());
  absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
  ASSERT_OK(started);
  absl::StatusOr<v1::UploadResponse> first;
  std::thread good([&] {
    first = client_->UploadRange(started->transfer_id(), 0, AsBytes(other).subspan(0, 1000), 1);
  });
  v1::UploadHeader range;
  range.set_transfer_id(started->transfer_id());
  range.set_offset_bytes(1000);
  range.set_size_bytes(data.size() - 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Chunks of the range start at byte 1000; the third (at 2048 of the range) is corrupt.
  s = SendWithCrc(*Stub(), range, std::string_view(other).substr(1000), 2048);
  good.join();
  EXPECT_EQ(GrpcCode(s), Code::kDataLoss) << s.error_message();
  EXPECT_EQ(first.status().code(), Code::kDataLoss) << first.status();
  EXPECT_EQ(TakeSnapshot(*client_), before);
  back = DownloadBytes(*client_, id);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == data);

  // Correct checksums are accepted.
  s = SendWithCrc(*Stub(), IntoBuffer(id, 0, data.size()), other);
  EXPECT_TRUE(s.ok()) << s.error_message();
  back = DownloadBytes(*client_, id);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == other);
}

// Downloads with crc32c carry each message's CRC32C.
TEST_F(ServerTransfersTest, DownloadCarriesChecksums) {
  const std::string data = RandomBytes(8 * 3000, 6);
  absl::StatusOr<v1::UploadResponse> up = client_->Upload(CreateFloat64(3000), AsBytes(data));
  ASSERT_OK(up);
  v1::DownloadRequest request;
  request.set_buffer(up->buffer().id());
  request.set_offset_bytes(3);
  request.set_chunk_bytes(4096);
  request.set_crc32c(true);
  auto context = Context();
  std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
      Stub()->Download(context.get(), request);
  v1::DownloadResponse message;
  std::string back;
  int messages = 0;
  while (reader->Read(&message)) {
    ++messages;
    ASSERT_TRUE(message.has_data_crc32c());
    EXPECT_EQ(message.data_crc32c(),
              ExtendCrc32cPortable(0, message.data().data(), message.data().size()));
    back += message.data();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(messages, static_cast<int>((data.size() - 3 + 4095) / 4096));
  EXPECT_TRUE(back == data.substr(3));
}

// A range stream cancelled mid-transfer fails the whole upload: the other range, already
// complete and waiting, hears CANCELLED; nothing is visible; the memory is back.
TEST_F(ServerTransfersTest, CancelledRangeChangesNothing) {
  const std::string data = RandomBytes(8 * 4096, 7);
  const uint64_t start_memory = MemoryUsed(*client_);
  for (bool into_existing : {false, true}) {
    SCOPED_TRACE(into_existing ? "existing buffer" : "new buffer");
    std::string id;
    if (into_existing) {
      absl::StatusOr<v1::UploadResponse> up = client_->Upload(CreateFloat64(4096), AsBytes(data));
      ASSERT_OK(up);
      id = up->buffer().id();
    }
    const Snapshot before = TakeSnapshot(*client_);
    v1::BeginUploadRequest begin;
    *begin.mutable_header() =
        into_existing ? IntoBuffer(id, 0, data.size()) : CreateFloat64(4096);
    begin.mutable_header()->set_size_bytes(data.size());
    absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
    ASSERT_OK(started);
    EXPECT_EQ(MemoryUsed(*client_), before.memory_used_bytes + data.size()) << "reserved";
    const std::string other = RandomBytes(data.size(), 8);
    absl::StatusOr<v1::UploadResponse> first;
    std::thread waiting([&] {
      first = client_->UploadRange(started->transfer_id(), 0, AsBytes(other).subspan(0, 100), 1);
    });
    auto context = Context();
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        Stub()->Upload(context.get(), &response);
    v1::UploadRequest request;
    request.mutable_header()->set_transfer_id(started->transfer_id());
    request.mutable_header()->set_offset_bytes(100);
    request.mutable_header()->set_size_bytes(data.size() - 100);
    ASSERT_TRUE(writer->Write(request));
    v1::UploadRequest chunk;
    chunk.set_chunk(other.substr(100, 5000));
    ASSERT_TRUE(writer->Write(chunk));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    context->TryCancel();
    EXPECT_EQ(GrpcCode(writer->Finish()), Code::kCancelled);
    waiting.join();
    EXPECT_EQ(first.status().code(), Code::kCancelled) << first.status();
    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
    if (into_existing) {
      absl::StatusOr<std::string> back = DownloadBytes(*client_, id);
      ASSERT_OK(back);
      EXPECT_TRUE(*back == data);
      ASSERT_OK(client_->DeleteBuffer(id));
    }
    // The transfer is forgotten.
    absl::StatusOr<v1::UploadResponse> late =
        client_->UploadRange(started->transfer_id(), 0, AsBytes(other).subspan(0, 100));
    EXPECT_EQ(late.status().code(), Code::kNotFound) << late.status();
  }
  EXPECT_EQ(WaitForMemoryUsed(*client_, start_memory), start_memory);
}

// Bad range headers, each with its exact code; each fails the upload it names (a range
// already waiting hears the same), and nothing changes.
TEST_F(ServerTransfersTest, BadRangeHeadersAreRefused) {
  const std::string data = RandomBytes(4000, 9);
  const Snapshot before = TakeSnapshot(*client_);
  struct Case {
    std::string name;
    uint64_t offset;
    uint64_t size;
    bool with_target;
    Code code;
  };
  // The waiting range claims [0, 1000).
  const std::vector<Case> cases = {
      {"overlaps the claimed range", 999, 10, false, Code::kInvalidArgument},
      {"starts past the end", 4001, 1, false, Code::kInvalidArgument},
      {"ends past the end", 3000, 1001, false, Code::kInvalidArgument},
      {"offset near 2^64", UINT64_MAX, 2, false, Code::kInvalidArgument},
      {"empty", 2000, 0, false, Code::kInvalidArgument},
      {"names a target too", 2000, 10, true, Code::kInvalidArgument},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::BeginUploadRequest begin;
    *begin.mutable_header() = CreateFloat64(500);
    begin.mutable_header()->set_size_bytes(4000);
    begin.set_idle_timeout_seconds(0.5);
    absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
    ASSERT_OK(started);
    absl::StatusOr<v1::UploadResponse> first;
    std::thread waiting([&] {
      first = client_->UploadRange(started->transfer_id(), 0, AsBytes(data).subspan(0, 1000), 1);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto context = Context();
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        Stub()->Upload(context.get(), &response);
    v1::UploadRequest request;
    request.mutable_header()->set_transfer_id(started->transfer_id());
    request.mutable_header()->set_offset_bytes(c.offset);
    request.mutable_header()->set_size_bytes(c.size);
    if (c.with_target) *request.mutable_header()->mutable_create() = begin.header().create();
    writer->Write(request);
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    waiting.join();
    EXPECT_EQ(GrpcCode(s), c.code) << s.error_message();
    if (c.with_target) {
      // Refused before it joined the upload: the upload goes on, and fails idle later.
      EXPECT_EQ(first.status().code(), Code::kDeadlineExceeded) << first.status();
    } else {
      EXPECT_EQ(first.status().code(), c.code) << first.status();
    }
    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
  }
  // Unknown ids, and another client's, are NOT_FOUND.
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(500);
  absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
  ASSERT_OK(started);
  std::unique_ptr<Client> stranger = server_->Connect("stranger");
  ASSERT_NE(stranger, nullptr);
  for (const std::string& id : {std::string("upl-0123"), started->transfer_id()}) {
    absl::StatusOr<v1::UploadResponse> r =
        stranger->UploadRange(id, 0, AsBytes(data).subspan(0, 10));
    EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status();
  }
  // The owner's upload was not disturbed by the stranger: it still completes.
  std::vector<absl::StatusOr<v1::UploadResponse>> done(1);
  done[0] = client_->UploadRange(started->transfer_id(), 0, AsBytes(data));
  ASSERT_OK(done[0]);
  absl::StatusOr<std::string> back = DownloadBytes(*client_, done[0]->buffer().id());
  ASSERT_OK(back);
  EXPECT_TRUE(*back == data);
}

// An upload no stream sends anything on is given up after its idle timeout, and its
// memory freed (a client that died after BeginUpload).
TEST_F(ServerTransfersTest, IdleUploadIsGivenUp) {
  const Snapshot before = TakeSnapshot(*client_);
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(1 << 16);
  begin.set_idle_timeout_seconds(0.2);
  absl::StatusOr<v1::BeginUploadResponse> started = client_->BeginUpload(begin);
  ASSERT_OK(started);
  EXPECT_DOUBLE_EQ(started->idle_timeout_seconds(), 0.2);
  EXPECT_EQ(MemoryUsed(*client_), before.memory_used_bytes + (8 << 16));
  EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client_), before);
  const std::string data(8, 'x');
  absl::StatusOr<v1::UploadResponse> late =
      client_->UploadRange(started->transfer_id(), 0, AsBytes(data));
  EXPECT_EQ(late.status().code(), Code::kNotFound) << late.status();
}

// A client that speaks the generated protobuf messages (as the Python client does) still
// uploads and downloads through the raw handlers, byte for byte.
TEST_F(ServerTransfersTest, PlainProtobufClientStillWorks) {
  const std::string data = RandomBytes(8 * 5000, 12);
  auto context = Context();
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      Stub()->Upload(context.get(), &response);
  v1::UploadRequest request;
  *request.mutable_header() = CreateFloat64(5000);
  ASSERT_TRUE(writer->Write(request));
  for (uint64_t at = 0; at < data.size(); at += 3001) {
    v1::UploadRequest chunk;
    chunk.set_chunk(data.substr(at, 3001));
    ASSERT_TRUE(writer->Write(chunk));
  }
  ASSERT_TRUE(writer->WritesDone());
  grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.buffer().size_bytes(), data.size());
  EXPECT_EQ(response.transfer().bytes(), data.size());

  v1::DownloadRequest down;
  down.set_buffer(response.buffer().id());
  down.set_chunk_bytes(8192);
  auto read_context = Context();
  std::unique_ptr<grpc::ClientReader<v1::DownloadResponse>> reader =
      Stub()->Download(read_context.get(), down);
  v1::DownloadResponse message;
  std::string back;
  bool first = true;
  uint64_t transfer_bytes = 0;
  while (reader->Read(&message)) {
    if (first) {
      EXPECT_EQ(message.buffer().id(), response.buffer().id());
    }
    first = false;
    EXPECT_EQ(message.offset_bytes(), back.size());
    back += message.data();
    if (message.has_transfer()) transfer_bytes = message.transfer().bytes();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(back == data);
  EXPECT_EQ(transfer_bytes, data.size());
}

}  // namespace
}  // namespace gpucompute

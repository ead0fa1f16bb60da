// SharedMemoryService end to end: a server in this process on a loopback port, clients
// over a real socket, POSIX shared-memory segments made by the test or by the client
// library's SharedMemoryTransport. (The CLI's --transport and a client killed mid-transfer
// are in cli_test.cc; CUDA IPC, which needs two processes and a GPU, in cuda_ipc_test.cc.)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/shared_memory.h"
#include "common/host_identity.h"
#include "server/shared_memory/region_registry.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

std::span<const std::byte> Bytes(const std::vector<double>& v) {
  return std::as_bytes(std::span<const double>(v));
}

std::vector<double> AsDoubles(const std::string& bytes) {
  std::vector<double> out(bytes.size() / sizeof(double));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(double));
  return out;
}

// Lines of this process's memory map that name `needle` (a shared-memory segment).
int MappingsOf(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(needle) != std::string::npos) ++count;
  }
  return count;
}

// A POSIX shared-memory object the test made itself, unlinked and unmapped at the end.
class Segment {
 public:
  explicit Segment(uint64_t size)
      : name_(absl::StrCat("/gpucompute-test-", getpid(), "-", counter_++, "-segment")),
        size_(size) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<char*>(p);
    close(fd);
  }
  ~Segment() {
    munmap(data_, size_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  static inline int counter_ = 0;
  std::string name_;
  uint64_t size_;
  char* data_ = nullptr;
};

// Raw SharedMemoryService calls as a named client, for requests the library never sends.
class RawShm {
 public:
  RawShm(const TestServer& server, std::string client)
      : stub_(v1::SharedMemoryService::NewStub(server.RawChannel())), client_(std::move(client)) {}

  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (v1::SharedMemoryService::Stub::*method)(
                                    grpc::ClientContext*, const Request&, Response*),
                                const Request& request) {
    grpc::ClientContext context;
    context.AddMetadata(kClientMetadataKey, client_);
    context.set_deadline(std::chrono::system_clock::now() + deadline_);
    Response response;
    grpc::Status status = (stub_.get()->*method)(&context, request, &response);
    if (!status.ok()) return StatusOf(status);
    return response;
  }

  // How long each call may take; a call that takes longer fails with DEADLINE_EXCEEDED.
  void set_deadline(std::chrono::seconds deadline) { deadline_ = deadline; }

  absl::StatusOr<v1::RegionInfo> Register(const std::string& name, uint64_t offset, uint64_t size,
                                          bool read_only = false) {
    v1::RegisterRegionRequest request;
    request.mutable_system()->set_name(name);
    request.mutable_system()->set_offset_bytes(offset);
    request.mutable_system()->set_size_bytes(size);
    request.mutable_system()->set_read_only(read_only);
    return Call(&v1::SharedMemoryService::Stub::RegisterRegion, request);
  }
  absl::Status Unregister(const std::string& id) {
    v1::UnregisterRegionRequest request;
    request.set_region_id(id);
    return Call(&v1::SharedMemoryService::Stub::UnregisterRegion, request).status();
  }
  absl::StatusOr<v1::ListRegionsResponse> List() {
    return Call(&v1::SharedMemoryService::Stub::ListRegions, v1::ListRegionsRequest());
  }
  absl::StatusOr<v1::CopyRegionResponse> CopyFrom(const v1::CopyFromRegionRequest& request) {
    return Call(&v1::SharedMemoryService::Stub::CopyFromRegion, request);
  }
  absl::StatusOr<v1::CopyRegionResponse> CopyTo(const v1::CopyToRegionRequest& request) {
    return Call(&v1::SharedMemoryService::Stub::CopyToRegion, request);
  }
  absl::StatusOr<v1::ExportBufferResponse> Export(const v1::ExportBufferRequest& request) {
    return Call(&v1::SharedMemoryService::Stub::ExportBuffer, request);
  }

 private:
  std::unique_ptr<v1::SharedMemoryService::Stub> stub_;
  std::string client_;
  std::chrono::seconds deadline_{60};
};

v1::CopyFromRegionRequest CopyInto(const std::string& region, uint64_t region_offset,
                                   const std::string& buffer, uint64_t offset, uint64_t size) {
  v1::CopyFromRegionRequest request;
  request.set_region_id(region);
  request.set_region_offset_bytes(region_offset);
  request.set_buffer(buffer);
  request.set_offset_bytes(offset);
  request.set_size_bytes(size);
  return request;
}

v1::CopyToRegionRequest CopyOut(const std::string& buffer, uint64_t offset, uint64_t size,
                                const std::string& region, uint64_t region_offset) {
  v1::CopyToRegionRequest request;
  request.set_buffer(buffer);
  request.set_offset_bytes(offset);
  request.set_size_bytes(size);
  request.set_region_id(region);
  request.set_region_offset_bytes(region_offset);
  return request;
}

// A range of the multi-range upload `transfer`, copied from the region.
v1::CopyFromRegionRequest IntoUpload(const std::string& region, uint64_t region_offset,
                                     const std::string& transfer, uint64_t offset, uint64_t size) {
  v1::CopyFromRegionRequest request = CopyInto(region, region_offset, "", offset, size);
  request.set_transfer_id(transfer);  // the target instead of `buffer`
  return request;
}

v1::UploadHeader IntoBuffer(const std::string& buffer, uint64_t offset) {
  v1::UploadHeader header;
  header.set_buffer(buffer);
  header.set_offset_bytes(offset);
  return header;
}

// The bytes of `v` from `offset`, `size` of them.
std::string BytesOf(const std::vector<double>& v, uint64_t offset, uint64_t size) {
  return std::string(reinterpret_cast<const char*>(v.data()) + offset, size);
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*allow=*/true, /*idle_timeout_seconds=*/600); }

  void Start(bool allow, double idle_timeout_seconds) {
    server_.reset();
    server_ = TestServer::StartWith(nullptr, 256 * kMiB, 2, [&](ServerOptions& options) {
      options.allow_shared_memory = allow;
      options.allow_cuda_ipc = allow;
      options.region_idle_timeout_seconds = idle_timeout_seconds;
    });
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("shm-test");
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(SharedMemoryTest, ServerInfoSaysWhatIsAllowedAndWhichHost) {
  ASSIGN_OR_FAIL(v1::ServerInfo info, client_->GetServerInfo());
  EXPECT_TRUE(info.shared_memory_enabled());
  EXPECT_TRUE(info.cuda_ipc_enabled());
  EXPECT_EQ(info.hostname(), HostName());
  EXPECT_EQ(info.boot_id(), BootId());
  EXPECT_FALSE(info.boot_id().empty());
  EXPECT_EQ(info.region_idle_timeout_seconds(), 600);
  EXPECT_EQ(info.limits().max_regions_per_client(), kMaxRegionsPerClient);
  EXPECT_OK(CheckSharedMemoryUsable(info));

  Start(/*allow=*/false, 600);
  ASSIGN_OR_FAIL(info, client_->GetServerInfo());
  EXPECT_FALSE(info.shared_memory_enabled());
  EXPECT_FALSE(info.cuda_ipc_enabled());
  const absl::Status usable = CheckSharedMemoryUsable(info);
  EXPECT_TRUE(absl::IsFailedPrecondition(usable)) << usable;
  info.set_shared_memory_enabled(true);
  info.set_boot_id("another-boot");
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckSharedMemoryUsable(info)));
}

TEST_F(SharedMemoryTest, UploadComputeAndDownloadThroughSharedMemory) {
  const size_t n = 100003;  // not a multiple of a page of doubles
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 1);
  SharedMemoryTransport shm(*client_);
  ASSIGN_OR_FAIL(v1::CopyRegionResponse up, shm.Upload(CreateFloat64(n, "x"), Bytes(x)));
  EXPECT_EQ(up.buffer().name(), "x");
  EXPECT_EQ(up.buffer().size_bytes(), n * 8);
  EXPECT_EQ(up.transfer().bytes(), n * 8);
  EXPECT_EQ(up.timing().bytes_written(), n * 8);
  // What the server holds is what was written, byte for byte (read back over gRPC).
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "x"));
  EXPECT_EQ(back, x);

  ASSIGN_OR_FAIL(v1::Operation op, client_->Submit(Elementwise(
                                       "2*x + 1", {{"x", BufferOperand("x")}}, NewOutput("y"))));
  ASSIGN_OR_FAIL(v1::Operation synced, client_->WaitOperation(op.id()));
  ASSERT_EQ(synced.state(), v1::Operation::STATE_SUCCEEDED);
  std::string bytes;
  v1::DownloadRequest request;
  request.set_buffer("y");
  ASSIGN_OR_FAIL(v1::CopyRegionResponse down, shm.Download(request, &bytes));
  EXPECT_EQ(down.transfer().bytes(), n * 8);
  const std::vector<double> y = AsDoubles(bytes);
  ASSERT_EQ(y.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 2 * x[i] + 1) << "at " << i;

  // A byte range: the middle of y, from an odd offset.
  request.set_offset_bytes(8 * 1001);
  request.set_size_bytes(8 * 5000);
  ASSIGN_OR_FAIL(down, shm.Download(request, &bytes));
  ASSERT_EQ(bytes.size(), 8 * 5000u);
  EXPECT_EQ(AsDoubles(bytes), std::vector<double>(y.begin() + 1001, y.begin() + 6001));
}

TEST_F(SharedMemoryTest, DataStagedInTheSegmentMovesWithoutClientCopies) {
  const size_t n = 5003;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 4);
  SharedMemoryTransport shm(*client_);
  // Staged at an offset that is not a page boundary.
  const uint64_t at = 8 * 129;
  ASSIGN_OR_FAIL(std::span<std::byte> staged, shm.Staging(at, n * 8));
  ASSERT_EQ(staged.size(), n * 8);
  std::memcpy(staged.data(), x.data(), n * 8);
  ASSIGN_OR_FAIL(v1::CopyRegionResponse up,
                 shm.UploadStaged(CreateFloat64(n, "staged"), n * 8, at));
  EXPECT_EQ(up.transfer().bytes(), n * 8);
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "staged"));
  EXPECT_EQ(back, x);

  // Into another part of the segment, which holds something else first.
  ASSIGN_OR_FAIL(std::span<std::byte> target, shm.Staging(at + n * 8, n * 8));
  std::memset(target.data(), 0x5a, target.size());
  v1::DownloadRequest request;
  request.set_buffer("staged");
  ASSIGN_OR_FAIL(std::span<const std::byte> down, shm.DownloadStaged(request, at + n * 8));
  ASSERT_EQ(down.size(), n * 8);
  EXPECT_EQ(down.data(), target.data());
  std::vector<double> got(n);
  std::memcpy(got.data(), down.data(), n * 8);
  EXPECT_EQ(got, x);
  // A range of it: doubles [10, 20) at the segment's start.
  request.set_offset_bytes(80);
  request.set_size_bytes(80);
  ASSIGN_OR_FAIL(down, shm.DownloadStaged(request));
  std::vector<double> part(10);
  std::memcpy(part.data(), down.data(), 80);
  EXPECT_EQ(part, std::vector<double>(x.begin() + 10, x.begin() + 20));

  // Ranges outside the segment are refused before anything is sent, and change nothing.
  ASSIGN_OR_FAIL(v1::ServerInfo before, client_->GetServerInfo());
  EXPECT_EQ(
      shm.UploadStaged(CreateFloat64(n, "over"), n * 8, shm.region_bytes() - 8).status().code(),
      absl::StatusCode::kOutOfRange);
  request.set_offset_bytes(0);
  request.set_size_bytes(16);
  EXPECT_EQ(shm.DownloadStaged(request, shm.region_bytes() - 8).status().code(),
            absl::StatusCode::kOutOfRange);
  // To the end of the buffer: the size is the server's to know, and it refuses.
  request.set_size_bytes(0);
  EXPECT_EQ(shm.DownloadStaged(request, shm.region_bytes() - 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shm.UploadStaged(CreateFloat64(4, "short"), 8, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shm.Staging(std::numeric_limits<uint64_t>::max() - 4, 8).status().code(),
            absl::StatusCode::kOutOfRange);
  ASSIGN_OR_FAIL(v1::ServerInfo after, client_->GetServerInfo());
  EXPECT_EQ(after.buffer_count(), before.buffer_count());
  EXPECT_EQ(after.memory_used_bytes(), before.memory_used_bytes());
  ASSIGN_OR_FAIL(back, DownloadArray<double>(*client_, "staged"));
  EXPECT_EQ(back, x);
}

TEST_F(SharedMemoryTest, TransfersLargerThanTheRegionMoveInPieces) {
  // 10000 doubles through a region of 3 pages: pieces of 12288 bytes, the last uneven.
  const size_t n = 10000;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 2);
  SharedMemoryTransport shm(*client_, {.max_region_bytes = 3 * 4096});
  ASSIGN_OR_FAIL(v1::CopyRegionResponse up, shm.Upload(CreateFloat64(n, "pieces"), Bytes(x)));
  EXPECT_EQ(shm.region_bytes(), 3 * 4096u);
  EXPECT_EQ(up.transfer().bytes(), n * 8);
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "pieces"));
  EXPECT_EQ(back, x);

  // Into an existing buffer at an offset that ends mid-piece.
  const std::vector<double> patch = RandomDoubles(4000, -1e3, 1e3, 3);
  v1::UploadHeader header;
  header.set_buffer("pieces");
  header.set_offset_bytes(8 * 777);
  ASSERT_OK(shm.Upload(header, Bytes(patch)));
  std::vector<double> expected = x;
  std::copy(patch.begin(), patch.end(), expected.begin() + 777);
  std::string bytes;
  v1::DownloadRequest request;
  request.set_buffer("pieces");
  ASSERT_OK(shm.Download(request, &bytes));
  EXPECT_EQ(AsDoubles(bytes), expected);
}

// Progress as a pipelined transfer of `total` bytes in pieces of `piece` reports it: at
// the end of every piece.
std::vector<uint64_t> PieceEnds(uint64_t piece, uint64_t total) {
  std::vector<uint64_t> ends;
  for (uint64_t at = piece; at < total; at += piece) ends.push_back(at);
  ends.push_back(total);
  return ends;
}

// A download of several pieces asks for the next ones while the sink takes the last: the
// sink gets every piece in order. Pieces of 4100 bytes end mid-element, and the array is
// no whole number of them.
TEST_F(SharedMemoryTest, PipelinedDownloadsMovePieceByPiece) {
  constexpr uint64_t kPiece = 4100;
  const size_t n = 10007;
  const uint64_t bytes = n * 8;  // 19 pieces and 2156 bytes
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 10);
  ASSIGN_OR_FAIL(v1::BufferInfo buffer, UploadArray(*client_, x, {}, v1::LAYOUT_C, "piped"));
  SharedMemoryTransport shm(*client_, {.piece_bytes = kPiece});
  v1::DownloadRequest request;
  request.set_buffer("piped");
  std::string joined;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> reported;
  auto sink = [&](uint64_t offset, std::string_view piece) {
    offsets.push_back(offset);
    EXPECT_EQ(piece.size(), std::min(kPiece, bytes - offset)) << "at " << offset;
    joined.append(piece);
    return absl::OkStatus();
  };
  auto record = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, bytes);
    reported.push_back(done);
  };
  ASSIGN_OR_FAIL(v1::CopyRegionResponse down, shm.Download(request, sink, record));
  EXPECT_EQ(reported, PieceEnds(kPiece, bytes));
  std::vector<uint64_t> starts = PieceEnds(kPiece, bytes);
  starts.pop_back();
  starts.insert(starts.begin(), 0);
  EXPECT_EQ(offsets, starts);
  EXPECT_TRUE(joined == BytesOf(x, 0, bytes)) << "the downloaded bytes differ";
  EXPECT_EQ(down.buffer().id(), buffer.id());
  EXPECT_EQ(down.transfer().bytes(), bytes);
  EXPECT_GT(down.transfer().seconds(), 0);

  // A byte range from the middle of an element, 13 pieces and 2700 bytes.
  request.set_offset_bytes(8 * 1001 + 4);
  request.set_size_bytes(56000);
  ASSIGN_OR_FAIL(down, shm.Download(request, &joined));
  EXPECT_EQ(down.transfer().bytes(), 56000u);
  EXPECT_TRUE(joined == BytesOf(x, 8 * 1001 + 4, 56000)) << "the range differs";

  // Through a segment of two pieces, whose parts the download reuses in turn.
  SharedMemoryTransport small(*client_, {.max_region_bytes = 2 * kPiece, .piece_bytes = kPiece});
  request.set_offset_bytes(0);
  request.set_size_bytes(0);
  ASSIGN_OR_FAIL(down, small.Download(request, &joined));
  EXPECT_EQ(small.region_bytes(), 2 * kPiece);
  EXPECT_EQ(down.transfer().bytes(), bytes);
  EXPECT_TRUE(joined == BytesOf(x, 0, bytes)) << "the ring's bytes differ";

  // A sink that fails: its error, once the pieces asked for are in; the next transfer
  // through the segment is whole.
  int pieces = 0;
  auto fails_third = [&](uint64_t, std::string_view) {
    return ++pieces == 3 ? absl::ResourceExhaustedError("full") : absl::OkStatus();
  };
  const absl::Status failed = small.Download(request, fails_third).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_EQ(pieces, 3);
  const std::vector<double> y = RandomDoubles(n, -1e3, 1e3, 11);
  ASSERT_OK(small.Upload(IntoBuffer(buffer.id(), 0), Bytes(y)));
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "piped"));
  EXPECT_EQ(back, y);
}

// An upload of several pieces is one multi-range upload whose ranges are the pieces: the
// client copies the next piece into the segment while the server copies the last one out.
TEST_F(SharedMemoryTest, PipelinedUploadsMovePieceByPiece) {
  constexpr uint64_t kPiece = 4100;
  const size_t n = 10007;
  const uint64_t bytes = n * 8;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 12);
  SharedMemoryTransport shm(*client_, {.piece_bytes = kPiece});
  // Every piece as it is handed over, and the whole once it is in.
  std::vector<uint64_t> reported;
  auto record = [&](uint64_t done, uint64_t) { reported.push_back(done); };
  ASSIGN_OR_FAIL(v1::CopyRegionResponse up,
                 shm.Upload(CreateFloat64(n, "piped"), bytes, SpanReader(Bytes(x)), record));
  EXPECT_EQ(reported, PieceEnds(kPiece, bytes));
  EXPECT_EQ(up.buffer().name(), "piped");
  EXPECT_EQ(up.buffer().size_bytes(), bytes);
  EXPECT_EQ(up.transfer().bytes(), bytes);
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "piped"));
  EXPECT_EQ(back, x);

  // Into a range of the existing buffer: 6001 doubles from element 777, 11 pieces and
  // 3908 bytes.
  const std::vector<double> patch = RandomDoubles(6001, -1e3, 1e3, 13);
  reported.clear();
  ASSIGN_OR_FAIL(up, shm.Upload(IntoBuffer(up.buffer().id(), 8 * 777), patch.size() * 8,
                                SpanReader(Bytes(patch)), record));
  EXPECT_EQ(reported, PieceEnds(kPiece, patch.size() * 8));
  EXPECT_EQ(up.buffer().name(), "piped");
  EXPECT_EQ(up.transfer().bytes(), patch.size() * 8);
  std::vector<double> expected = x;
  std::copy(patch.begin(), patch.end(), expected.begin() + 777);
  ASSIGN_OR_FAIL(back, DownloadArray<double>(*client_, "piped"));
  EXPECT_EQ(back, expected);
}

// An upload of more pieces than kMaxUploadPieces moves in larger ones.
TEST_F(SharedMemoryTest, PipelinedUploadsHaveBoundedPieces) {
  const size_t n = 10007;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 12);
  SharedMemoryTransport shm(*client_, {.piece_bytes = 8});
  const uint64_t piece = (n * 8 + kMaxUploadPieces - 1) / kMaxUploadPieces;
  std::vector<uint64_t> reported;
  ASSERT_OK(shm.Upload(CreateFloat64(n, "bounded"), n * 8, SpanReader(Bytes(x)),
                       [&](uint64_t done, uint64_t) { reported.push_back(done); }));
  ASSERT_EQ(reported.size(), kMaxUploadPieces);
  for (size_t i = 0; i + 1 < reported.size(); ++i) EXPECT_EQ(reported[i], (i + 1) * piece);
  EXPECT_EQ(reported.back(), n * 8);
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "bounded"));
  EXPECT_EQ(back, x);
}

// A reader that fails mid-upload: the calls already made are cancelled, which fails the
// upload on the server, so neither a new buffer nor a changed range is ever visible, and
// the memory the upload reserved goes back.
TEST_F(SharedMemoryTest, PipelinedUploadThatFailsMidwayChangesNothing) {
  constexpr uint64_t kPiece = 4096;
  const size_t n = 8192;  // 16 pieces
  const std::vector<double> original = RandomDoubles(n, -1e3, 1e3, 13);
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 14);
  SharedMemoryTransport shm(*client_, {.piece_bytes = kPiece});
  ASSIGN_OR_FAIL(v1::CopyRegionResponse kept,
                 shm.Upload(CreateFloat64(n, "kept"), Bytes(original)));
  const Snapshot before = TakeSnapshot(*client_);
  for (bool into_existing : {false, true}) {
    SCOPED_TRACE(into_existing ? "existing buffer" : "new buffer");
    uint64_t position = 0;
    uint64_t reserved = 0;
    UploadReader failing = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
      if (position == 5 * kPiece) {
        reserved = MemoryUsed(*client_);
        // Time for the first pieces' calls to reach the server (a call cancelled before
        // it arrives leaves the upload to its idle timeout).
        absl::SleepFor(absl::Milliseconds(200));
        return absl::DataLossError("the source went away");
      }
      const size_t k = std::min<size_t>(out.size(), n * 8 - position);
      std::memcpy(out.data(), reinterpret_cast<const char*>(x.data()) + position, k);
      position += k;
      return k;
    };
    const absl::Status status =
        shm.Upload(into_existing ? IntoBuffer(kept.buffer().id(), 0) : CreateFloat64(n, "never"),
                   n * 8, failing)
            .status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_EQ(reserved, before.memory_used_bytes + n * 8) << "the upload had not begun";
    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
    ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, "kept"));
    EXPECT_EQ(back, original);
  }
}

// CopyFromRegion into an upload: each refusal, with its exact code, fails the whole upload
// (a range already waiting hears the same), gives back its memory and changes nothing;
// the upload is forgotten.
TEST_F(SharedMemoryTest, RefusedCopiesIntoAnUploadFailItAndChangeNothing) {
  RawShm raw(*server_, "shm-test");
  Segment segment(4 * 4096);
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, segment.size()));
  const std::vector<double> values = RandomDoubles(2048, -1e3, 1e3, 15);
  std::memcpy(segment.data(), values.data(), segment.size());
  const std::vector<double> original = RandomDoubles(1000, -1e3, 1e3, 16);
  ASSIGN_OR_FAIL(v1::BufferInfo buffer, UploadArray(*client_, original, {}, v1::LAYOUT_C, "b"));
  const Snapshot before = TakeSnapshot(*client_);
  const std::string unknown_region = "shm-0123456789abcdef0123456789abcdef";
  struct Case {
    std::string name;
    uint64_t region_offset;
    uint64_t offset;
    uint64_t size;
    absl::StatusCode code;
    std::string region_id = "";  // empty: the test's region
    std::string stream_id = "";
  };
  // The upload has 8000 bytes; the waiting range claims [0, 1000).
  const std::vector<Case> cases = {
      {"overlaps the waiting range", 0, 999, 10, absl::StatusCode::kInvalidArgument},
      {"ends past the upload", 0, 7999, 2, absl::StatusCode::kInvalidArgument},
      {"starts near 2^64", 0, kMax, 2, absl::StatusCode::kInvalidArgument},
      {"empty", 0, 2000, 0, absl::StatusCode::kInvalidArgument},
      {"ends past the region", 4 * 4096 - 8, 2000, 16, absl::StatusCode::kInvalidArgument},
      {"region end overflows", kMax - 7, 2000, 16, absl::StatusCode::kInvalidArgument},
      {"unknown region", 0, 2000, 16, absl::StatusCode::kNotFound, unknown_region},
      {"names a stream", 0, 2000, 16, absl::StatusCode::kInvalidArgument, "", "stream"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const bool into_existing = i % 2 == 1;
    SCOPED_TRACE(absl::StrCat(c.name, into_existing ? ", into the existing buffer" : ""));
    v1::BeginUploadRequest begin;
    *begin.mutable_header() = into_existing ? IntoBuffer(buffer.id(), 0) : CreateFloat64(1000);
    begin.mutable_header()->set_size_bytes(8000);
    ASSIGN_OR_FAIL(v1::BeginUploadResponse started, client_->BeginUpload(begin));
    EXPECT_EQ(MemoryUsed(*client_), before.memory_used_bytes + 8000) << "reserved";
    const std::string& id = started.transfer_id();
    absl::StatusOr<v1::CopyRegionResponse> waiting;
    std::thread first([&] { waiting = raw.CopyFrom(IntoUpload(region.id(), 0, id, 0, 1000)); });
    absl::SleepFor(absl::Milliseconds(100));
    v1::CopyFromRegionRequest bad = IntoUpload(c.region_id.empty() ? region.id() : c.region_id,
                                               c.region_offset, id, c.offset, c.size);
    bad.set_stream_id(c.stream_id);
    const absl::Status refused = raw.CopyFrom(bad).status();
    first.join();
    EXPECT_EQ(refused.code(), c.code) << refused;
    EXPECT_EQ(waiting.status().code(), c.code) << waiting.status();
    EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
    EXPECT_EQ(TakeSnapshot(*client_), before);
    ASSIGN_OR_FAIL(std::vector<double> after, DownloadArray<double>(*client_, buffer.id()));
    EXPECT_EQ(after, original);
    const absl::Status late = raw.CopyFrom(IntoUpload(region.id(), 1000, id, 1000, 7000)).status();
    EXPECT_EQ(late.code(), absl::StatusCode::kNotFound) << late;
  }
  EXPECT_EQ(std::memcmp(segment.data(), values.data(), segment.size()), 0)
      << "a copy into an upload changed its region";

  // Unknown transfer ids, and another client's, are NOT_FOUND and disturb nothing.
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(1000, "whole");
  ASSIGN_OR_FAIL(v1::BeginUploadResponse started, client_->BeginUpload(begin));
  const std::string unknown_upload = "upl-0123456789abcdef0123456789abcdef";
  RawShm other(*server_, "other");
  ASSIGN_OR_FAIL(v1::RegionInfo theirs, other.Register(segment.name(), 0, segment.size()));
  for (const std::string& id : {unknown_upload, started.transfer_id()}) {
    const absl::Status status = other.CopyFrom(IntoUpload(theirs.id(), 0, id, 0, 8000)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << id << ": " << status;
  }
  const absl::Status status =
      raw.CopyFrom(IntoUpload(region.id(), 0, unknown_upload, 0, 8000)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  // The owner's upload goes on: two ranges complete it, and both hear the one outcome.
  absl::StatusOr<v1::CopyRegionResponse> head;
  std::thread first(
      [&] { head = raw.CopyFrom(IntoUpload(region.id(), 0, started.transfer_id(), 0, 3000)); });
  ASSIGN_OR_FAIL(v1::CopyRegionResponse tail,
                 raw.CopyFrom(IntoUpload(region.id(), 3000, started.transfer_id(), 3000, 5000)));
  first.join();
  ASSERT_OK(head);
  EXPECT_EQ(head->buffer().id(), tail.buffer().id());
  EXPECT_EQ(tail.buffer().name(), "whole");
  EXPECT_EQ(head->transfer().bytes(), 8000u);
  EXPECT_EQ(tail.transfer().bytes(), 8000u);
  ASSIGN_OR_FAIL(std::vector<double> whole, DownloadArray<double>(*client_, "whole"));
  EXPECT_EQ(whole, std::vector<double>(values.begin(), values.begin() + 1000));
}

// A client that goes away mid-upload (its call cancelled) leaves no buffer, and the memory
// the upload reserved goes back then, not at the upload's idle timeout (a minute).
TEST_F(SharedMemoryTest, CancelledCopyIntoAnUploadFailsIt) {
  RawShm raw(*server_, "shm-test");
  Segment segment(8000);
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, segment.size()));
  const Snapshot before = TakeSnapshot(*client_);
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(1000, "abandoned");
  ASSIGN_OR_FAIL(v1::BeginUploadResponse started, client_->BeginUpload(begin));
  std::unique_ptr<v1::SharedMemoryService::Stub> stub =
      v1::SharedMemoryService::NewStub(server_->RawChannel());
  grpc::ClientContext context;
  context.AddMetadata(kClientMetadataKey, "shm-test");
  const v1::CopyFromRegionRequest request =
      IntoUpload(region.id(), 0, started.transfer_id(), 0, 4000);
  v1::CopyRegionResponse response;
  grpc::Status status;
  absl::Notification answered;
  stub->async()->CopyFromRegion(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    answered.Notify();
  });
  // The range is in; the call waits for the rest of the upload.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(answered.HasBeenNotified());
  EXPECT_EQ(MemoryUsed(*client_), before.memory_used_bytes + 8000);
  context.TryCancel();
  answered.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client_), before);
  const absl::Status late =
      raw.CopyFrom(IntoUpload(region.id(), 4000, started.transfer_id(), 4000, 4000)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kNotFound) << late;
}

TEST_F(SharedMemoryTest, RegistrationChecksNameRangeAndExistence) {
  RawShm raw(*server_, "shm-test");
  Segment segment(3 * 4096);
  // The shared-memory name must exist on the server's host.
  absl::StatusOr<v1::RegionInfo> r = raw.Register("/gpucompute-test-no-such-object", 0, 4096);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  for (const char* name : {"", "/", "no-slash", "/a/b", "/../etc"}) {
    r = raw.Register(name, 0, 4096);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << name << ": " << r.status();
  }
  // Ranges beyond the object, including ones whose end overflows 64 bits.
  const uint64_t size = segment.size();
  for (const auto& [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{{0, size + 1},
                                                                                {size, 1},
                                                                                {1, size},
                                                                                {kMax, 1},
                                                                                {1, kMax},
                                                                                {4096, kMax - 4095},
                                                                                {kMax, kMax},
                                                                                {size + 1, 0},
                                                                                {0, 0}}) {
    r = raw.Register(segment.name(), offset, bytes);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()))
        << offset << " +" << bytes << ": " << r.status();
  }
  ASSIGN_OR_FAIL(v1::ListRegionsResponse list, raw.List());
  EXPECT_EQ(list.regions_size(), 0) << "a rejected registration left a region";
  EXPECT_EQ(MappingsOf(segment.name()), 1) << "a rejected registration left a mapping";

  // An unaligned range inside the object is fine, and maps exactly those bytes.
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 4096 + 24, 4096));
  EXPECT_EQ(region.kind(), v1::REGION_KIND_SYSTEM);
  EXPECT_EQ(region.size_bytes(), 4096u);
  EXPECT_EQ(region.shm_offset_bytes(), 4096u + 24);
  std::vector<double> values = RandomDoubles(512, -1e3, 1e3, 4);
  std::memcpy(segment.data() + 4096 + 24, values.data(), 4096);
  v1::CopyFromRegionRequest create;
  create.set_region_id(region.id());
  *create.mutable_create() = CreateFloat64(512).create();
  ASSIGN_OR_FAIL(v1::CopyRegionResponse copied, raw.CopyFrom(create));
  ASSIGN_OR_FAIL(std::vector<double> back, DownloadArray<double>(*client_, copied.buffer().id()));
  EXPECT_EQ(back, values);
  EXPECT_EQ(MappingsOf(segment.name()), 2);
  ASSERT_OK(raw.Unregister(region.id()));
  EXPECT_EQ(MappingsOf(segment.name()), 1) << "unregistering left the server's mapping";
}

// Files of /dev/shm that are no shared-memory objects, which anyone on the host can
// make: each is refused at once, and the server goes on serving.
TEST_F(SharedMemoryTest, RegistrationRefusesWhatIsNoObjectAtOnce) {
  RawShm raw(*server_, "shm-test");
  raw.set_deadline(std::chrono::seconds(5));  // a registration that waits fails, not hangs
  Segment segment(4096);
  const std::string stem = absl::StrCat("/gpucompute-test-", getpid(), "-");
  const std::string fifo = stem + "fifo", dir = stem + "dir", link = stem + "link";
  ASSERT_EQ(mkfifo(("/dev/shm" + fifo).c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(mkdir(("/dev/shm" + dir).c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(symlink(("/dev/shm" + segment.name()).c_str(), ("/dev/shm" + link).c_str()), 0)
      << std::strerror(errno);
  for (const auto& [name, what] : std::vector<std::pair<std::string, std::string>>{
           {fifo, "a FIFO"}, {dir, "a directory"}, {link, "a symbolic link"}}) {
    for (const bool read_only : {true, false}) {
      SCOPED_TRACE(absl::StrCat(name, read_only ? " read-only" : " read-write"));
      const absl::Time start = absl::Now();
      const absl::StatusOr<v1::RegionInfo> r = raw.Register(name, 0, 4096, read_only);
      EXPECT_LT(absl::Now() - start, absl::Seconds(2));
      EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
      const absl::string_view message = r.status().message();
      EXPECT_TRUE(absl::StrContains(message, name) && absl::StrContains(message, what))
          << message;
      // A server thread stuck opening the FIFO goes on once a writer comes.
      close(open(("/dev/shm" + fifo).c_str(), O_WRONLY | O_NONBLOCK));
    }
  }
  unlink(("/dev/shm" + fifo).c_str());
  rmdir(("/dev/shm" + dir).c_str());
  unlink(("/dev/shm" + link).c_str());

  ASSIGN_OR_FAIL(v1::ListRegionsResponse list, raw.List());
  EXPECT_EQ(list.regions_size(), 0);
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, 4096, true));
  EXPECT_EQ(region.size_bytes(), 4096u);
  ASSIGN_OR_FAIL(v1::ServerInfo info, client_->GetServerInfo());
  EXPECT_TRUE(info.shared_memory_enabled());
}

// The client may shrink its object after registering it (ftruncate). A copy that meets
// the bytes gone, in either direction, fails with FAILED_PRECONDITION naming the object,
// rather than ending the server with SIGBUS; the server serves on, the buffers are as
// they were, and what the object still holds still copies.
TEST_F(SharedMemoryTest, CopiesWithAShrunkObjectFailAndTheServerLives) {
  RawShm raw(*server_, "shm-test");
  constexpr uint64_t kRegion = 4 * kMiB, kShrunk = 4096, kBuffer = 64 * 1024;
  Segment segment(kRegion);
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, kRegion));
  const std::vector<double> values = RandomDoubles(kShrunk / 8, -1e3, 1e3, 21);
  std::memcpy(segment.data(), values.data(), kShrunk);
  const std::vector<double> original = RandomDoubles(kBuffer / 8, -1e3, 1e3, 22);
  ASSIGN_OR_FAIL(v1::BufferInfo buffer, UploadArray(*client_, original, {}, v1::LAYOUT_C, "b"));
  const std::vector<double> other_values = RandomDoubles(kShrunk / 8, -1e3, 1e3, 23);
  ASSIGN_OR_FAIL(v1::BufferInfo other,
                 UploadArray(*client_, other_values, {}, v1::LAYOUT_C, "other"));
  const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, kShrunk), 0) << std::strerror(errno);
  close(fd);
  const Snapshot before = TakeSnapshot(*client_);

  auto expect_shrunk = [&](const absl::Status& status, const std::string& what) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << what << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), segment.name())) << what << ": " << status;
  };
  // From the region: bytes past the new end, and a range across it.
  expect_shrunk(raw.CopyFrom(CopyInto(region.id(), kMiB, buffer.id(), 0, 8192)).status(),
                "from past the end");
  expect_shrunk(raw.CopyFrom(CopyInto(region.id(), 0, buffer.id(), 0, kBuffer)).status(),
                "from across the end");
  v1::CopyFromRegionRequest create;
  create.set_region_id(region.id());
  *create.mutable_create() = CreateFloat64(kRegion / 8, "new").create();
  expect_shrunk(raw.CopyFrom(create).status(), "into a new buffer");
  // Into a multi-range upload, whose one range it is: the upload fails.
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(1000, "uploaded");
  ASSIGN_OR_FAIL(v1::BeginUploadResponse started, client_->BeginUpload(begin));
  expect_shrunk(
      raw.CopyFrom(IntoUpload(region.id(), kMiB, started.transfer_id(), 0, 8000)).status(),
      "into an upload");
  // To the region: the same.
  expect_shrunk(raw.CopyTo(CopyOut(buffer.id(), 0, 8192, region.id(), kMiB)).status(),
                "to past the end");
  expect_shrunk(raw.CopyTo(CopyOut(buffer.id(), 0, kBuffer, region.id(), 0)).status(),
                "to across the end");

  EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes), before.memory_used_bytes);
  EXPECT_EQ(TakeSnapshot(*client_), before);
  ASSIGN_OR_FAIL(std::vector<double> after, DownloadArray<double>(*client_, buffer.id()));
  EXPECT_EQ(after, original) << "a failed copy changed the buffer";
  ASSIGN_OR_FAIL(after, DownloadArray<double>(*client_, other.id()));
  EXPECT_EQ(after, other_values);

  // What the object still holds copies both ways. (The copy to the region across the
  // end may have written its bytes before the end: the region is the client's to fix.)
  std::memcpy(segment.data(), values.data(), kShrunk);
  ASSERT_OK(raw.CopyFrom(CopyInto(region.id(), 0, buffer.id(), 8, kShrunk)));
  ASSIGN_OR_FAIL(after, DownloadArray<double>(*client_, buffer.id()));
  std::vector<double> expected = original;
  std::copy(values.begin(), values.end(), expected.begin() + 1);
  EXPECT_EQ(after, expected);
  ASSERT_OK(raw.CopyTo(CopyOut(other.id(), 0, kShrunk, region.id(), 0)));
  EXPECT_EQ(std::memcmp(segment.data(), other_values.data(), kShrunk), 0);
}

#if defined(__has_feature)
#define GPUCOMPUTE_HAS_FEATURE(x) __has_feature(x)
#else
#define GPUCOMPUTE_HAS_FEATURE(x) 0
#endif

// The handler that rescues region copies leaves every other SIGBUS as it was: a fault
// elsewhere, and a SIGBUS sent, still end the process.
TEST_F(SharedMemoryTest, ASigbusOutsideARegionCopyStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto fault = [&](bool sent) {
    RawShm raw(*server_, "shm-test");
    Segment segment(2 * 4096);
    const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
    if (fd < 0) std::_Exit(2);
    // A registration installs the handler.
    if (!raw.Register(segment.name(), 0, segment.size()).ok()) std::_Exit(1);
    // This process ends before the segment's destructor runs: unlink the name now, or
    // it stays behind, and a later test process that gets this pid cannot make its own.
    shm_unlink(segment.name().c_str());
    if (sent) raise(SIGBUS);
    if (ftruncate(fd, 0) != 0) std::_Exit(2);
    std::printf("%d\n", *static_cast<volatile char*>(segment.data() + 4096));
    std::_Exit(0);
  };
#if defined(__SANITIZE_ADDRESS__) || GPUCOMPUTE_HAS_FEATURE(address_sanitizer)
  // Under AddressSanitizer the handler ours chains to is the sanitizer's, which reports
  // the fault and exits with 1.
  EXPECT_EXIT(fault(/*sent=*/false), ::testing::ExitedWithCode(1), "AddressSanitizer: BUS");
  EXPECT_EXIT(fault(/*sent=*/true), ::testing::ExitedWithCode(1), "AddressSanitizer: BUS");
#else
  EXPECT_EXIT(fault(/*sent=*/false), ::testing::KilledBySignal(SIGBUS), "");
  EXPECT_EXIT(fault(/*sent=*/true), ::testing::KilledBySignal(SIGBUS), "");
#endif
}

TEST_F(SharedMemoryTest, RejectedCopiesChangeNothing) {
  RawShm raw(*server_, "shm-test");
  Segment segment(4096);
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, 4096));
  ASSIGN_OR_FAIL(v1::RegionInfo read_only, raw.Register(segment.name(), 0, 4096, true));
  const std::vector<double> original = RandomDoubles(1000, -1e3, 1e3, 5);
  ASSIGN_OR_FAIL(v1::BufferInfo buffer, UploadArray(*client_, original, {}, v1::LAYOUT_C, "b"));
  std::memset(segment.data(), 0x5a, 4096);
  const Snapshot before = TakeSnapshot(*client_);
  const std::string id = buffer.id();
  const std::string segment_before(segment.data(), 4096);

  auto expect_invalid = [&](const absl::Status& status, const std::string& what) {
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << what << ": " << status;
  };
  // The region is too small for the buffer.
  v1::CopyFromRegionRequest create;
  create.set_region_id(region.id());
  *create.mutable_create() = CreateFloat64(1000, "too_big").create();
  expect_invalid(raw.CopyFrom(create).status(), "region too small for a new buffer");
  expect_invalid(raw.CopyFrom(CopyInto(region.id(), 0, id, 0, 8000)).status(),
                 "region too small for the range");
  expect_invalid(raw.CopyTo(CopyOut(id, 0, 0, region.id(), 0)).status(),
                 "region too small for the whole buffer");
  // Out of bounds, on either side, with ends that overflow.
  for (const auto& [region_offset, offset, size] :
       std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{{kMax, 0, 8},
                                                             {4096, 0, 8},
                                                             {4088, 0, 16},
                                                             {8, 0, kMax - 7},
                                                             {0, kMax, 8},
                                                             {0, 8000, 8},
                                                             {0, 7992, 16},
                                                             {0, 8, kMax},
                                                             {kMax - 7, kMax - 7, 8}}) {
    const std::string what = absl::StrCat(region_offset, " ", offset, " +", size);
    expect_invalid(raw.CopyFrom(CopyInto(region.id(), region_offset, id, offset, size)).status(),
                   "from " + what);
    expect_invalid(raw.CopyTo(CopyOut(id, offset, size, region.id(), region_offset)).status(),
                   "to " + what);
  }
  // A new buffer must start at 0 and take exactly its size.
  create.mutable_create()->clear_shape();
  create.mutable_create()->add_shape(8);
  create.set_offset_bytes(8);
  expect_invalid(raw.CopyFrom(create).status(), "create at an offset");
  create.set_offset_bytes(0);
  create.set_size_bytes(32);
  expect_invalid(raw.CopyFrom(create).status(), "create of another size");
  // A read-only region is never written.
  expect_invalid(raw.CopyTo(CopyOut(id, 0, 8, read_only.id(), 0)).status(), "into read-only");
  // Nothing names a target.
  v1::CopyFromRegionRequest no_target;
  no_target.set_region_id(region.id());
  expect_invalid(raw.CopyFrom(no_target).status(), "no target");

  EXPECT_EQ(TakeSnapshot(*client_), before);
  ASSIGN_OR_FAIL(std::vector<double> after, DownloadArray<double>(*client_, id));
  EXPECT_EQ(after, original) << "a rejected copy changed the buffer";
  EXPECT_EQ(std::string(segment.data(), 4096), segment_before)
      << "a rejected copy changed the region";

  // The read-only region still serves as a source.
  ASSERT_OK(raw.CopyFrom(CopyInto(read_only.id(), 0, id, 8, 4096)));
  ASSIGN_OR_FAIL(after, DownloadArray<double>(*client_, id));
  std::vector<double> expected = original;
  std::memcpy(expected.data() + 1, segment.data(), 4096);
  EXPECT_EQ(after, expected);
}

TEST_F(SharedMemoryTest, UnregisteredAndOtherClientsRegionsAreNotFound) {
  RawShm owner(*server_, "owner");
  RawShm other(*server_, "other");
  Segment segment(4096);
  ASSIGN_OR_FAIL(v1::RegionInfo region, owner.Register(segment.name(), 0, 4096));
  ASSIGN_OR_FAIL(
      v1::BufferInfo buffer,
      UploadArray(*server_->Connect("other"), RandomDoubles(16, -1e3, 1e3, 6), {}, v1::LAYOUT_C));
  const std::string unknown = "shm-0123456789abcdef0123456789abcdef";

  // Another client's id answers exactly as an unknown one does.
  const absl::Status theirs = other.CopyTo(CopyOut(buffer.id(), 0, 8, region.id(), 0)).status();
  const absl::Status nobodys = other.CopyTo(CopyOut(buffer.id(), 0, 8, unknown, 0)).status();
  EXPECT_TRUE(absl::IsNotFound(theirs)) << theirs;
  EXPECT_EQ(absl::StrReplaceAll(theirs.message(), {{region.id(), "ID"}}),
            absl::StrReplaceAll(nobodys.message(), {{unknown, "ID"}}));
  EXPECT_TRUE(absl::IsNotFound(other.Unregister(region.id())));
  EXPECT_TRUE(
      absl::IsNotFound(other.CopyFrom(CopyInto(region.id(), 0, buffer.id(), 0, 8)).status()));
  ASSIGN_OR_FAIL(v1::ListRegionsResponse theirs_list, other.List());
  EXPECT_EQ(theirs_list.regions_size(), 0);
  // ... and the owner's region is untouched by all that.
  ASSIGN_OR_FAIL(v1::ListRegionsResponse list, owner.List());
  ASSERT_EQ(list.regions_size(), 1);
  EXPECT_EQ(list.regions(0).id(), region.id());

  ASSERT_OK(owner.Unregister(region.id()));
  EXPECT_TRUE(absl::IsNotFound(owner.Unregister(region.id())));
  v1::CopyFromRegionRequest create;
  create.set_region_id(region.id());
  *create.mutable_create() = CreateFloat64(8).create();
  EXPECT_TRUE(absl::IsNotFound(owner.CopyFrom(create).status()));
  ASSIGN_OR_FAIL(list, owner.List());
  EXPECT_EQ(list.regions_size(), 0);
}

TEST_F(SharedMemoryTest, DisabledServiceNamesTheFlag) {
  Start(/*allow=*/false, 600);
  RawShm raw(*server_, "shm-test");
  Segment segment(4096);
  // An upload under way, which a copy cannot name either.
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = CreateFloat64(8);
  ASSIGN_OR_FAIL(v1::BeginUploadResponse started, client_->BeginUpload(begin));
  const Snapshot before = TakeSnapshot(*client_);
  auto expect_flag = [](const absl::Status& status, const std::string& flag) {
    EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
    EXPECT_NE(status.message().find(flag), std::string::npos) << status;
  };
  expect_flag(raw.Register(segment.name(), 0, 4096).status(), "--allow-shared-memory");
  v1::RegisterRegionRequest ipc;
  ipc.mutable_cuda_ipc()->set_handle(std::string(64, '\0'));
  ipc.mutable_cuda_ipc()->set_size_bytes(64);
  expect_flag(raw.Call(&v1::SharedMemoryService::Stub::RegisterRegion, ipc).status(),
              "--allow-cuda-ipc");
  v1::ExportBufferRequest exported;
  *exported.mutable_create() = CreateFloat64(8).create();
  expect_flag(raw.Export(exported).status(), "--allow-cuda-ipc");
  expect_flag(raw.List().status(), "--allow-shared-memory");
  expect_flag(raw.Unregister("shm-0123456789abcdef0123456789abcdef"), "--allow-shared-memory");
  v1::CopyFromRegionRequest create;
  *create.mutable_create() = CreateFloat64(8).create();
  expect_flag(raw.CopyFrom(create).status(), "--allow-shared-memory");
  expect_flag(raw.CopyFrom(IntoUpload("shm-0123456789abcdef0123456789abcdef", 0,
                                      started.transfer_id(), 0, 64))
                  .status(),
              "--allow-shared-memory");
  SharedMemoryTransport shm(*client_);
  expect_flag(shm.Upload(CreateFloat64(8), Bytes(RandomDoubles(8, -1e3, 1e3, 7))).status(),
              "--allow-shared-memory");
  EXPECT_EQ(TakeSnapshot(*client_), before);
  EXPECT_EQ(MappingsOf(segment.name()), 1);
}

TEST_F(SharedMemoryTest, CudaIpcOnTheCpuBackendFailsClearlyAndChangesNothing) {
  if (TestBackendName() != "cpu") GTEST_SKIP() << "CUDA IPC itself: cuda_ipc_test";
  RawShm raw(*server_, "shm-test");
  ASSIGN_OR_FAIL(v1::BufferInfo buffer, UploadArray(*client_, RandomDoubles(8, -1e3, 1e3, 8)));
  const Snapshot before = TakeSnapshot(*client_);
  v1::ExportBufferRequest request;
  *request.mutable_create() = CreateFloat64(1024, "exported").create();
  absl::Status status = raw.Export(request).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("cuda backend"), std::string::npos) << status;
  request.set_buffer(buffer.id());
  status = raw.Export(request).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("not created exportable"), std::string::npos) << status;
  v1::RegisterRegionRequest ipc;
  ipc.mutable_cuda_ipc()->set_handle(std::string(64, '\0'));
  ipc.mutable_cuda_ipc()->set_size_bytes(64);
  status = raw.Call(&v1::SharedMemoryService::Stub::RegisterRegion, ipc).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_EQ(TakeSnapshot(*client_), before);
  ASSIGN_OR_FAIL(v1::ListRegionsResponse list, raw.List());
  EXPECT_EQ(list.regions_size(), 0);
}

TEST_F(SharedMemoryTest, CopiesKeepTheBuffersOrderAcrossStreams) {
  // A writer queued on another stream comes before a later copy out of the buffer, and a
  // copy in comes before a later reader: the executor's hazards, as for uploads.
  const size_t n = 1 << 16;
  const std::vector<double> x = RandomDoubles(n, -1e3, 1e3, 9);
  SharedMemoryTransport shm(*client_);
  ASSERT_OK(shm.Upload(CreateFloat64(n, "ox"), Bytes(x)));
  ASSIGN_OR_FAIL(v1::StreamInfo stream, client_->CreateStream());
  ASSERT_OK(client_->CreateBuffer([&] {
    v1::CreateBufferRequest r;
    r.set_dtype(v1::DTYPE_FLOAT64);
    r.add_shape(n);
    r.set_name("oy");
    return r;
  }()));
  for (int round = 0; round < 3; ++round) {
    // Each round's result differs, so a copy that overtook its writer shows.
    const double k = round + 2;
    v1::SubmitRequest request = Elementwise(
        "x * k", {{"x", BufferOperand("ox")}, {"k", ScalarOperand(k)}}, ExistingOutput("oy"));
    request.set_stream_id(stream.id());
    ASSERT_OK(client_->Submit(request));  // not waited for
    std::string bytes;
    v1::DownloadRequest down;
    down.set_buffer("oy");
    ASSERT_OK(shm.Download(down, &bytes));
    const std::vector<double> y = AsDoubles(bytes);
    ASSERT_EQ(y.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * k) << "round " << round << " at " << i;
  }
}

TEST_F(SharedMemoryTest, IdleRegionsAreReleased) {
  Start(/*allow=*/true, /*idle_timeout_seconds=*/0.2);
  RawShm raw(*server_, "shm-test");
  Segment segment(4096);
  const absl::Time registered = absl::Now();
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, 4096));
  EXPECT_EQ(MappingsOf(segment.name()), 2);
  absl::Time gone;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    ASSIGN_OR_FAIL(v1::ListRegionsResponse list, raw.List());
    if (list.regions_size() == 0) {
      gone = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_NE(gone, absl::Time()) << "the idle region was never released";
  EXPECT_GE(gone - registered, absl::Milliseconds(200));
  EXPECT_EQ(MappingsOf(segment.name()), 1) << "the released region is still mapped";
  EXPECT_TRUE(absl::IsNotFound(raw.CopyTo(CopyOut("x", 0, 8, region.id(), 0)).status()));
}

// A client that dies mid-way through a multi-range upload from shared memory (its
// connection gone: every call of it cancelled at once) right after the header, with
// copies in flight, or after its last range but before the commit, leaves nothing once
// the server's --upload-idle-timeout has passed: no buffer, no reserved memory, no upload
// under way for its tenant; and the server still stops at once. The upload asks for no
// idle timeout of its own, as SharedMemoryTransport's do. The kill points are repeated
// to catch a race with the copies.
TEST_F(SharedMemoryTest, ClientGoneMidUploadLeavesNothing) {
  client_.reset();
  server_ = TestServer::StartWith(nullptr, 256 * kMiB, 2, [](ServerOptions& options) {
    options.allow_shared_memory = true;
    options.upload_idle_timeout_seconds = 0.3;
  });
  ASSERT_NE(server_, nullptr);
  client_ = server_->Connect("shm-test");
  ASSERT_NE(client_, nullptr);
  constexpr uint64_t kPiece = 512 << 10;
  constexpr int kPieces = 6;
  Segment segment(kPiece * kPieces);
  RawShm raw(*server_, "shm-test");
  ASSIGN_OR_FAIL(v1::RegionInfo region, raw.Register(segment.name(), 0, segment.size()));
  const Snapshot before = TakeSnapshot(*client_);
  ASSIGN_OR_FAIL(v1::ServerInfo info_before, client_->GetServerInfo());
  struct Copy {
    grpc::ClientContext context;
    v1::CopyFromRegionRequest request;
    v1::CopyRegionResponse response;
    grpc::Status status;
    absl::Notification answered;
  };
  const auto kill_upload_midway = [&](int trial) {
    const int copies = trial % (kPieces + 1);  // 0: after the header; kPieces: every range
    SCOPED_TRACE(absl::StrCat("trial ", trial, ", killed after ", copies, " copies"));
    // A connection of its own, which goes with the client.
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(server_->target(), grpc::InsecureChannelCredentials(), arguments);
    std::unique_ptr<v1::BufferService::Stub> buffers = v1::BufferService::NewStub(channel);
    std::unique_ptr<v1::SharedMemoryService::Stub> shm = v1::SharedMemoryService::NewStub(channel);
    v1::BeginUploadRequest begin;
    *begin.mutable_header() = CreateFloat64(kPiece * kPieces / 8, absl::StrCat("killed-", trial));
    v1::BeginUploadResponse started;
    grpc::ClientContext begin_context;
    begin_context.AddMetadata(kClientMetadataKey, "shm-test");
    const grpc::Status begun = buffers->BeginUpload(&begin_context, begin, &started);
    ASSERT_TRUE(begun.ok()) << begun.error_message();
    std::vector<std::unique_ptr<Copy>> calls;
    for (int k = 0; k < copies; ++k) {
      auto& call = calls.emplace_back(std::make_unique<Copy>());
      call->context.AddMetadata(kClientMetadataKey, "shm-test");
      call->request =
          IntoUpload(region.id(), k * kPiece, started.transfer_id(), k * kPiece, kPiece);
      shm->async()->CopyFromRegion(&call->context, &call->request, &call->response,
                                   [c = call.get()](grpc::Status s) {
                                     c->status = std::move(s);
                                     c->answered.Notify();
                                   });
    }
    absl::SleepFor(absl::Microseconds(trial % 5 * 300));
    for (auto& call : calls) call->context.TryCancel();
    for (auto& call : calls) call->answered.WaitForNotification();
  };
  for (int trial = 0; trial < 140; ++trial) kill_upload_midway(trial);
  // Past the idle timeout. A kill that came after the commit left a whole buffer.
  absl::SleepFor(absl::Milliseconds(600));
  ASSIGN_OR_FAIL(v1::ListBuffersResponse list, client_->ListBuffers());
  int too_late = 0;
  for (const v1::BufferInfo& buffer : list.buffers()) {
    if (!absl::StartsWith(buffer.name(), "killed-")) continue;
    ++too_late;
    ASSERT_OK(client_->DeleteBuffer(buffer.id()));
  }
  EXPECT_LT(too_late, 20) << "the kills came after the commit, so this test tested little";
  EXPECT_EQ(WaitForMemoryUsed(*client_, before.memory_used_bytes, absl::Seconds(2)),
            before.memory_used_bytes)
      << "an upload's reservation was left behind";
  EXPECT_EQ(TakeSnapshot(*client_), before);
  ASSIGN_OR_FAIL(v1::ServerInfo info, client_->GetServerInfo());
  EXPECT_EQ(info.tenant_memory_used_bytes(), info_before.tenant_memory_used_bytes());
  EXPECT_EQ(info.tenant_uploads_in_flight(), 0u);
  // Killed again, and the server stopped at once, well within its grace (10 s).
  for (int trial = 0; trial < 14; ++trial) kill_upload_midway(trial);
  client_.reset();
  const absl::Time stopping = absl::Now();
  server_.reset();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(5));
}

TEST_F(SharedMemoryTest, ShutdownReleasesRegions) {
  RawShm raw(*server_, "shm-test");
  Segment segment(4096);
  ASSERT_OK(raw.Register(segment.name(), 0, 4096));
  ASSERT_OK(raw.Register(segment.name(), 0, 4096, true));
  EXPECT_EQ(MappingsOf(segment.name()), 3);
  client_.reset();
  server_.reset();
  EXPECT_EQ(MappingsOf(segment.name()), 1) << "the stopped server left its mappings";
}

}  // namespace
}  // namespace gpucompute::testing

#include "client/cpp/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/host_identity.h"

namespace gpucompute {
namespace {

// The smallest segment: one page, so that empty transfers have a region too.
constexpr uint64_t kMinRegionBytes = 4096;

// Pieces of a download the server may be copying into the segment while the client
// copies an earlier one out: two keep both sides busy, a few more absorb a late answer.
constexpr uint64_t kDownloadPiecesInFlight = 4;

// CopyToRegion copies a byte range of the buffer; a view's elements come over gRPC.
absl::Status RefuseView(const v1::DownloadRequest& request) {
  if (request.view().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "a view of a buffer downloads over gRPC; shared memory copies whole byte ranges");
}

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A name no other segment has: this process, a counter, and 64 random bits.
std::string NewSegmentName() {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  const uint64_t bits = (uint64_t{random()} << 32) | random();
  return absl::StrFormat("/gpucompute-%d-%d-%016x", getpid(), counter.fetch_add(1), bits);
}

// Sets `stats`' seconds, and its GB/s from them and its bytes.
void SetSeconds(double seconds, v1::TransferStats* stats) {
  stats->set_seconds(seconds);
  stats->set_gbps(seconds > 0 ? stats->bytes() / seconds / 1e9 : 0);
}

void AddTransfer(const v1::TransferStats& piece, v1::TransferStats* total) {
  total->set_bytes(total->bytes() + piece.bytes());
  SetSeconds(total->seconds() + piece.seconds(), total);
}

// How a transfer moves through the segment: in pieces of `piece` bytes (the last one
// shorter), piece k at segment offset (k % slots) * piece, with at most `in_flight`
// pieces' copies under way on the server at once.
struct Pipeline {
  uint64_t piece;
  uint64_t slots;
  uint64_t in_flight;
};

// The pipeline for `length` bytes through a segment of `segment` bytes, in pieces of
// `piece`: pieces of the segment's size, one at a time, where fewer than two pieces fit
// the transfer or the segment.
Pipeline PlanPipeline(uint64_t segment, uint64_t length, uint64_t piece) {
  if (length / 2 < piece || segment / 2 < piece) return {segment, 1, 1};
  const uint64_t slots = segment / piece;
  return {piece, slots, std::min(slots, kDownloadPiecesInFlight)};
}

// Copy calls started without waiting for their answers, which come on gRPC's threads, so
// that the server copies one piece while the client copies another. Each call's context,
// request and response live here until it has ended. The destructor waits for the calls
// still in flight, so that none outlives the memory it refers to; it does not cancel
// them: a copy into the segment goes on after its call is cancelled, and would land in
// whatever the segment holds next.
template <typename Request>
class AsyncCopies {
 public:
  using Method = void (v1::SharedMemoryService::StubInterface::async_interface::*)(
      grpc::ClientContext*, const Request*, v1::CopyRegionResponse*,
      std::function<void(grpc::Status)>);

  AsyncCopies(const Client& client, v1::SharedMemoryService::Stub& stub, Method method)
      : client_(client), stub_(stub), method_(method) {}
  ~AsyncCopies() {
    absl::MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(state_.get(), &State::Idle));
  }
  AsyncCopies(const AsyncCopies&) = delete;
  AsyncCopies& operator=(const AsyncCopies&) = delete;

  // Starts a call; calls are numbered from 0 in the order they start.
  void Start(Request request) {
    auto call = std::make_unique<Call>();
    call->context = client_.NewContext(/*unary=*/false);
    call->request = std::move(request);
    Call* c = call.get();
    {
      absl::MutexLock lock(&state_->mu);
      state_->calls.push_back(std::move(call));
      ++state_->in_flight;
    }
    // The state, not this object, for the answer: the destructor may return as soon as
    // the last answer is in, before its callback has let go of the lock.
    (stub_.async()->*method_)(c->context.get(), &c->request, &c->response,
                              [state = state_, c](grpc::Status status) {
                                absl::MutexLock lock(&state->mu);
                                c->status = FromGrpcStatus(status, *c->context);
                                c->done = true;
                                --state->in_flight;
                              });
  }

  // Waits for call `index` and returns its answer.
  absl::StatusOr<v1::CopyRegionResponse> Wait(size_t index) {
    absl::MutexLock lock(&state_->mu);
    Call& call = *state_->calls[index];
    state_->mu.Await(absl::Condition(&call.done));
    if (!call.status.ok()) return call.status;
    return std::move(call.response);
  }

  // Waits for every call. The first call's answer if all succeeded; otherwise the first
  // failure in the order started, preferring one that is not a cancellation (the cause
  // rather than what it led to).
  absl::StatusOr<v1::CopyRegionResponse> WaitAll() {
    absl::MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(state_.get(), &State::Idle));
    absl::Status failure;
    for (const std::unique_ptr<Call>& call : state_->calls) {
      if (call->status.ok()) continue;
      if (failure.ok() || (absl::IsCancelled(failure) && !absl::IsCancelled(call->status))) {
        failure = call->status;
      }
    }
    if (!failure.ok()) return failure;
    if (state_->calls.empty()) return v1::CopyRegionResponse();
    return std::move(state_->calls.front()->response);
  }

  // Cancels the calls not answered yet (each then answers CANCELLED).
  void Cancel() {
    absl::MutexLock lock(&state_->mu);
    for (const std::unique_ptr<Call>& call : state_->calls) {
      if (!call->done) call->context->TryCancel();
    }
  }

 private:
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    Request request;
    v1::CopyRegionResponse response;
    absl::Status status;
    bool done = false;
  };
  struct State {
    bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return in_flight == 0; }

    absl::Mutex mu;
    std::vector<std::unique_ptr<Call>> calls ABSL_GUARDED_BY(mu);
    int in_flight ABSL_GUARDED_BY(mu) = 0;
  };

  const Client& client_;
  v1::SharedMemoryService::Stub& stub_;
  const Method method_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace

absl::Status CheckSharedMemoryUsable(const v1::ServerInfo& info) {
  if (!info.shared_memory_enabled()) {
    return absl::FailedPreconditionError(
        "the server does not allow shared memory (it runs without --allow-shared-memory)");
  }
  const std::string boot_id = BootId();
  if (info.hostname() != HostName() || boot_id.empty() || info.boot_id() != boot_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server runs on another host (", info.hostname(), ") than this client (",
                     HostName(), "); shared memory needs both on one host"));
  }
  return absl::OkStatus();
}

SharedMemoryTransport::SharedMemoryTransport(Client& client, Options options)
    : client_(client),
      options_(options),
      stub_(v1::SharedMemoryService::NewStub(client.channel())) {}

SharedMemoryTransport::~SharedMemoryTransport() { Release().IgnoreError(); }

absl::Status SharedMemoryTransport::Release() {
  absl::Status status;
  if (!region_id_.empty()) {
    v1::UnregisterRegionRequest request;
    request.set_region_id(region_id_);
    v1::UnregisterRegionResponse response;
    status = FromGrpcStatus(
        stub_->UnregisterRegion(client_.NewContext(/*unary=*/true).get(), request, &response));
    region_id_.clear();
  }
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  return status;
}

absl::Status SharedMemoryTransport::Reserve(uint64_t bytes) {
  uint64_t want = std::max(bytes, kMinRegionBytes);
  if (options_.max_region_bytes != 0) {
    want = std::min(want, std::max(options_.max_region_bytes, kMinRegionBytes));
  }
  if (data_ != nullptr && size_ >= want) return absl::OkStatus();
  if (absl::Status s = Release(); !s.ok() && !absl::IsNotFound(s)) return s;

  const std::string name = NewSegmentName();
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoError(absl::StrCat("shm_open of ", name));
  void* data = MAP_FAILED;
  absl::Status status;
  // Allocated now, not on first touch: a full /dev/shm is an error here rather than a
  // SIGBUS in whichever process writes first.
  if (ftruncate(fd, static_cast<off_t>(want)) != 0) {
    status = ErrnoError(absl::StrCat("sizing shared memory ", name, " to ", want, " bytes"));
  } else if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(want)); error != 0) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("allocating ", want, " bytes of shared memory: ", std::strerror(error)));
  } else {
    // Populated now: the page tables filled in one go cost far less than a fault per
    // page on the first write of each, which the client's first copy would pay.
    data = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (data == MAP_FAILED) status = ErrnoError(absl::StrCat("mmap of ", name));
  }
  close(fd);
  if (status.ok()) {
    v1::RegisterRegionRequest request;
    v1::SystemSharedMemory* system = request.mutable_system();
    system->set_name(name);
    system->set_size_bytes(want);
    v1::RegionInfo region;
    status = FromGrpcStatus(
        stub_->RegisterRegion(client_.NewContext(/*unary=*/true).get(), request, &region));
    if (status.ok()) region_id_ = region.id();
  }
  // Mapped on both sides (or failed): the name is no longer needed, and gone it cannot
  // outlive this process.
  shm_unlink(name.c_str());
  if (!status.ok()) {
    if (data != MAP_FAILED) munmap(data, want);
    return status;
  }
  data_ = static_cast<std::byte*>(data);
  size_ = want;
  return absl::OkStatus();
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::CopyFromRegion(
    const v1::CopyFromRegionRequest& request) {
  return Copy(&v1::SharedMemoryService::Stub::CopyFromRegion, request);
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::CopyToRegion(
    const v1::CopyToRegionRequest& request) {
  return Copy(&v1::SharedMemoryService::Stub::CopyToRegion, request);
}

template <typename Request>
absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::Copy(
    grpc::Status (v1::SharedMemoryService::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          v1::CopyRegionResponse*),
    const Request& request) {
  // No deadline: a copy takes as long as its bytes take, as a streamed transfer does.
  v1::CopyRegionResponse response;
  grpc::Status status =
      (stub_.get()->*method)(client_.NewContext(/*unary=*/false).get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

namespace {

// memcpy, with stores that bypass the cache where there are such (SSE2, which every
// x86-64 CPU has).
void StreamingCopy(char* dst, const char* src, size_t bytes) {
#if defined(__x86_64__)
  // Streaming stores want 16-byte aligned destinations.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t done = head;
  for (; bytes - done >= 64; done += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + done));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + done + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + done + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + done + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + done + 48), d);
  }
  std::memcpy(dst + done, src + done, bytes - done);
  // Streaming stores are weakly ordered: they are all visible before the copy returns
  // (and before a thread that made them is joined).
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

void ParallelCopy(void* dst, const void* src, size_t bytes) {
  // Below a few shares' worth, starting threads costs more than it saves, and a small
  // copy's destination may well be read soon, from the cache. A share takes far longer
  // to copy than its thread to start; a pipelined piece (kPipelinePieceBytes) is copied
  // by 16 threads where the host has the cores.
  constexpr size_t kShare = size_t{4} << 20;
  constexpr size_t kMaxThreads = 16;
  const size_t threads =
      std::min<size_t>({bytes / kShare, kMaxThreads, std::thread::hardware_concurrency()});
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  char* const out = static_cast<char*>(dst);
  const char* const in = static_cast<const char*>(src);
  // Shares end on 4 KiB boundaries, so no two threads write one page.
  const size_t per = (bytes / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads && t * per < bytes; ++t) {
    const size_t begin = t * per;
    const size_t n = std::min(per, bytes - begin);
    workers.emplace_back([=] { StreamingCopy(out + begin, in + begin, n); });
  }
  StreamingCopy(out, in, std::min(per, bytes));
  for (std::thread& w : workers) w.join();
}

absl::Status SharedMemoryTransport::Fill(const UploadReader& reader, uint64_t offset,
                                         uint64_t bytes) {
  for (uint64_t done = 0; done < bytes;) {
    const size_t wanted = static_cast<size_t>(bytes - done);
    absl::StatusOr<size_t> got = reader(std::span<std::byte>(data_ + offset + done, wanted));
    if (!got.ok()) return got.status();
    if (*got == 0 || *got > wanted) {
      return absl::InternalError(absl::StrCat("the upload reader returned ", *got, " bytes when ",
                                              wanted, " were asked for"));
    }
    done += *got;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::Upload(const v1::UploadHeader& header,
                                                                     uint64_t size_bytes,
                                                                     const UploadReader& reader,
                                                                     const ProgressFn& progress) {
  if (header.size_bytes() != 0 && header.size_bytes() != size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", size_bytes,
                                                   " are given"));
  }
  if (absl::Status s = Reserve(size_bytes); !s.ok()) return s;
  if (size_bytes > size_) return UploadInPieces(header, size_bytes, reader, progress);
  // Larger pieces for a larger upload, up to kMaxUploadPieces of them.
  const uint64_t piece =
      std::max(PieceBytes(), (size_bytes + kMaxUploadPieces - 1) / kMaxUploadPieces);
  if (!options_.one_copy_when_it_fits && PlanPipeline(size_, size_bytes, piece).slots > 1) {
    return UploadPipelined(header, size_bytes, reader, progress, piece);
  }
  if (absl::Status s = Fill(reader, 0, size_bytes); !s.ok()) return s;
  absl::StatusOr<v1::CopyRegionResponse> response = CopyIn(header, size_bytes, 0);
  if (response.ok() && progress) progress(size_bytes, size_bytes);
  return response;
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::CopyIn(const v1::UploadHeader& header,
                                                                     uint64_t size_bytes,
                                                                     uint64_t offset) {
  v1::CopyFromRegionRequest request;
  request.set_region_id(region_id_);
  request.set_region_offset_bytes(offset);
  request.set_size_bytes(size_bytes);
  if (header.has_create()) {
    *request.mutable_create() = header.create();
  } else {
    request.set_buffer(header.buffer());
    request.set_offset_bytes(header.offset_bytes());
    if (size_bytes == 0) {
      // Nothing to copy (and 0 would mean "to the end of the buffer").
      absl::StatusOr<v1::BufferInfo> info = client_.GetBuffer(header.buffer());
      if (!info.ok()) return info.status();
      v1::CopyRegionResponse response;
      *response.mutable_buffer() = *std::move(info);
      return response;
    }
  }
  return CopyFromRegion(request);
}

absl::Status SharedMemoryTransport::CheckWithinSegment(uint64_t offset, uint64_t bytes) const {
  if (offset <= size_ && bytes <= size_ - offset) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", +", bytes,
                                            ") are outside the shared-memory segment of ", size_,
                                            " bytes"));
}

absl::StatusOr<std::span<std::byte>> SharedMemoryTransport::Staging(uint64_t offset,
                                                                    uint64_t bytes) {
  if (offset > std::numeric_limits<uint64_t>::max() - bytes) {
    return absl::OutOfRangeError("the staging range overflows");
  }
  if (absl::Status s = Reserve(offset + bytes); !s.ok()) return s;
  if (absl::Status s = CheckWithinSegment(offset, bytes); !s.ok()) return s;
  return std::span<std::byte>(data_ + offset, static_cast<size_t>(bytes));
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::UploadStaged(
    const v1::UploadHeader& header, uint64_t size_bytes, uint64_t offset) {
  if (header.size_bytes() != 0 && header.size_bytes() != size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", size_bytes,
                                                   " are staged"));
  }
  if (data_ == nullptr) return absl::FailedPreconditionError("nothing is staged: call Staging");
  if (absl::Status s = CheckWithinSegment(offset, size_bytes); !s.ok()) return s;
  return CopyIn(header, size_bytes, offset);
}

absl::StatusOr<std::span<const std::byte>> SharedMemoryTransport::DownloadStaged(
    const v1::DownloadRequest& request, uint64_t offset, v1::CopyRegionResponse* response) {
  if (data_ == nullptr) return absl::FailedPreconditionError("no segment yet: call Staging");
  if (absl::Status s = RefuseView(request); !s.ok()) return s;
  v1::CopyToRegionRequest copy;
  copy.set_buffer(request.buffer());
  copy.set_offset_bytes(request.offset_bytes());
  copy.set_size_bytes(request.size_bytes());
  copy.set_region_id(region_id_);
  copy.set_region_offset_bytes(offset);
  if (request.size_bytes() != 0) {
    if (absl::Status s = CheckWithinSegment(offset, request.size_bytes()); !s.ok()) return s;
  }
  // A range to the end of the buffer is checked by the server against the region.
  absl::StatusOr<v1::CopyRegionResponse> copied = CopyToRegion(copy);
  if (!copied.ok()) return copied.status();
  const uint64_t bytes = copied->transfer().bytes();
  if (absl::Status s = CheckWithinSegment(offset, bytes); !s.ok()) return s;
  if (response != nullptr) *response = *std::move(copied);
  return std::span<const std::byte>(data_ + offset, static_cast<size_t>(bytes));
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::UploadInPieces(
    const v1::UploadHeader& header, uint64_t size_bytes, const UploadReader& reader,
    const ProgressFn& progress) {
  std::string target = header.buffer();
  uint64_t offset = header.offset_bytes();
  // A new buffer without a lease of its own holds one until every piece is in, so that
  // one left part written, by a client killed midway, is reclaimed. Each piece's copy
  // renews it.
  const bool upload_lease = header.has_create() && header.create().ttl_seconds() == 0;
  if (header.has_create()) {
    v1::CreateBufferRequest create = header.create();
    if (upload_lease) {
      absl::StatusOr<v1::ServerInfo> info = client_.GetServerInfo();
      if (!info.ok()) return info.status();
      const double longest = info->limits().max_ttl_seconds();
      create.set_ttl_seconds(longest > 0 ? std::min(kUploadLeaseSeconds, longest)
                                         : kUploadLeaseSeconds);
    }
    absl::StatusOr<v1::BufferInfo> created = client_.CreateBuffer(create);
    if (!created.ok()) return created.status();
    if (created->size_bytes() != size_bytes) {
      client_.DeleteBuffer(created->id()).IgnoreError();
      return absl::InvalidArgumentError(absl::StrCat("the upload has ", size_bytes,
                                                     " bytes but the new buffer holds ",
                                                     created->size_bytes()));
    }
    target = created->id();
    offset = 0;
  }
  absl::StatusOr<v1::CopyRegionResponse> total = CopyPiecesIn(target, offset, size_bytes, reader,
                                                             progress);
  if (total.ok() && upload_lease) {
    absl::StatusOr<v1::BufferInfo> kept = client_.RenewLease(target, 0);
    if (kept.ok()) {
      *total->mutable_buffer() = *std::move(kept);
    } else {
      total = kept.status();
    }
  }
  // A new buffer goes once no copy into it is left in flight (CopyPiecesIn waits for them).
  if (!total.ok() && header.has_create()) client_.DeleteBuffer(target).IgnoreError();
  return total;
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::CopyPiecesIn(
    const std::string& buffer, uint64_t offset, uint64_t size_bytes, const UploadReader& reader,
    const ProgressFn& progress) {
  const Pipeline pipeline = PlanPipeline(size_, size_bytes, PieceBytes());
  const uint64_t pieces = (size_bytes + pipeline.piece - 1) / pipeline.piece;
  AsyncCopies<v1::CopyFromRegionRequest> calls(
      client_, *stub_, &v1::SharedMemoryService::StubInterface::async_interface::CopyFromRegion);
  v1::CopyRegionResponse total;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_answer = start;
  // Takes the answer of piece `k`, the oldest in flight.
  auto answered = [&](uint64_t k) -> absl::Status {
    absl::StatusOr<v1::CopyRegionResponse> response = calls.Wait(k);
    if (!response.ok()) return response.status();
    last_answer = std::chrono::steady_clock::now();
    *total.mutable_buffer() = response->buffer();
    AddTransfer(response->transfer(), total.mutable_transfer());
    if (progress) progress(std::min(size_bytes, (k + 1) * pipeline.piece), size_bytes);
    return absl::OkStatus();
  };
  // Piece k goes through slot k % slots; it is read in only once piece k - in_flight,
  // and so every earlier piece in its slot, has been copied out by the server.
  for (uint64_t k = 0; k < pieces; ++k) {
    if (k >= pipeline.in_flight) {
      if (absl::Status s = answered(k - pipeline.in_flight); !s.ok()) return s;
    }
    const uint64_t done = k * pipeline.piece;
    const uint64_t bytes = std::min(pipeline.piece, size_bytes - done);
    const uint64_t slot_offset = k % pipeline.slots * pipeline.piece;
    if (absl::Status s = Fill(reader, slot_offset, bytes); !s.ok()) return s;
    v1::CopyFromRegionRequest request;
    request.set_region_id(region_id_);
    request.set_region_offset_bytes(slot_offset);
    request.set_size_bytes(bytes);
    request.set_buffer(buffer);
    request.set_offset_bytes(offset + done);
    calls.Start(std::move(request));
  }
  for (uint64_t k = pieces > pipeline.in_flight ? pieces - pipeline.in_flight : 0; k < pieces;
       ++k) {
    if (absl::Status s = answered(k); !s.ok()) return s;
  }
  if (pipeline.in_flight > 1) {
    // The pieces' copies overlap: the whole, as the client saw it.
    SetSeconds(std::chrono::duration<double>(last_answer - start).count(),
               total.mutable_transfer());
  }
  return total;
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::UploadPipelined(
    const v1::UploadHeader& header, uint64_t size_bytes, const UploadReader& reader,
    const ProgressFn& progress, uint64_t piece) {
  // Piece k is bytes [k * piece, +piece) of the upload and of the segment. The first is
  // in the segment before the upload begins: a reader that fails at once leaves nothing
  // on the server.
  if (absl::Status s = Fill(reader, 0, std::min(piece, size_bytes)); !s.ok()) return s;
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = header;
  begin.mutable_header()->set_size_bytes(size_bytes);
  absl::StatusOr<v1::BeginUploadResponse> started = client_.BeginUpload(begin);
  if (!started.ok()) return started.status();
  // Every call answers once the whole upload has committed or failed: a call that
  // failed fails them all, so none is waited for before the last has started.
  AsyncCopies<v1::CopyFromRegionRequest> calls(
      client_, *stub_, &v1::SharedMemoryService::StubInterface::async_interface::CopyFromRegion);
  for (uint64_t done = 0; done < size_bytes;) {
    const uint64_t bytes = std::min(piece, size_bytes - done);
    if (done != 0) {
      if (absl::Status s = Fill(reader, done, bytes); !s.ok()) {
        // A cancelled call fails the upload on the server (and if none of them has
        // reached it yet, the upload's idle timeout does), so nothing is committed.
        calls.Cancel();
        return s;
      }
    }
    v1::CopyFromRegionRequest request;
    request.set_region_id(region_id_);
    request.set_region_offset_bytes(done);
    request.set_transfer_id(started->transfer_id());
    request.set_offset_bytes(done);
    request.set_size_bytes(bytes);
    calls.Start(std::move(request));
    done += bytes;
    // All of it only once it is in.
    if (progress && done < size_bytes) progress(done, size_bytes);
  }
  absl::StatusOr<v1::CopyRegionResponse> response = calls.WaitAll();
  if (response.ok() && progress) progress(size_bytes, size_bytes);
  return response;
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::Upload(
    const v1::UploadHeader& header, std::span<const std::byte> data) {
  return Upload(
      header, data.size(),
      [data, position = size_t{0}](std::span<std::byte> out) mutable -> absl::StatusOr<size_t> {
        const size_t n = std::min(out.size(), data.size() - position);
        ParallelCopy(out.data(), data.data() + position, n);
        position += n;
        return n;
      });
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::Download(
    const v1::DownloadRequest& request, const DownloadSink& sink, const ProgressFn& progress) {
  return DownloadPieces(request, {}, sink, progress);
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::DownloadPieces(
    const v1::DownloadRequest& request, const std::function<void(uint64_t)>& on_length,
    const DownloadSink& sink, const ProgressFn& progress) {
  if (absl::Status s = RefuseView(request); !s.ok()) return s;
  absl::StatusOr<v1::BufferInfo> info = client_.GetBuffer(request.buffer());
  if (!info.ok()) return info.status();
  const uint64_t size = info->size_bytes();
  const uint64_t offset = request.offset_bytes();
  if (offset > size || request.size_bytes() > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", offset, ", +", request.size_bytes(),
                                                   ") are outside buffer ", info->id(), " of ",
                                                   size, " bytes"));
  }
  const uint64_t length = request.size_bytes() == 0 ? size - offset : request.size_bytes();
  if (absl::Status s = Reserve(length); !s.ok()) return s;
  if (on_length) on_length(length);
  const Pipeline pipeline = PlanPipeline(size_, length, PieceBytes());
  const uint64_t pieces = (length + pipeline.piece - 1) / pipeline.piece;
  AsyncCopies<v1::CopyToRegionRequest> calls(
      client_, *stub_, &v1::SharedMemoryService::StubInterface::async_interface::CopyToRegion);
  v1::CopyRegionResponse total;
  *total.mutable_buffer() = *info;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_answer = start;
  // Piece k goes to slot k % slots; it is asked for only once piece k - in_flight, and so
  // every earlier piece in its slot, has been handed to the sink.
  uint64_t asked = 0;
  for (uint64_t k = 0; k < pieces; ++k) {
    for (; asked < pieces && asked < k + pipeline.in_flight; ++asked) {
      v1::CopyToRegionRequest copy;
      // By id: the name could be rebound between the pieces.
      copy.set_buffer(info->id());
      copy.set_offset_bytes(offset + asked * pipeline.piece);
      copy.set_size_bytes(std::min(pipeline.piece, length - asked * pipeline.piece));
      copy.set_region_id(region_id_);
      copy.set_region_offset_bytes(asked % pipeline.slots * pipeline.piece);
      calls.Start(std::move(copy));
    }
    absl::StatusOr<v1::CopyRegionResponse> response = calls.Wait(k);
    if (!response.ok()) return response.status();
    last_answer = std::chrono::steady_clock::now();
    const uint64_t done = k * pipeline.piece;
    const uint64_t bytes = std::min(pipeline.piece, length - done);
    const char* piece = reinterpret_cast<const char*>(data_) + k % pipeline.slots * pipeline.piece;
    if (absl::Status s = sink(offset + done, std::string_view(piece, static_cast<size_t>(bytes)));
        !s.ok()) {
      return s;
    }
    *total.mutable_buffer() = response->buffer();
    AddTransfer(response->transfer(), total.mutable_transfer());
    if (progress) progress(done + bytes, length);
  }
  if (pipeline.in_flight > 1) {
    // The pieces' copies overlap, each one's seconds counting its wait behind the others:
    // the whole, as the client saw it from the first call to the last answer.
    SetSeconds(std::chrono::duration<double>(last_answer - start).count(),
               total.mutable_transfer());
  }
  return total;
}

absl::StatusOr<v1::CopyRegionResponse> SharedMemoryTransport::Download(
    const v1::DownloadRequest& request, std::string* data) {
  data->clear();
  // Sized once, rather than grown piece by piece (each growth would copy what is in).
  return DownloadPieces(
      request, [data](uint64_t length) { data->resize(static_cast<size_t>(length)); },
      [data, start = request.offset_bytes()](uint64_t offset, std::string_view piece) {
        ParallelCopy(data->data() + (offset - start), piece.data(), piece.size());
        return absl::OkStatus();
      },
      {});
}

SharedMemoryTransport::Options SharedMemoryTransport::Bounded(uint64_t segment_bytes) {
  const uint64_t segment = std::max(segment_bytes, kMinRegionBytes);
  return Options{.max_region_bytes = segment,
                 .piece_bytes = std::max<uint64_t>(1, segment / kOneShotSegmentPieces),
                 .one_copy_when_it_fits = true};
}

uint64_t SharedMemoryTransport::PieceBytes() const {
  return options_.piece_bytes != 0 ? options_.piece_bytes : kPipelinePieceBytes;
}

}  // namespace gpucompute

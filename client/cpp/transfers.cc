// The Client's transfers: Upload and Download as raw streams of wire-format messages
// (common/wire_format.h), uploads and downloads split into ranges over transfer
// connections, and the download sink that runs behind the reading thread.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "client/cpp/client_internal.h"
#include "common/crc32c.h"
#include "common/wire_format.h"

namespace gpucompute {

using client_internal::MakeContext;
using client_internal::SettingsOf;

namespace {

// The chunks of an upload from memory: slices over the caller's memory, which outlives
// the call.
std::function<absl::StatusOr<grpc::Slice>(uint64_t)> MemoryChunks(std::span<const std::byte> data,
                                                                  size_t chunk_bytes) {
  return [data, chunk_bytes](uint64_t sent) -> absl::StatusOr<grpc::Slice> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, data.size() - sent));
    return grpc::Slice(data.data() + sent, n, grpc::Slice::STATIC_SLICE);
  };
}

// Upload and Download are called in their raw form, so that chunks go on and off the
// wire as slices (common/wire_format.h).
constexpr char kUploadMethod[] = "/gpucompute.v1.BufferService/Upload";
constexpr char kDownloadMethod[] = "/gpucompute.v1.BufferService/Download";

}  // namespace

absl::StatusOr<v1::UploadResponse> Client::Upload(const v1::UploadHeader& header,
                                                  std::span<const std::byte> data,
                                                  const ProgressFn& progress) {
  if (header.size_bytes() != 0 && header.size_bytes() != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", data.size(),
                                                   " are given"));
  }
  const int streams = TransferStreams(data.size(), /*upload=*/true);
  if (streams > 1) return ParallelUpload(header, data, streams, progress);
  return Routed([&](const Connection& connection) {
    return UploadStream(*connection.channel, header, data.size(), MemoryChunks(data, ChunkBytes()),
                        progress);
  });
}

UploadReader SpanReader(std::span<const std::byte> data) {
  return [data,
          position = uint64_t{0}](std::span<std::byte> out) mutable -> absl::StatusOr<size_t> {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), data.size() - position));
    std::memcpy(out.data(), data.data() + position, n);
    position += n;
    return n;
  };
}

absl::StatusOr<v1::UploadResponse> Client::Upload(const v1::UploadHeader& header,
                                                  uint64_t size_bytes, const UploadReader& reader,
                                                  const ProgressFn& progress) {
  if (header.size_bytes() != 0 && header.size_bytes() != size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the upload header declares ",
                                                   header.size_bytes(), " bytes but ", size_bytes,
                                                   " are given"));
  }
  const size_t chunk_bytes = ChunkBytes();
  // What the reader gave is gone: a redirected upload is made again only if it gave none.
  bool read = false;
  // The reader writes straight into the slice that is sent.
  return Routed([&](const Connection& connection) {
    return UploadStream(
      *connection.channel, header, size_bytes,
      [&](uint64_t sent) -> absl::StatusOr<grpc::Slice> {
        read = true;
        const size_t wanted =
            static_cast<size_t>(std::min<uint64_t>(chunk_bytes, size_bytes - sent));
        grpc::Slice slice(grpc_slice_malloc(wanted), grpc::Slice::STEAL_REF);
        absl::StatusOr<size_t> got = reader(std::span<std::byte>(
            reinterpret_cast<std::byte*>(const_cast<uint8_t*>(slice.begin())), wanted));
        if (!got.ok()) return got.status();
        if (*got == 0 || *got > wanted) {
          return absl::InternalError(absl::StrCat("the upload reader returned ", *got,
                                                  " bytes when ", wanted, " were asked for, after ",
                                                  sent, " of ", size_bytes));
        }
        return *got == wanted ? slice : slice.sub(0, *got);
      },
      progress);
  }, [&] { return !read; });
}

absl::StatusOr<v1::UploadResponse> Client::UploadStream(
    grpc::Channel& channel, const v1::UploadHeader& header, uint64_t size_bytes,
    const std::function<absl::StatusOr<grpc::Slice>(uint64_t sent)>& next_chunk,
    const ProgressFn& progress) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  grpc::ByteBuffer response_bytes;
  const grpc::internal::RpcMethod method(kUploadMethod,
                                         grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(&channel, method, context.get(),
                                                                    &response_bytes));
  v1::UploadRequest request;
  *request.mutable_header() = header;
  request.mutable_header()->set_size_bytes(size_bytes);
  // Write returns false once the stream is broken (the server may already have
  // rejected the header); Finish then tells why.
  bool stream_ok = writer->Write(wire::Serialize(request));

  absl::Status local_status;
  uint64_t sent = 0;
  while (stream_ok && sent < size_bytes) {
    absl::StatusOr<grpc::Slice> chunk = next_chunk(sent);
    if (!chunk.ok()) {
      local_status = chunk.status();
      break;
    }
    std::optional<uint32_t> crc;
    if (options_.checksums) crc = ExtendCrc32c(0, chunk->begin(), chunk->size());
    stream_ok = writer->Write(wire::UploadChunk(*chunk, crc));
    if (!stream_ok) break;
    sent += chunk->size();
    if (progress) progress(sent, size_bytes);
  }

  if (!local_status.ok()) {
    // Cancelling makes the server discard what it received.
    context->TryCancel();
    writer->Finish().IgnoreError();
    return local_status;
  }
  if (stream_ok) stream_ok = writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status, *context);
  if (!stream_ok || sent != size_bytes) {
    return absl::UnavailableError(
        absl::StrCat("the upload stream closed after ", sent, " of ", size_bytes, " bytes"));
  }
  v1::UploadResponse response;
  if (!wire::Parse(response_bytes, &response).ok()) {
    return absl::InternalError("the server's upload response does not parse");
  }
  return response;
}

absl::StatusOr<v1::BeginUploadResponse> Client::BeginUpload(const v1::BeginUploadRequest& request) {
  return Unary(&Stubs::buffers, &v1::BufferService::Stub::BeginUpload, request);
}

absl::StatusOr<v1::UploadResponse> Client::UploadRange(std::string_view transfer_id,
                                                       uint64_t offset_bytes,
                                                       std::span<const std::byte> data, int channel,
                                                       const ProgressFn& progress) {
  v1::UploadHeader header;
  header.set_transfer_id(std::string(transfer_id));
  header.set_offset_bytes(offset_bytes);
  return UploadStream(*TransferChannel(channel), header, data.size(),
                      MemoryChunks(data, ChunkBytes()), progress);
}

namespace {

// [offset, offset + size) of each of `streams` ranges of `bytes`: equal ones, the last
// taking the remainder.
std::vector<std::pair<uint64_t, uint64_t>> SplitRanges(uint64_t bytes, int streams) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const uint64_t each = bytes / streams;
  for (int i = 0; i < streams; ++i) {
    const uint64_t offset = each * i;
    ranges.emplace_back(offset, i + 1 == streams ? bytes - offset : each);
  }
  return ranges;
}

// The error a split transfer reports: the cause rather than the cancellations it led to.
absl::Status FirstCause(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok() && s.code() != absl::StatusCode::kCancelled) return s;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Sums the progress of concurrent ranges for one ProgressFn.
class SharedProgress {
 public:
  SharedProgress(const ProgressFn& progress, uint64_t total) : progress_(progress), total_(total) {}
  void Add(uint64_t bytes) {
    if (!progress_) return;
    absl::MutexLock lock(&mu_);
    done_ += bytes;
    progress_(done_, total_);
  }

 private:
  const ProgressFn& progress_;
  const uint64_t total_;
  absl::Mutex mu_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs transfer(i, progress of range i) for each of `ranges` ranges concurrently, one
// thread each; returns their results, or the cause of the first failure.
template <typename Response>
absl::StatusOr<std::vector<Response>> RunRanges(
    size_t ranges, uint64_t total, const ProgressFn& progress,
    const std::function<absl::StatusOr<Response>(size_t, const ProgressFn&)>& transfer) {
  std::vector<absl::Status> statuses(ranges);
  std::vector<Response> responses(ranges);
  SharedProgress shared_progress(progress, total);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranges; ++i) {
    threads.emplace_back([&, i] {
      ProgressFn range_progress = [&, last = uint64_t{0}](uint64_t done, uint64_t) mutable {
        shared_progress.Add(done - last);
        last = done;
      };
      absl::StatusOr<Response> r = transfer(i, range_progress);
      if (r.ok()) {
        responses[i] = *std::move(r);
      } else {
        statuses[i] = r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (absl::Status s = FirstCause(statuses); !s.ok()) return s;
  return responses;
}

}  // namespace

absl::StatusOr<v1::UploadResponse> Client::ParallelUpload(const v1::UploadHeader& header,
                                                          std::span<const std::byte> data,
                                                          int streams, const ProgressFn& progress) {
  v1::BeginUploadRequest begin;
  *begin.mutable_header() = header;
  begin.mutable_header()->set_size_bytes(data.size());
  absl::StatusOr<v1::BeginUploadResponse> started = BeginUpload(begin);
  if (!started.ok()) return started.status();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = SplitRanges(data.size(), streams);
  absl::StatusOr<std::vector<v1::UploadResponse>> responses = RunRanges<v1::UploadResponse>(
      ranges.size(), data.size(), progress, [&](size_t i, const ProgressFn& range_progress) {
        return UploadRange(started->transfer_id(), ranges[i].first,
                           data.subspan(ranges[i].first, ranges[i].second),
                           static_cast<int>(i) + 1, range_progress);
      });
  if (!responses.ok()) return responses.status();
  return responses->front();
}

absl::StatusOr<v1::DownloadResponse> Client::DownloadImpl(
    const v1::DownloadRequest& request,
    const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
    const DownloadSink& sink, const ProgressFn& progress) {
  // A refused download has given the sink nothing: it is made again after a redirect.
  return Routed([&](const Connection& connection) {
    return DownloadOn(*connection.channel, request, on_info, sink, progress, /*whole_chunks=*/true,
                      /*sink_behind=*/false);
  });
}

namespace {

// Runs a download's sink on a thread of its own, behind the thread that reads: that
// thread, which also receives the bytes from the socket, hands each message over and
// reads the next one while the sink copies the last one out. At most one message waits
// while another is being copied; the message's slices travel with it.
class SinkBehind {
 public:
  explicit SinkBehind(const DownloadSink& sink) : sink_(sink), thread_([this] { Loop(); }) {}
  ~SinkBehind() { Finish().IgnoreError(); }
  SinkBehind(const SinkBehind&) = delete;
  SinkBehind& operator=(const SinkBehind&) = delete;

  // Waits until no message waits, then hands `message` over; the first sink error so
  // far, in which case `message` is dropped.
  absl::Status Push(wire::DownloadMessage message) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &SinkBehind::CanPush));
    if (!status_.ok()) return status_;
    pending_.emplace(std::move(message));
    return absl::OkStatus();
  }

  // Waits for every message handed over and stops the thread; the first sink error.
  absl::Status Finish() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.has_value() || !status_.ok();
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || closing_;
  }

  void Loop() {
    for (;;) {
      wire::DownloadMessage message;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &SinkBehind::HasWork));
        if (!pending_.has_value()) return;  // closing, and nothing is left
        message = *std::move(pending_);
        pending_.reset();
      }
      absl::Status status;
      uint64_t offset = message.offset_bytes;
      for (std::string_view piece : message.data.views) {
        status = sink_(offset, piece);
        if (!status.ok()) break;
        offset += piece.size();
      }
      if (!status.ok()) {
        absl::MutexLock lock(&mu_);
        if (status_.ok()) status_ = std::move(status);
      }
    }
  }

  const DownloadSink& sink_;
  absl::Mutex mu_;
  std::optional<wire::DownloadMessage> pending_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it starts once the members above exist
};

// Downloads from this size on run their sink behind the reading thread (SinkBehind).
constexpr uint64_t kSinkBehindBytes = uint64_t{16} << 20;

}  // namespace

absl::StatusOr<v1::DownloadResponse> Client::DownloadOn(
    grpc::Channel& channel, const v1::DownloadRequest& request,
    const std::function<absl::Status(const v1::BufferInfo&, uint64_t)>& on_info,
    const DownloadSink& sink, const ProgressFn& progress, bool whole_chunks, bool sink_behind) {
  std::unique_ptr<grpc::ClientContext> context = MakeContext(SettingsOf(options_), /*unary=*/false);
  v1::DownloadRequest sent_request = request;
  if (options_.checksums) sent_request.set_crc32c(true);
  const grpc::internal::RpcMethod method(kDownloadMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(&channel, method, context.get(),
                                                                    wire::Serialize(sent_request)));

  v1::DownloadResponse result;
  result.set_offset_bytes(request.offset_bytes());
  grpc::ByteBuffer raw;
  wire::DownloadMessage message;
  std::string joined;
  bool first = true;
  uint64_t total = 0;
  uint64_t received = 0;
  absl::Status local_status;
  // Made once the size is known: only large downloads pay for its thread.
  std::optional<SinkBehind> behind;
  while (reader->Read(&raw)) {
    local_status = wire::ParseDownloadResponse(raw, &message);
    raw.Clear();
    if (!local_status.ok()) break;
    if (first) {
      first = false;
      // With a view, the message describes the view: its shape and bytes in C order.
      if (!message.has_buffer || request.offset_bytes() > message.buffer.size_bytes()) {
        local_status =
            absl::InternalError("the server's first download message does not describe the buffer");
        break;
      }
      *result.mutable_buffer() = message.buffer;
      total = request.size_bytes() != 0 ? request.size_bytes()
                                        : message.buffer.size_bytes() - request.offset_bytes();
      if (on_info) {
        local_status = on_info(result.buffer(), total);
        if (!local_status.ok()) break;
      }
      if (sink_behind && total >= kSinkBehindBytes) behind.emplace(sink);
    }
    if (options_.checksums && message.data.size != 0 &&
        (!message.data_crc32c.has_value() || *message.data_crc32c != message.data.Crc32c())) {
      local_status = absl::DataLossError(
          absl::StrCat("the downloaded bytes at offset ", message.offset_bytes,
                       message.data_crc32c.has_value() ? " do not match their CRC32C"
                                                       : " came without a CRC32C"));
      break;
    }
    // Before the message may move to the sink's thread.
    if (message.has_transfer) *result.mutable_transfer() = message.transfer;
    if (message.data.size != 0) {
      const uint64_t expected_offset = request.offset_bytes() + received;
      if (message.offset_bytes != expected_offset || message.data.size > total - received) {
        local_status = absl::InternalError(absl::StrCat(
            "the server sent ", message.data.size, " bytes at offset ", message.offset_bytes,
            " where ", total - received, " bytes at offset ", expected_offset, " remained"));
        break;
      }
      received += message.data.size;
      if (behind.has_value()) {
        local_status = behind->Push(std::move(message));
        message = wire::DownloadMessage();
      } else if (message.data.views.size() == 1 || !whole_chunks) {
        uint64_t offset = message.offset_bytes;
        for (std::string_view piece : message.data.views) {
          local_status = sink(offset, piece);
          if (!local_status.ok()) break;
          offset += piece.size();
        }
      } else {
        // The sink was promised one call per chunk; gRPC received it in several slices.
        joined.resize(message.data.size);
        message.data.CopyTo(joined.data());
        local_status = sink(message.offset_bytes, joined);
      }
      if (!local_status.ok()) break;
      if (progress) progress(received, total);
    }
  }
  if (behind.has_value() && local_status.ok()) local_status = behind->Finish();

  if (!local_status.ok()) {
    context->TryCancel();
    while (reader->Read(&raw)) {
    }
    reader->Finish().IgnoreError();
    return local_status;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status, *context);
  if (first) return absl::InternalError("the download ended without a message");
  if (received != total) {
    return absl::InternalError(
        absl::StrCat("the download ended after ", received, " of ", total, " bytes"));
  }
  return result;
}

namespace {

absl::Status Reserve(std::string* data, uint64_t total, bool resize) {
  try {
    if (resize) {
      data->resize(static_cast<size_t>(total));
    } else {
      data->reserve(static_cast<size_t>(total));
    }
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot hold ", total, " downloaded bytes in memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      std::string* data,
                                                      const ProgressFn& progress) {
  if (options_.transfer_streams != 1) {
    // `data` as it is: a string that already has the size is not zero-filled again.
    absl::StatusOr<v1::DownloadResponse> parallel = ParallelDownload(request, data, progress);
    // UNIMPLEMENTED: the transfer is too small to split.
    if (parallel.status().code() != absl::StatusCode::kUnimplemented) return parallel;
  }
  data->clear();
  auto reserve = [data](const v1::BufferInfo&, uint64_t total) {
    return Reserve(data, total, /*resize=*/false);
  };
  auto append = [data](uint64_t, std::string_view chunk) {
    data->append(chunk);
    return absl::OkStatus();
  };
  return Routed([&](const Connection& connection) {
    return DownloadOn(*connection.channel, request, reserve, append, progress,
                      /*whole_chunks=*/false, /*sink_behind=*/true);
  });
}

absl::StatusOr<v1::DownloadResponse> Client::ParallelDownload(const v1::DownloadRequest& request,
                                                              std::string* data,
                                                              const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  // The range's size decides the split; a request without one needs the buffer's.
  // The split needs the range's size; a range the buffer does not hold is left to one
  // stream, for the server to refuse.
  if (request.size_bytes() != 0 && TransferStreams(request.size_bytes(), /*upload=*/false) <= 1) {
    return absl::UnimplementedError("one stream");
  }
  absl::StatusOr<v1::BufferInfo> info = GetBuffer(request.buffer());
  if (!info.ok()) return absl::UnimplementedError("one stream");
  // GetBuffer describes the buffer; a view's bytes are the view's elements in C order.
  absl::StatusOr<uint64_t> readable = ViewBytes(*info, request.view());
  if (!readable.ok()) return absl::UnimplementedError("one stream");
  const uint64_t size = *readable;
  const uint64_t offset = request.offset_bytes();
  if (offset > size || request.size_bytes() > size - offset) {
    return absl::UnimplementedError("one stream");
  }
  const uint64_t total = request.size_bytes() == 0 ? size - offset : request.size_bytes();
  const int streams = TransferStreams(total, /*upload=*/false);
  if (streams <= 1) return absl::UnimplementedError("one stream");
  // Resizing writes only bytes the string did not have (a reused string keeps its own).
  if (absl::Status s = Reserve(data, total, /*resize=*/true); !s.ok()) {
    data->clear();
    return s;
  }
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = SplitRanges(total, streams);
  char* out = data->data() - request.offset_bytes();
  absl::StatusOr<std::vector<v1::DownloadResponse>> responses = RunRanges<v1::DownloadResponse>(
      ranges.size(), total, progress, [&](size_t i, const ProgressFn& range_progress) {
        v1::DownloadRequest range = request;
        range.set_offset_bytes(request.offset_bytes() + ranges[i].first);
        range.set_size_bytes(ranges[i].second);
        return DownloadOn(
            *TransferChannel(static_cast<int>(i) + 1), range, {},
            [out](uint64_t offset, std::string_view piece) {
              std::memcpy(out + offset, piece.data(), piece.size());
              return absl::OkStatus();
            },
            range_progress, /*whole_chunks=*/false, /*sink_behind=*/false);
      });
  if (!responses.ok()) {
    data->clear();
    return responses.status();
  }
  v1::DownloadResponse result;
  *result.mutable_buffer() = responses->front().buffer();
  result.set_offset_bytes(request.offset_bytes());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.mutable_transfer()->set_bytes(total);
  result.mutable_transfer()->set_seconds(seconds);
  if (seconds > 0) result.mutable_transfer()->set_gbps(static_cast<double>(total) / seconds / 1e9);
  return result;
}

absl::StatusOr<v1::DownloadResponse> Client::Download(const v1::DownloadRequest& request,
                                                      const DownloadSink& sink,
                                                      const ProgressFn& progress) {
  return DownloadImpl(request, {}, sink, progress);
}

}  // namespace gpucompute

// Transfers through system shared memory, for a client on the server's host
// (SharedMemoryService, enabled on the server by --allow-shared-memory).
//
// A SharedMemoryTransport owns one POSIX shared-memory segment, registered with the server
// as a region. An upload writes the data into the segment and asks the server to copy it
// into a buffer; a download asks the server to copy a buffer into the segment and reads it
// from there. No array bytes cross the socket.
//
// The segment's name is unlinked as soon as the server has mapped it: the memory lives as
// long as the two mappings, so a client that exits or is killed leaves no file in /dev/shm,
// and the server's mapping goes when the region is unregistered, idles out, or the server
// stops.
//
// A transfer that fits the segment is all or nothing: a new buffer appears, or an existing
// range changes, only when every byte is in. The segment grows to fit each transfer, up to
// Options::max_region_bytes; a larger transfer moves through it in pieces, each one copy:
// an upload into an existing buffer then changes it piece by piece, and an upload into a new
// buffer creates it first and deletes it on failure. A client killed midway leaves such a
// buffer part written; unless it was given a lease, it holds one of kUploadLeaseSeconds
// (or the server's longest) until the last piece is in, so that the server reclaims it.
// Such a transfer is pipelined as below, the segment's slots reused in turn.
//
// A transfer of at least two pieces (Options::piece_bytes) is pipelined, so that the
// client's copy and the server's overlap. An upload that fits the segment is one
// multi-range upload (BufferService.BeginUpload) whose ranges are the pieces: the client
// copies piece k + 1 into the segment while the server copies piece k out, and the upload
// commits once all are in. A download asks the server for the next pieces, each into its
// own part of the segment, while it hands the last one to the sink; its pieces are copies
// of their own, so a writer running concurrently on another stream may land between them,
// as between the pieces of a download larger than the segment.
#ifndef GPUCOMPUTE_CLIENT_CPP_SHARED_MEMORY_H_
#define GPUCOMPUTE_CLIENT_CPP_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"

namespace gpucompute {

// OK when `info` says the server allows system shared memory and runs on this host (the
// same host name and boot id); otherwise FAILED_PRECONDITION saying which is not so.
absl::Status CheckSharedMemoryUsable(const v1::ServerInfo& info);

// Copies `bytes` from `src` to `dst` (not overlapping) with several threads when it is
// large: one core's memcpy moves far less than memory and the PCIe link take, and the
// copy into or out of the segment is the client's part of a transfer. A large copy's
// stores bypass the cache (x86-64): its destination is not read again soon, and such
// stores do not first read each line they write.
void ParallelCopy(void* dst, const void* src, size_t bytes);

// The piece a transfer through the segment is pipelined in. Filling and draining the
// pipeline costs about one piece's copy, small next to a transfer of some hundreds of
// MiB; each piece costs a call (tens of microseconds), small next to its copy; and each
// piece's copy starts its threads, so a piece gives each thread a share worth starting.
inline constexpr uint64_t kPipelinePieceBytes = uint64_t{64} << 20;
// Pieces of a pipelined upload at most; a larger upload takes larger pieces. Every
// piece's call waits for the whole upload, so this many calls are in flight at once: far
// fewer than a tenant may have (the server's --max-calls-per-tenant, 1024 by default) and
// than an upload may have ranges (kMaxUploadRanges).
inline constexpr uint64_t kMaxUploadPieces = 64;

// The segment of a one-shot transfer (the `gpucompute` CLI's put and get): large enough
// that the client's file read, the server's copies and the calls overlap, small enough
// that making, mapping and pinning it costs little next to the transfer, whatever the
// array's size: a segment the size of the array, made, mapped and pinned afresh by every
// put or get, cost more than the array's transfer over gRPC.
inline constexpr uint64_t kOneShotSegmentBytes = uint64_t{16} << 20;
// The pieces such a segment is used in: the client fills one while the server copies
// the others out.
inline constexpr uint64_t kOneShotSegmentPieces = 4;

// The lease of a new buffer uploaded in pieces, renewed by each piece: long enough for
// a slow reader, short enough that a buffer left by a killed client goes soon.
inline constexpr double kUploadLeaseSeconds = 60;

class SharedMemoryTransport {
 public:
  struct Options {
    // The most the segment may grow to; 0 lets it grow to the largest transfer.
    uint64_t max_region_bytes = 0;
    // The pipeline's piece (any size, for tests as small as a few bytes); 0:
    // kPipelinePieceBytes.
    uint64_t piece_bytes = 0;
    // An upload that fits the segment is one copy, not a pipelined multi-range upload.
    bool one_copy_when_it_fits = false;
  };
  // A segment of at most `segment_bytes` (at least a page), used in
  // kOneShotSegmentPieces pieces: for a process that makes one transfer and exits. An
  // upload that fits so small a segment is one copy: the multi-range upload's calls
  // would cost more than the overlap saves.
  static Options Bounded(uint64_t segment_bytes = kOneShotSegmentBytes);

  // `client` must outlive the transport. No segment exists until the first transfer.
  SharedMemoryTransport(Client& client, Options options);
  explicit SharedMemoryTransport(Client& client) : SharedMemoryTransport(client, Options{}) {}
  // Unregisters the region and unmaps the segment.
  ~SharedMemoryTransport();
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  // Makes sure a registered segment of at least `bytes` (capped as above) exists, e.g. to
  // find out up front whether the server can map this process's shared memory.
  absl::Status Reserve(uint64_t bytes);

  // Uploads as Client::Upload does (header.size_bytes 0 or size_bytes). The response has
  // the buffer and, in `transfer`, the bytes and the seconds of the server's copies.
  absl::StatusOr<v1::CopyRegionResponse> Upload(const v1::UploadHeader& header, uint64_t size_bytes,
                                                const UploadReader& reader,
                                                const ProgressFn& progress = {});
  absl::StatusOr<v1::CopyRegionResponse> Upload(const v1::UploadHeader& header,
                                                std::span<const std::byte> data);
  // Downloads as Client::Download does: request.size_bytes 0 reads to the end; the sink
  // gets the bytes in order. request.chunk_bytes is not used.
  absl::StatusOr<v1::CopyRegionResponse> Download(const v1::DownloadRequest& request,
                                                  const DownloadSink& sink,
                                                  const ProgressFn& progress = {});
  absl::StatusOr<v1::CopyRegionResponse> Download(const v1::DownloadRequest& request,
                                                  std::string* data);

  // In place: the caller puts the data in the segment itself, so the client copies
  // nothing and a transfer is the server's one copy (one DMA on a CUDA server).
  //
  // Staging returns the segment's bytes [offset, offset + bytes), growing the segment to
  // hold them (OUT_OF_RANGE past Options::max_region_bytes). A span stays valid until a
  // call that grows the segment: a later Staging, Reserve, Upload or Download that needs
  // more than it has. Growing it loses its contents.
  absl::StatusOr<std::span<std::byte>> Staging(uint64_t offset, uint64_t bytes);
  // Uploads the segment's bytes [offset, offset + size_bytes) as Upload does, all or
  // nothing; they must be within the segment (OUT_OF_RANGE otherwise).
  absl::StatusOr<v1::CopyRegionResponse> UploadStaged(const v1::UploadHeader& header,
                                                      uint64_t size_bytes, uint64_t offset = 0);
  // Downloads as Download does into the segment at `offset`, and returns the bytes
  // there (valid as a Staging span is). The range must fit the segment as it is
  // (Staging grows it): OUT_OF_RANGE otherwise, or, for a range to the end of the
  // buffer (size_bytes 0), the server's INVALID_ARGUMENT.
  absl::StatusOr<std::span<const std::byte>> DownloadStaged(
      const v1::DownloadRequest& request, uint64_t offset = 0,
      v1::CopyRegionResponse* response = nullptr);

  // The registered region, for tests: empty before the first transfer.
  const std::string& region_id() const { return region_id_; }
  uint64_t region_bytes() const { return size_; }

 private:
  absl::Status Release();
  absl::StatusOr<v1::CopyRegionResponse> CopyFromRegion(const v1::CopyFromRegionRequest& request);
  absl::StatusOr<v1::CopyRegionResponse> CopyToRegion(const v1::CopyToRegionRequest& request);
  template <typename Request>
  absl::StatusOr<v1::CopyRegionResponse> Copy(
      grpc::Status (v1::SharedMemoryService::Stub::*method)(grpc::ClientContext*, const Request&,
                                                            v1::CopyRegionResponse*),
      const Request& request);
  // Copies the segment's bytes [offset, offset + size_bytes) into the upload's target.
  absl::StatusOr<v1::CopyRegionResponse> CopyIn(const v1::UploadHeader& header, uint64_t size_bytes,
                                                uint64_t offset);
  // Options::piece_bytes, or its default.
  uint64_t PieceBytes() const;
  // OUT_OF_RANGE unless [offset, offset + bytes) lies within the segment.
  absl::Status CheckWithinSegment(uint64_t offset, uint64_t bytes) const;
  // Fills the segment's bytes [offset, offset + bytes) from `reader`.
  absl::Status Fill(const UploadReader& reader, uint64_t offset, uint64_t bytes);
  // Uploads more than the segment holds: a new buffer is created first.
  absl::StatusOr<v1::CopyRegionResponse> UploadInPieces(const v1::UploadHeader& header,
                                                        uint64_t size_bytes,
                                                        const UploadReader& reader,
                                                        const ProgressFn& progress);
  // Copies `size_bytes` from `reader` into `buffer` at `offset` through the segment's
  // slots, each piece its own copy, the next pieces read in while the server copies the
  // last ones out; returns once no copy is in flight.
  absl::StatusOr<v1::CopyRegionResponse> CopyPiecesIn(const std::string& buffer, uint64_t offset,
                                                      uint64_t size_bytes,
                                                      const UploadReader& reader,
                                                      const ProgressFn& progress);
  // Uploads `size_bytes` (which fit the segment) in pieces of `piece` bytes as the ranges
  // of one multi-range upload.
  absl::StatusOr<v1::CopyRegionResponse> UploadPipelined(const v1::UploadHeader& header,
                                                         uint64_t size_bytes,
                                                         const UploadReader& reader,
                                                         const ProgressFn& progress,
                                                         uint64_t piece);
  // Downloads as Download does, first calling `on_length` (if set) with the bytes that
  // the sink will get.
  absl::StatusOr<v1::CopyRegionResponse> DownloadPieces(
      const v1::DownloadRequest& request, const std::function<void(uint64_t)>& on_length,
      const DownloadSink& sink, const ProgressFn& progress);

  Client& client_;
  const Options options_;
  std::unique_ptr<v1::SharedMemoryService::Stub> stub_;
  std::byte* data_ = nullptr;  // the mapped segment, size_ bytes
  uint64_t size_ = 0;
  std::string region_id_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_SHARED_MEMORY_H_

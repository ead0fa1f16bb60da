// Timing of uploads and downloads, as gpucompute-bench and `gpucompute bench` report them:
// one untimed warm-up call (first-use costs: connections, page faults of the host
// buffers), then `repeat` timed calls; the median wall time of a whole call from the
// client's side (connection reuse, response and the client's own copies included). The
// host buffers exist before the timed calls, so no timed call touches a page first.
#ifndef GPUCOMPUTE_CLIENT_CPP_TRANSFER_TIMING_H_
#define GPUCOMPUTE_CLIENT_CPP_TRANSFER_TIMING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/shared_memory.h"
#include "gpucompute/v1/gpucompute.pb.h"

namespace gpucompute {

// One way of moving a buffer's bytes: a transport and its settings.
class TransferPath {
 public:
  virtual ~TransferPath() = default;
  // Uploads as Client::Upload does; the response has the buffer and the server's stats.
  virtual absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                                    std::span<const std::byte> data) = 0;
  // Downloads all of `buffer` into memory this path keeps and reuses (downloaded()); the
  // result is the server's stats.
  virtual absl::StatusOr<v1::TransferStats> Download(const std::string& buffer) = 0;
  // The bytes of the last Download.
  virtual std::span<const std::byte> downloaded() const = 0;
};

// The client's gRPC transfers, as its options choose (one stream or parallel streams;
// ClientOptions::chunk_bytes is also the downloads' chunk size); `client` must outlive
// the path.
std::unique_ptr<TransferPath> GrpcTransferPath(Client& client);
// Through `shm`'s segment, which must outlive the path; the client copies out of the
// segment with ParallelCopy.
std::unique_ptr<TransferPath> SharedMemoryTransferPath(SharedMemoryTransport& shm);
// Through `shm`'s segment with the data already there (Staging, UploadStaged,
// DownloadStaged): the client copies nothing while timed.
std::unique_ptr<TransferPath> SharedMemoryInPlacePath(SharedMemoryTransport& shm);

struct TransferTiming {
  uint64_t bytes = 0;
  double upload_seconds = 0;    // median wall time of the timed uploads
  double download_seconds = 0;  // median wall time of the timed downloads
  // Medians of the server's own TransferStats.gbps (its first byte to its last).
  double upload_server_gbps = 0;
  double download_server_gbps = 0;

  double upload_gbps() const { return upload_seconds > 0 ? bytes / upload_seconds / 1e9 : 0; }
  double download_gbps() const { return download_seconds > 0 ? bytes / download_seconds / 1e9 : 0; }
};

// Times `repeat` (after one warm-up) uploads of `data` into a new buffer as `header`
// describes it (each deleted before the next, so that the server needs room for one
// array), then as many downloads of the last one, checks that the downloaded bytes are
// `data` (DATA_LOSS otherwise) and deletes the buffer through `client`.
absl::StatusOr<TransferTiming> TimeTransfers(Client& client, TransferPath& path,
                                             const v1::UploadHeader& header,
                                             std::span<const std::byte> data, int repeat);

// `bytes` bytes, every one written (a pattern that is not all one value), so that no page
// is first touched while timed.
std::vector<char> TransferSource(uint64_t bytes);

double Median(std::vector<double> values);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_TRANSFER_TIMING_H_

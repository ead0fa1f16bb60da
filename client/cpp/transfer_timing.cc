#include "client/cpp/transfer_timing.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class GrpcPath final : public TransferPath {
 public:
  explicit GrpcPath(Client& client) : client_(client) {}

  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            std::span<const std::byte> data) override {
    return client_.Upload(header, data);
  }

  absl::StatusOr<v1::TransferStats> Download(const std::string& buffer) override {
    v1::DownloadRequest request;
    request.set_buffer(buffer);
    // The client's chunk size both ways, so that chunk sizes can be compared.
    request.set_chunk_bytes(
        static_cast<uint32_t>(std::min<uint64_t>(client_.options().chunk_bytes, kMaxChunkBytes)));
    // Into the same string each time: its memory, once grown, is reused.
    absl::StatusOr<v1::DownloadResponse> response = client_.Download(request, &data_);
    if (!response.ok()) return response.status();
    return response->transfer();
  }

  std::span<const std::byte> downloaded() const override {
    return std::as_bytes(std::span(data_.data(), data_.size()));
  }

 private:
  Client& client_;
  std::string data_;
};

// A shared-memory upload's answer as an Upload's.
absl::StatusOr<v1::UploadResponse> AsUploadResponse(absl::StatusOr<v1::CopyRegionResponse> copied) {
  if (!copied.ok()) return copied.status();
  v1::UploadResponse response;
  *response.mutable_buffer() = copied->buffer();
  *response.mutable_transfer() = copied->transfer();
  return response;
}

class ShmPath final : public TransferPath {
 public:
  explicit ShmPath(SharedMemoryTransport& shm) : shm_(shm) {}

  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            std::span<const std::byte> data) override {
    return AsUploadResponse(shm_.Upload(header, data));
  }

  absl::StatusOr<v1::TransferStats> Download(const std::string& buffer) override {
    v1::DownloadRequest request;
    request.set_buffer(buffer);
    size_ = 0;
    absl::StatusOr<v1::CopyRegionResponse> copied =
        shm_.Download(request, [this](uint64_t offset, std::string_view chunk) -> absl::Status {
          if (offset > data_.size() || chunk.size() > data_.size() - offset) {
            // Grows only on the first (untimed) call of a size.
            data_.resize(offset + chunk.size());
          }
          ParallelCopy(data_.data() + offset, chunk.data(), chunk.size());
          size_ = std::max<uint64_t>(size_, offset + chunk.size());
          return absl::OkStatus();
        });
    if (!copied.ok()) return copied.status();
    return copied->transfer();
  }

  std::span<const std::byte> downloaded() const override {
    return std::as_bytes(std::span(data_.data(), size_));
  }

 private:
  SharedMemoryTransport& shm_;
  std::vector<char> data_;
  uint64_t size_ = 0;
};

// The data already in the segment: the first upload of an array stages it (untimed, as
// the warm-up), and downloads land in the segment's second half, so the bytes checked
// are the ones the server wrote.
class ShmInPlacePath final : public TransferPath {
 public:
  explicit ShmInPlacePath(SharedMemoryTransport& shm) : shm_(shm) {}

  absl::StatusOr<v1::UploadResponse> Upload(const v1::UploadHeader& header,
                                            std::span<const std::byte> data) override {
    if (data.data() != staged_.data() || data.size() != staged_.size()) {
      // Grown to both halves first: growing loses the contents.
      absl::StatusOr<std::span<std::byte>> both = shm_.Staging(0, 2 * data.size());
      if (!both.ok()) return both.status();
      ParallelCopy(both->data(), data.data(), data.size());
      staged_ = data;
    }
    return AsUploadResponse(shm_.UploadStaged(header, data.size()));
  }

  absl::StatusOr<v1::TransferStats> Download(const std::string& buffer) override {
    v1::DownloadRequest request;
    request.set_buffer(buffer);
    v1::CopyRegionResponse copied;
    absl::StatusOr<std::span<const std::byte>> bytes =
        shm_.DownloadStaged(request, staged_.size(), &copied);
    if (!bytes.ok()) return bytes.status();
    downloaded_ = *bytes;
    return copied.transfer();
  }

  std::span<const std::byte> downloaded() const override { return downloaded_; }

 private:
  SharedMemoryTransport& shm_;
  std::span<const std::byte> staged_;
  std::span<const std::byte> downloaded_;
};

}  // namespace

std::unique_ptr<TransferPath> GrpcTransferPath(Client& client) {
  return std::make_unique<GrpcPath>(client);
}

std::unique_ptr<TransferPath> SharedMemoryTransferPath(SharedMemoryTransport& shm) {
  return std::make_unique<ShmPath>(shm);
}

std::unique_ptr<TransferPath> SharedMemoryInPlacePath(SharedMemoryTransport& shm) {
  return std::make_unique<ShmInPlacePath>(shm);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : (values[m - 1] + values[m]) / 2;
}

std::vector<char> TransferSource(uint64_t bytes) {
  std::vector<char> source(bytes);
  for (uint64_t i = 0; i < bytes; ++i) source[i] = static_cast<char>(i * 131 + 7);
  return source;
}

absl::StatusOr<TransferTiming> TimeTransfers(Client& client, TransferPath& path,
                                             const v1::UploadHeader& header,
                                             std::span<const std::byte> data, int repeat) {
  TransferTiming timing;
  timing.bytes = data.size();
  std::string kept;  // the last upload's buffer, kept for the downloads
  auto delete_kept = [&]() -> absl::Status {
    if (kept.empty()) return absl::OkStatus();
    absl::Status s = client.DeleteBuffer(kept);
    kept.clear();
    return s;
  };
  // `transfer` once untimed, then `repeat` times timed, `after` following each untimed
  // (told whether it was the last).
  auto time_calls = [repeat](const std::function<absl::StatusOr<v1::TransferStats>()>& transfer,
                             const std::function<absl::Status(bool last)>& after,
                             std::vector<double>& wall, std::vector<double>& server_gbps) {
    for (int r = 0; r <= repeat; ++r) {
      const Clock::time_point start = Clock::now();
      absl::StatusOr<v1::TransferStats> stats = transfer();
      const double seconds = SecondsSince(start);
      if (!stats.ok()) return stats.status();
      if (r > 0) {
        wall.push_back(seconds);
        server_gbps.push_back(stats->gbps());
      }
      if (absl::Status s = after(r == repeat); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  std::vector<double> upload_wall, upload_server, download_wall, download_server;
  std::string uploaded;
  absl::Status status = time_calls(
      [&]() -> absl::StatusOr<v1::TransferStats> {
        absl::StatusOr<v1::UploadResponse> up = path.Upload(header, data);
        if (!up.ok()) return up.status();
        uploaded = up->buffer().id();
        return up->transfer();
      },
      // Each upload's buffer goes before the next upload, so that sizes up to the
      // server's memory limit can be measured. The last one stays for the downloads.
      [&](bool last) {
        kept = std::move(uploaded);
        return last ? absl::OkStatus() : delete_kept();
      },
      upload_wall, upload_server);
  if (status.ok()) {
    status = time_calls([&] { return path.Download(kept); },
                        [](bool) { return absl::OkStatus(); }, download_wall, download_server);
  }
  if (status.ok()) {
    const std::span<const std::byte> got = path.downloaded();
    if (got.size() != data.size() || std::memcmp(got.data(), data.data(), data.size()) != 0) {
      status = absl::DataLossError(
          absl::StrCat("the ", data.size(), " downloaded bytes differ from the uploaded ones"));
    }
  }
  absl::Status deleted = delete_kept();
  if (!status.ok()) return status;
  if (!deleted.ok()) return deleted;
  timing.upload_seconds = Median(upload_wall);
  timing.download_seconds = Median(download_wall);
  timing.upload_server_gbps = Median(upload_server);
  timing.download_server_gbps = Median(download_server);
  return timing;
}

}  // namespace gpucompute

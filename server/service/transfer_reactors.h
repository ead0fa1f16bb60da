// The streaming reactors of BufferService: Upload (upload_reactor.cc) and Download
// (download_reactor.cc). buffer_service.cc validates the call and hands it to them.
#ifndef GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_
#define GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/buffer_registry.h"
#include "server/service/service_context.h"
#include "server/service/upload_transfer.h"

namespace gpucompute {

// Both read and write the messages' wire format themselves (common/wire_format.h)
// so that chunk bytes go between gRPC's slices and host staging memory without a protobuf
// copy.

// Receives an upload stream's header and chunks (a whole upload, or one range of a
// multi-range upload in `table`); answers with the upload's outcome (an UploadResponse).
grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadReactor(
    ServiceContext& ctx, std::shared_ptr<UploadTransferTable> table,
    grpc::CallbackServerContext* context, Caller caller, grpc::ByteBuffer* response);

// What a download streams: bytes [offset, offset + size) of `buffer`, checked against
// its size. For a view of a buffer, `buffer` holds the view's elements in C order from
// byte `origin` (the buffer itself, when they lie so there, or a temporary copy), the
// messages count their offsets from `origin`, and the first reports `named`, the buffer
// the client named, as the view: its shape, C layout and size.
struct DownloadSource {
  BufferHandle buffer;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t origin = 0;
  BufferHandle named;  // null: `buffer`
  std::optional<std::vector<uint64_t>> view_shape;
  // The copy that fills `buffer` (a view's temporary), if any: should it fail, so does
  // the download.
  std::shared_ptr<Operation> producer;
};

// Streams `source` in DownloadResponse messages of `chunk` bytes, with a CRC32C of each
// when `checksums`.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDownloadReactor(
    ServiceContext& ctx, DownloadSource source, uint64_t chunk, bool checksums,
    std::shared_ptr<const void> admission);

// Fills a transfer's statistics: `bytes` moved since `start`.
void SetTransferStats(uint64_t bytes, std::chrono::steady_clock::time_point start,
                      v1::TransferStats* stats);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_

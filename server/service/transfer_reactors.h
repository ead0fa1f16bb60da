// The streaming reactors of BufferService: Upload (upload_reactor.cc) and Download
// (download_reactor.cc). buffer_service.cc validates the call and hands it to them.
#ifndef GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_
#define GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include <grpcpp/grpcpp.h>

#include "gpucompute/v1/gpucompute.pb.h"
#include "server/buffer_registry.h"
#include "server/service/service_context.h"

namespace gpucompute {

// Receives an upload's header and chunks; answers once the data is in device memory.
grpc::ServerReadReactor<v1::UploadRequest>* NewUploadReactor(ServiceContext& ctx, std::string client,
                                                             v1::UploadResponse* response);

// Streams bytes [offset, offset + size) of `buffer` in chunks of `chunk` bytes. The
// range must already be checked against the buffer's size.
grpc::ServerWriteReactor<v1::DownloadResponse>* NewDownloadReactor(ServiceContext& ctx, BufferHandle buffer,
                                                                   uint64_t offset, uint64_t size,
                                                                   uint64_t chunk);

// Fills a transfer's statistics: `bytes` moved since `start`.
void SetTransferStats(uint64_t bytes, std::chrono::steady_clock::time_point start, v1::TransferStats* stats);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_TRANSFER_REACTORS_H_

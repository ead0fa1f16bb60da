// Downloads of a view (DownloadRequest.view): what the download reactor streams.
#ifndef GPUCOMPUTE_SERVER_SERVICE_DOWNLOAD_VIEW_H_
#define GPUCOMPUTE_SERVER_SERVICE_DOWNLOAD_VIEW_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/service/service_context.h"
#include "server/service/transfer_reactors.h"

namespace gpucompute {

// Resolves the request's view of its buffer for `client` and checks offset_bytes and
// size_bytes against the view's bytes in C order. A view whose elements lie in C order
// one after another is streamed from the buffer itself; any other is first copied, in
// C order, into a temporary on the device: a strided elementwise copy queued on the
// client's default stream, ordered like any read of the buffer. The temporary is
// charged to the client's tenant (RESOURCE_EXHAUSTED if it does not fit) and freed once
// streamed.
absl::StatusOr<DownloadSource> DownloadView(ServiceContext& ctx, absl::string_view client,
                                            const v1::DownloadRequest& request);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_DOWNLOAD_VIEW_H_

// The one conversion from a gRPC status to an absl::Status, for the client library, the
// server's transfer reactors and the tests. (The server's answer, absl::Status to
// grpc::Status, is ToGrpcStatus in server/service/proto_conversions.h.)
#ifndef GPUCOMPUTE_COMMON_GRPC_STATUS_H_
#define GPUCOMPUTE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace gpucompute {

// The absl::Status with the same code and message. Details (the binary
// grpc-status-details-bin trailer) are not carried over.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_GRPC_STATUS_H_

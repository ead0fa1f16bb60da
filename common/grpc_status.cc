#include "common/grpc_status.h"

namespace gpucompute {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their values (google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace gpucompute

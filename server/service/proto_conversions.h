// Conversions between the API's messages and the server's own types, and the one place
// an absl::Status becomes a grpc::Status.
#ifndef GPUCOMPUTE_SERVER_SERVICE_PROTO_CONVERSIONS_H_
#define GPUCOMPUTE_SERVER_SERVICE_PROTO_CONVERSIONS_H_

#include <cstdint>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "kernels/dtype.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"

namespace gpucompute {

// The one conversion from absl::Status to grpc::Status: same code, same message. Every
// status a handler returns goes through it.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Error messages echo what a caller sent (names, ids, expressions), which may be of any
// length; a message over kMaxErrorMessageBytes keeps its start and its end (where the
// reason usually is) and says how much of the middle it left out. Every message that
// leaves the server goes through this: a gRPC status must fit in trailing metadata (8 KiB
// by default), or the caller sees RESOURCE_EXHAUSTED about metadata instead of its error.
inline constexpr size_t kMaxErrorMessageBytes = 1024;
std::string BoundedErrorMessage(absl::string_view message);

// Conversions between the API's enums and the internal ones.
absl::StatusOr<DType> FromProto(v1::DType dtype);
v1::DType ToProto(DType dtype);
absl::StatusOr<Layout> FromProto(v1::Layout layout);
v1::OperationKind ToProto(OperationKind kind);

void ToProto(const BufferMeta& meta, v1::BufferInfo* info);
// As above, with the buffer's lease.
void ToProto(const BufferEntry& entry, v1::BufferInfo* info);
// A buffer's lease as the API reports it (BufferInfo.ttl_seconds and
// lease_expire_time_unix_nanos; both 0 without a lease), as GetBuffer reports it.
struct LeaseReport {
  double ttl_seconds = 0;
  int64_t expire_time_unix_nanos = 0;
};
// The clocks a report reads: the steady clock of the deadlines and the API's wall clock.
// Read once for the leases of one answer.
struct LeaseClocks {
  int64_t steady_nanos = 0;
  int64_t unix_nanos = 0;
  static LeaseClocks Now();
};
LeaseReport ReportLease(const Lease& lease, const LeaseClocks& now);
// Sets info's lease from the lease of `meta`'s buffer as it is now; none once the
// buffer is gone.
void LiveLeaseToProto(const BufferMeta& meta, v1::BufferInfo* info);
// With each output's lease as it is now, as GetBuffer reports it.
void ToProto(const OperationStatus& status, v1::Operation* op);
v1::Operation::State ToProto(OperationStatus::State state);
// What ToProto sets but the id, kind, stream and outputs, which are known once the
// operation is queued: its state and error, and once done its timing and inline values.
void ToProtoOutcome(const OperationStatus& status, v1::Operation* op);
// Sets op's error code and message (bounded) from `error`.
void SetError(const absl::Status& error, v1::Operation* op);
// Sets the device time and, from the traffic and flops already set, the rates.
void SetDeviceSeconds(double seconds, v1::Timing* t);
// Appends the inline values of `result` (OpResult::values) to op->values.
void AppendValues(const OpResult& result, v1::Operation* op);

// A scalar converted to `dtype`, in its native representation (as Backend::Fill wants).
// INVALID_ARGUMENT if the value does not fit (an int beyond int32, a fraction into an
// int, a non-finite float into an int).
absl::StatusOr<uint64_t> ScalarBits(const v1::Scalar& scalar, DType dtype);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_PROTO_CONVERSIONS_H_

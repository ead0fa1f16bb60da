// The status macros of everything below the service: absl::Status and
// absl::StatusOr<T> travel up with these, and become grpc::Status only in
// service/proto_conversions.h's ToGrpcStatus.
#ifndef GPUCOMPUTE_SERVER_UTIL_STATUS_MACROS_H_
#define GPUCOMPUTE_SERVER_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpucompute::status_internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace gpucompute::status_internal

#define GPUCOMPUTE_STATUS_CONCAT_INNER_(a, b) a##b
#define GPUCOMPUTE_STATUS_CONCAT_(a, b) GPUCOMPUTE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>) and returns its status from the
// enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                                                \
  do {                                                                       \
    if (const auto& gpucompute_status_ = (expr); !gpucompute_status_.ok()) { \
      return ::gpucompute::status_internal::GetStatus(gpucompute_status_);   \
    }                                                                        \
  } while (false)

// `lhs = *expr` when `expr` (an absl::StatusOr<T>) holds a value; else returns its
// status. `lhs` may declare a variable: ASSIGN_OR_RETURN(BufferHandle b, Lookup(...)).
#define ASSIGN_OR_RETURN(lhs, expr) \
  GPUCOMPUTE_ASSIGN_OR_RETURN_IMPL_(GPUCOMPUTE_STATUS_CONCAT_(gpucompute_or_, __LINE__), lhs, expr)
#define GPUCOMPUTE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return std::move(tmp).status();          \
  lhs = *std::move(tmp)

#endif  // GPUCOMPUTE_SERVER_UTIL_STATUS_MACROS_H_

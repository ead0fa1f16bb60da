// What sessions and chains share: operations named by the client's tags, whose buffer
// references may name an earlier tag's output as "tag:<t>", and the failures that pass
// from an operation to those that depend on it.
#ifndef GPUCOMPUTE_SERVER_SERVICE_TAGGED_OPS_H_
#define GPUCOMPUTE_SERVER_SERVICE_TAGGED_OPS_H_

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/service/operation_planner.h"

namespace gpucompute {

inline constexpr size_t kMaxTagBytes = 256;

// INVALID_ARGUMENT unless `tag` is a usable tag: 1 to kMaxTagBytes bytes.
absl::Status CheckTag(absl::string_view tag);

// Returns the buffer that the earlier operation tagged `tag` writes, or why it cannot
// be used (UnknownTagError, FailedDependencyError).
using TagFinder = absl::FunctionRef<absl::StatusOr<BufferHandle>(absl::string_view tag)>;

// A buffer reference that is not a tag, as the request wrote it, and what it resolved to.
struct ResolvedRef {
  std::string ref;
  BufferHandle buffer;
};

// Plans `request` with its references "tag:<t>" resolved by `find_tag` and the others
// as the client's buffers. The tags it refers to are added to `deps`, once each, and
// the other references, if `refs` is set, to `refs`.
absl::StatusOr<Plan> PlanTagged(ServiceContext& ctx, absl::string_view client,
                                const v1::SubmitRequest& request, TagFinder find_tag,
                                std::vector<std::string>* deps,
                                std::vector<ResolvedRef>* refs = nullptr);

// INVALID_ARGUMENT: `tag` names no earlier operation.
absl::Status UnknownTagError(absl::string_view tag);
// FAILED_PRECONDITION: an operation depends on `tag`, which failed with `cause`.
absl::Status FailedDependencyError(absl::string_view tag, const absl::Status& cause);

// The error of a finished operation (OK if it succeeded).
absl::Status OperationError(const v1::Operation& op);
// The kind of operation `request` asks for (UNSPECIFIED if none).
v1::OperationKind RequestKind(const v1::SubmitRequest& request);
// Marks `op` done and FAILED with `status`; its timing, id and outputs stay.
void MarkFailed(const absl::Status& status, v1::Operation* op);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_TAGGED_OPS_H_

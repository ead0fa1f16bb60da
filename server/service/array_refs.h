// A request's reference to an array: a buffer (id or name) and the view of it that the
// request's ViewSteps make (server/arrays/view_steps.h).
#ifndef GPUCOMPUTE_SERVER_SERVICE_ARRAY_REFS_H_
#define GPUCOMPUTE_SERVER_SERVICE_ARRAY_REFS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/arrays/strided_layout.h"
#include "server/service/operation_planner.h"

namespace gpucompute {

// A buffer and where the referenced elements lie in its memory. An access through it is
// an access to `buffer`, for ordering, leases and lifetime alike.
struct ArrayRef {
  BufferHandle buffer;
  StridedLayout layout;

  DType dtype() const { return buffer->dtype; }
  // Whether it is the whole buffer as the buffer itself lays it out.
  bool IsWholeBuffer() const;
};

// The layout of a whole buffer.
StridedLayout BufferLayout(const BufferMeta& buffer);

// Resolves `ref` with `resolve` and applies `view` to it. `what` names the reference in
// errors ("input 'x'", "matmul operand 'a'"): an empty ref is INVALID_ARGUMENT "<what>
// is required", a failed lookup keeps its code with `what` in front, and a bad view is
// INVALID_ARGUMENT naming `what`, the buffer and the step.
absl::StatusOr<ArrayRef> ResolveArray(BufferResolver resolve, absl::string_view what,
                                      const std::string& ref,
                                      const google::protobuf::RepeatedPtrField<v1::ViewStep>& view);

// "'name' (float32(3, 4))" or "<id> (float32(3, 4))", with " viewed as (4, 3)" when the
// view's shape differs from the buffer's.
std::string DescribeArray(const ArrayRef& array);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_ARRAY_REFS_H_

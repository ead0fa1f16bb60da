// The API's views (gpucompute.v1.ViewStep) applied to a buffer's layout.
#ifndef GPUCOMPUTE_SERVER_ARRAYS_VIEW_STEPS_H_
#define GPUCOMPUTE_SERVER_ARRAYS_VIEW_STEPS_H_

#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"
#include "server/arrays/strided_layout.h"

namespace gpucompute {

// Steps one view may have: enough for any expression of NumPy's basic indexing and shape
// functions, and a bound on the work a request can ask of the server's checks.
inline constexpr int kMaxViewSteps = 64;

// Applies `steps` in order to `base`. INVALID_ARGUMENT names the failing step by its
// position and kind, and the shape it met: "view step 2 (transpose) of shape (3,4): ...".
// No layout it returns has more than `max_dims` dimensions, reaches outside `base`'s
// elements, or overflows 64-bit offsets.
absl::StatusOr<StridedLayout> ApplyViewSteps(
    StridedLayout base, const google::protobuf::RepeatedPtrField<v1::ViewStep>& steps,
    int max_dims);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ARRAYS_VIEW_STEPS_H_

#include "server/tenancy/request_limits.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpucompute {
namespace {

absl::Status CheckRange(absl::string_view flag, uint64_t value, uint64_t low, uint64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": must be from ", low, " to ", high, ", not ", value));
}

}  // namespace

absl::Status ValidateRequestLimits(const RequestLimits& limits) {
  absl::Status status =
      CheckRange("max-message-bytes", limits.max_message_bytes, kMinMessageBytes, kMaxMessageBytes);
  status.Update(CheckRange("max-dimensions", limits.max_dimensions, 1, kMaxDimensions));
  status.Update(CheckRange("max-elements", limits.max_elements, 1, kMaxElements));
  status.Update(
      CheckRange("max-expression-bytes", limits.max_expression_bytes, 1, kMaxExpressionBytes));
  status.Update(
      CheckRange("max-expression-depth", limits.max_expression_depth, 1, expr::kMaxNestingDepth));
  return status;
}

namespace {

// "[a, b, ...]", its first kMaxDimensions extents at most: a refused shape may have any
// number of them, and the message echoes only enough to recognise it.
std::string ShapeForMessage(const std::vector<uint64_t>& shape) {
  if (shape.size() <= kMaxDimensions) return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.begin() + kMaxDimensions, ", "),
                      ", ...]");
}

}  // namespace

absl::Status CheckShape(const RequestLimits& limits, const std::vector<uint64_t>& shape) {
  if (shape.size() > limits.max_dimensions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeForMessage(shape), " has ", shape.size(),
        " dimensions; the server allows at most ", limits.max_dimensions, " (--max-dimensions)"));
  }
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  uint64_t elements = 1;
  for (uint64_t d : shape) {
    if (d == 0) continue;
    if (d > limits.max_elements / elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeForMessage(shape), " has more than ", limits.max_elements,
                       " elements", empty ? ", not counting its empty dimensions" : "",
                       "; the server allows at most ", limits.max_elements, " (--max-elements)"));
    }
    elements *= d;
  }
  return absl::OkStatus();
}

}  // namespace gpucompute

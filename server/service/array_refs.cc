#include "server/service/array_refs.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/arrays/view_steps.h"
#include "server/tenancy/request_limits.h"

namespace gpucompute {

StridedLayout BufferLayout(const BufferMeta& buffer) {
  return DenseLayout(buffer.shape, buffer.layout == Layout::kF && buffer.shape.size() >= 2);
}

bool ArrayRef::IsWholeBuffer() const { return layout == BufferLayout(*buffer); }

absl::StatusOr<ArrayRef> ResolveArray(BufferResolver resolve, absl::string_view what,
                                      const std::string& ref,
                                      const google::protobuf::RepeatedPtrField<v1::ViewStep>& view) {
  if (ref.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is required"));
  absl::StatusOr<BufferHandle> buffer = resolve(ref);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(),
                        absl::StrCat(what, ": ", buffer.status().message()));
  }
  ArrayRef array{*buffer, BufferLayout(**buffer)};
  if (view.empty()) return array;
  absl::StatusOr<StridedLayout> layout =
      ApplyViewSteps(std::move(array.layout), view, static_cast<int>(kMaxDimensions));
  if (!layout.ok()) {
    array.layout = BufferLayout(**buffer);
    return absl::Status(layout.status().code(),
                        absl::StrCat(what, " ", DescribeArray(array), ": ",
                                     layout.status().message()));
  }
  array.layout = *std::move(layout);
  return array;
}

std::string DescribeArray(const ArrayRef& array) {
  const BufferEntry& b = *array.buffer;
  std::vector<int64_t> shape(b.shape.begin(), b.shape.end());
  std::string text = absl::StrCat(b.name.empty() ? b.id : absl::StrCat("'", b.name, "'"), " (",
                                  DTypeName(b.dtype), NumpyShape(shape), ")");
  if (array.layout.shape != shape) {
    absl::StrAppend(&text, " viewed as ", NumpyShape(array.layout.shape));
  }
  return text;
}

}  // namespace gpucompute

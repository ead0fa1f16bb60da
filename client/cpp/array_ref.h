// ArrayRef: a buffer (id or name) seen through a view (ViewStep), as requests carry it
// wherever they read or write a buffer.
//
// An ArrayRef is made from a plain buffer reference (a string, taken as it is: the calls
// that took a buffer id or name still do), from the view syntax of view_syntax.h
// (ArrayRef::Parse("x[0:10, ::2].T")), or by the builder methods, each of which returns a
// new ArrayRef with one more step:
//
//   ArrayRef x("x");
//   ArrayRef v = x.Index({view::Slice(0, 10), view::Slice({}, {}, 2)}).T();
//
// Nothing is checked or sent when a view is built: the server resolves the steps against
// the buffer's shape when it checks the request, and refuses one that does not apply
// (INVALID_ARGUMENT naming the step). ViewShape computes a view's shape on this side, for
// what needs it before the data arrives (the header of a downloaded file).
#ifndef GPUCOMPUTE_CLIENT_CPP_ARRAY_REF_H_
#define GPUCOMPUTE_CLIENT_CPP_ARRAY_REF_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpucompute/v1/gpucompute.pb.h"

namespace gpucompute {

using ViewSteps = google::protobuf::RepeatedPtrField<v1::ViewStep>;

// The items of basic indexing, for ArrayRef::Index.
namespace view {
// x[i]: one position (negative counts from the end); drops the axis.
v1::IndexItem At(int64_t index);
// x[start:stop:step], with Python's defaults for the parts left out.
v1::IndexItem Slice(std::optional<int64_t> start = {}, std::optional<int64_t> stop = {},
                    std::optional<int64_t> step = {});
// x[None]: a new axis of length 1.
v1::IndexItem NewAxis();
// x[...]: as many whole axes as the other items leave.
v1::IndexItem Ellipsis();
}  // namespace view

class ArrayRef {
 public:
  ArrayRef() = default;
  // A whole buffer by id or name, taken as it is (not parsed: a name may hold any
  // character).
  ArrayRef(std::string buffer) : buffer_(std::move(buffer)) {}  // NOLINT(runtime/explicit)
  ArrayRef(std::string_view buffer) : buffer_(buffer) {}        // NOLINT(runtime/explicit)
  ArrayRef(const char* buffer) : buffer_(buffer) {}             // NOLINT(runtime/explicit)
  ArrayRef(std::string buffer, ViewSteps steps)
      : buffer_(std::move(buffer)), steps_(std::move(steps)) {}

  // A reference in the view syntax (view_syntax.h): "x", "x[0:10, ::2].T", ...
  static absl::StatusOr<ArrayRef> Parse(std::string_view text);

  const std::string& buffer() const { return buffer_; }
  const ViewSteps& steps() const { return steps_; }
  bool is_view() const { return !steps_.empty(); }

  // The view syntax of this reference; Parse reads it back as the same steps.
  std::string ToString() const;

  // Builders, as NumPy's: basic indexing x[items]; x.T (or a permutation of the axes,
  // negative counting from the end); x.reshape (one extent may be -1);
  // x.squeeze (no axes: every axis of length 1); numpy.expand_dims; numpy.broadcast_to.
  ArrayRef Index(std::vector<v1::IndexItem> items) const;
  ArrayRef T() const { return Transpose(); }
  ArrayRef Transpose(std::vector<int32_t> axes = {}) const;
  ArrayRef Reshape(std::vector<int64_t> extents) const;
  ArrayRef Squeeze(std::vector<int32_t> axes = {}) const;
  ArrayRef ExpandDims(std::vector<int32_t> axes) const;
  ArrayRef BroadcastTo(std::vector<uint64_t> extents) const;
  // This reference with `step` appended.
  ArrayRef With(v1::ViewStep step) const;

  friend bool operator==(const ArrayRef& a, const ArrayRef& b);

 private:
  std::string buffer_;
  ViewSteps steps_;
};

// The shape of `steps` applied in order to an array of `shape`, as NumPy gives it; an
// InvalidArgument status names the step that does not apply and the shape it met.
// Reshape is checked for its element count only (whether the strides allow it is the
// server's to say).
absl::StatusOr<std::vector<uint64_t>> ViewShape(std::span<const uint64_t> shape,
                                                const ViewSteps& steps);

// The bytes of the view `steps` makes of `buffer`, its elements in C order (what a
// download of the view reads); OUT_OF_RANGE when the count overflows.
absl::StatusOr<uint64_t> ViewBytes(const v1::BufferInfo& buffer, const ViewSteps& steps);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_CLIENT_CPP_ARRAY_REF_H_

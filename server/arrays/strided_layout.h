// Strided layouts: where an N-d array's elements lie in a buffer's memory, and the NumPy
// shape arithmetic over them (basic indexing, transpose, expand_dims, squeeze,
// broadcast_to, reshape, broadcasting of several shapes). Plain C++ and proto-free: the
// service turns the API's ViewSteps into calls of these (server/arrays/view_steps.h), and
// the backends index memory through the layouts they are handed.
//
// Every count and offset here may come from the network, so every product and sum is
// checked: a view whose arithmetic would overflow 64 bits is INVALID_ARGUMENT, never a
// wild read. A view never reaches outside its base, because every step maps the
// positions it keeps to positions the layout before it already had.
#ifndef GPUCOMPUTE_SERVER_ARRAYS_STRIDED_LAYOUT_H_
#define GPUCOMPUTE_SERVER_ARRAYS_STRIDED_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpucompute {

// Element (i_0, ..., i_{k-1}) lies at element offset `offset + sum_d i_d * strides[d]` from
// the start of the memory. Strides count elements and may be 0 (a broadcast axis) or
// negative (a reversed slice). The layouts made here keep the stride of an axis of extent
// 1 at 0: it is never multiplied by anything but 0, and a 0 there lets no step overflow
// on it.
struct StridedLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;

  int ndim() const { return static_cast<int>(shape.size()); }
  // The product of the extents (1 for a 0-d layout); the layouts made here never
  // overflow it.
  int64_t num_elements() const;
  // Whether the elements lie one after another from `offset` in C order (or F order):
  // each axis of extent above 1 has the stride of the product of the later (earlier)
  // extents.
  bool IsCContiguous() const;
  bool IsFContiguous() const;
  // Whether an axis of extent above 1 has stride 0 in a layout with elements: they
  // repeat, so the layout may be read but not written. Never for an empty layout.
  bool HasBroadcast() const;

  bool operator==(const StridedLayout& other) const = default;
};

// The layout of a whole buffer of `shape`, in C order or else in F order.
StridedLayout DenseLayout(const std::vector<uint64_t>& shape, bool fortran_order);

// numpy.indices(shape)[axis] read from the coordinates 0, 1, ..., shape[axis] - 1 stored
// one after another: stride 1 along `axis` (0 where its extent is 1), 0 on the others.
// What a backend reads for index(axis) of an expression (expr::IndexAsInputs). Inline:
// the CUDA backend's module does not link this library.
inline StridedLayout CoordinatesLayout(std::span<const int64_t> shape, int axis) {
  StridedLayout l;
  l.shape.assign(shape.begin(), shape.end());
  l.strides.assign(shape.size(), 0);
  if (shape[axis] > 1) l.strides[axis] = 1;
  return l;
}

// The lowest and highest element offsets a layout with elements touches, inclusive.
struct ElementSpan {
  int64_t first = 0;
  int64_t last = -1;
};
// INVALID_ARGUMENT if the arithmetic overflows; an empty span (last < first) for a layout
// with no elements.
absl::StatusOr<ElementSpan> TouchedSpan(const StridedLayout& layout);

// "(2, 3)", "(4,)" or "()": a shape as NumPy prints it.
std::string NumpyShape(std::span<const int64_t> shape);

// --- Views. Each step gives the layout of a view of `in`, or INVALID_ARGUMENT naming the
// step and `in`'s shape. None allows more than `max_dims` dimensions in its result.

// One item of basic indexing, x[items]: an integer (drops its axis), a slice
// start:stop:step (Python's defaults and clamping), numpy.newaxis or `...`.
struct IndexItem {
  enum class Kind { kIndex, kSlice, kNewAxis, kEllipsis };
  Kind kind = Kind::kSlice;
  int64_t index = 0;  // kIndex; negative counts from the end
  std::optional<int64_t> start, stop, step;  // kSlice; step defaults to 1, never 0
};
absl::StatusOr<StridedLayout> IndexView(const StridedLayout& in, std::span<const IndexItem> items,
                                        int max_dims);
// Axis i of the result is axis axes[i] of `in` (negative counts from the end); no axes
// reverses them.
absl::StatusOr<StridedLayout> TransposeView(const StridedLayout& in, std::span<const int32_t> axes);
// New axes of extent 1 at these positions of the result (numpy.expand_dims).
absl::StatusOr<StridedLayout> ExpandDimsView(const StridedLayout& in,
                                             std::span<const int32_t> axes, int max_dims);
// Drops these axes, which must have extent 1; no axes drops every axis of extent 1.
absl::StatusOr<StridedLayout> SqueezeView(const StridedLayout& in, std::span<const int32_t> axes);
// numpy.broadcast_to: `in` aligned at the right of `shape`, each extent equal or 1.
absl::StatusOr<StridedLayout> BroadcastToView(const StridedLayout& in,
                                              std::span<const int64_t> shape, int max_dims);
// numpy.reshape without a copy: the elements in C order, in `shape` (one extent may be
// -1). INVALID_ARGUMENT when the element counts differ or the strides do not allow it.
absl::StatusOr<StridedLayout> ReshapeView(const StridedLayout& in, std::span<const int64_t> shape,
                                          int max_dims);

// --- Broadcasting of several operands.

// NumPy's broadcast shape of `shapes`; INVALID_ARGUMENT "operands could not be broadcast
// together with shapes (2, 3) (4,)" when they do not broadcast.
absl::StatusOr<std::vector<int64_t>> BroadcastShapes(std::span<const std::vector<int64_t>> shapes);

// --- Aliasing of two layouts of one memory.
enum class Overlap {
  kDisjoint,  // no element in common
  kSame,      // the same elements in the same order (as `x += 1`)
  kPartial,   // anything else, or not provably one of the above
};
// `a` and `b` have the same shape (the operation's).
Overlap CompareOverlap(const StridedLayout& a, const StridedLayout& b);

// --- For kernels. Layouts of one iteration space (all of one shape) made as simple as
// the same iteration allows: axes of extent 1 dropped, and adjacent axes merged where
// every layout steps over both as over one, so that a contiguous operand becomes 1-D and
// a row broadcast 2-D. The C order of the iteration is kept; an empty iteration space
// becomes the single axis (0).
void CoalesceAxes(std::span<StridedLayout*> layouts);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ARRAYS_STRIDED_LAYOUT_H_

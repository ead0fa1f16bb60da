// ArrayRef's builders and the shape arithmetic of views on this side of the wire.
#include "client/cpp/array_ref.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/npy.h"
#include "client/cpp/view_syntax.h"
#include "common/string_view.h"
#include "google/protobuf/util/message_differencer.h"

namespace gpucompute {

namespace view {

v1::IndexItem At(int64_t index) {
  v1::IndexItem item;
  item.set_index(index);
  return item;
}

v1::IndexItem Slice(std::optional<int64_t> start, std::optional<int64_t> stop,
                    std::optional<int64_t> step) {
  v1::IndexItem item;
  v1::Slice* slice = item.mutable_slice();
  if (start.has_value()) slice->set_start(*start);
  if (stop.has_value()) slice->set_stop(*stop);
  if (step.has_value()) slice->set_step(*step);
  return item;
}

v1::IndexItem NewAxis() {
  v1::IndexItem item;
  item.set_new_axis(true);
  return item;
}

v1::IndexItem Ellipsis() {
  v1::IndexItem item;
  item.set_ellipsis(true);
  return item;
}

}  // namespace view

absl::StatusOr<ArrayRef> ArrayRef::Parse(std::string_view text) { return ParseArrayRef(text); }

std::string ArrayRef::ToString() const { return FormatArrayRef(*this); }

ArrayRef ArrayRef::With(v1::ViewStep step) const {
  ArrayRef result = *this;
  *result.steps_.Add() = std::move(step);
  return result;
}

ArrayRef ArrayRef::Index(std::vector<v1::IndexItem> items) const {
  v1::ViewStep step;
  for (v1::IndexItem& item : items) *step.mutable_index()->add_items() = std::move(item);
  // Set even without items: x[] is an indexing step, every axis whole, as NumPy's x[()].
  step.mutable_index();
  return With(std::move(step));
}

namespace {

// A step of the kind `list` makes, with these axes.
v1::ViewStep AxesStep(v1::AxisList* (v1::ViewStep::*list)(), const std::vector<int32_t>& axes) {
  v1::ViewStep step;
  (step.*list)()->mutable_axes()->Add(axes.begin(), axes.end());
  return step;
}

}  // namespace

ArrayRef ArrayRef::Transpose(std::vector<int32_t> axes) const {
  return With(AxesStep(&v1::ViewStep::mutable_transpose, axes));
}

ArrayRef ArrayRef::Squeeze(std::vector<int32_t> axes) const {
  return With(AxesStep(&v1::ViewStep::mutable_squeeze, axes));
}

ArrayRef ArrayRef::ExpandDims(std::vector<int32_t> axes) const {
  return With(AxesStep(&v1::ViewStep::mutable_expand_dims, axes));
}

ArrayRef ArrayRef::Reshape(std::vector<int64_t> extents) const {
  v1::ViewStep step;
  step.mutable_reshape()->mutable_extents()->Add(extents.begin(), extents.end());
  return With(std::move(step));
}

ArrayRef ArrayRef::BroadcastTo(std::vector<uint64_t> extents) const {
  v1::ViewStep step;
  step.mutable_broadcast_to()->mutable_extents()->Add(extents.begin(), extents.end());
  return With(std::move(step));
}

bool operator==(const ArrayRef& a, const ArrayRef& b) {
  if (a.buffer_ != b.buffer_ || a.steps_.size() != b.steps_.size()) return false;
  for (int i = 0; i < a.steps_.size(); ++i) {
    if (!google::protobuf::util::MessageDifferencer::Equals(a.steps_[i], b.steps_[i])) {
      return false;
    }
  }
  return true;
}

namespace {

std::string ShapeText(std::span<const uint64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

absl::Status StepError(int step, std::string_view what, std::span<const uint64_t> shape,
                       std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("view step ", step, " (", ToAbsl(what),
                                                 ") does not apply to shape ", ShapeText(shape),
                                                 ": ", ToAbsl(why)));
}

// `axis` of an array of `ndim` axes, negative counting from the end; nullopt when out
// of range.
std::optional<size_t> NormalizeAxis(int64_t axis, size_t ndim) {
  const int64_t n = static_cast<int64_t>(ndim);
  if (axis < -n || axis >= n) return std::nullopt;
  return static_cast<size_t>(axis < 0 ? axis + n : axis);
}

// The length of start:stop:step over `extent` elements, with Python's clamping.
uint64_t SliceLength(const v1::Slice& slice, uint64_t extent) {
  const int64_t n = static_cast<int64_t>(extent);
  const int64_t step = slice.has_step() ? slice.step() : 1;
  auto clamp = [&](int64_t value, int64_t low, int64_t high) {
    if (value < 0) value = value < -n ? low : value + n;
    return std::clamp(value, low, high);
  };
  int64_t start, stop;
  if (step > 0) {
    start = slice.has_start() ? clamp(slice.start(), 0, n) : 0;
    stop = slice.has_stop() ? clamp(slice.stop(), 0, n) : n;
    return stop > start ? static_cast<uint64_t>((stop - start - 1) / step + 1) : 0;
  }
  start = slice.has_start() ? clamp(slice.start(), -1, n - 1) : n - 1;
  stop = slice.has_stop() ? clamp(slice.stop(), -1, n - 1) : -1;
  // -(step + 1) / -step without overflow at step = INT64_MIN.
  const uint64_t distance = static_cast<uint64_t>(start - stop);
  const uint64_t stride = static_cast<uint64_t>(-(step + 1)) + 1;
  return start > stop ? (distance - 1) / stride + 1 : 0;
}

absl::StatusOr<std::vector<uint64_t>> IndexShape(int number, const v1::Indexing& indexing,
                                                 std::vector<uint64_t> shape) {
  size_t consumed = 0;
  int ellipses = 0;
  for (const v1::IndexItem& item : indexing.items()) {
    if (item.has_index() || item.has_slice()) ++consumed;
    if (item.has_ellipsis()) ++ellipses;
  }
  if (ellipses > 1) return StepError(number, "index", shape, "more than one '...'");
  if (consumed > shape.size()) {
    return StepError(number, "index", shape,
                     absl::StrCat(consumed, " indices for ", shape.size(), " axes"));
  }
  std::vector<uint64_t> result;
  size_t axis = 0;
  for (const v1::IndexItem& item : indexing.items()) {
    switch (item.item_case()) {
      case v1::IndexItem::kIndex: {
        const int64_t n = static_cast<int64_t>(shape[axis]);
        if (item.index() < -n || item.index() >= n) {
          return StepError(number, "index", shape,
                           absl::StrCat("index ", item.index(), " is out of range for axis ",
                                        axis, " of length ", n));
        }
        ++axis;
        break;
      }
      case v1::IndexItem::kSlice:
        if (item.slice().has_step() && item.slice().step() == 0) {
          return StepError(number, "index", shape, "slice step cannot be zero");
        }
        result.push_back(SliceLength(item.slice(), shape[axis++]));
        break;
      case v1::IndexItem::kNewAxis:
        result.push_back(1);
        break;
      case v1::IndexItem::kEllipsis:
        for (size_t whole = shape.size() - consumed; whole > 0; --whole) {
          result.push_back(shape[axis++]);
        }
        break;
      case v1::IndexItem::ITEM_NOT_SET:
        return StepError(number, "index", shape, "an index item is empty");
    }
  }
  while (axis < shape.size()) result.push_back(shape[axis++]);
  return result;
}

// Normalized axes, each once, of an array of `ndim` axes.
absl::StatusOr<std::vector<size_t>> Axes(int number, std::string_view what,
                                         std::span<const uint64_t> shape,
                                         const v1::AxisList& list, size_t ndim) {
  std::vector<size_t> axes;
  for (int32_t axis : list.axes()) {
    std::optional<size_t> normalized = NormalizeAxis(axis, ndim);
    if (!normalized.has_value()) {
      return StepError(number, what, shape,
                       absl::StrCat("axis ", axis, " is out of range for ", ndim, " axes"));
    }
    if (std::find(axes.begin(), axes.end(), *normalized) != axes.end()) {
      return StepError(number, what, shape, absl::StrCat("axis ", axis, " is repeated"));
    }
    axes.push_back(*normalized);
  }
  return axes;
}

absl::StatusOr<std::vector<uint64_t>> ReshapeShape(int number, const v1::SignedShape& target,
                                                   std::span<const uint64_t> shape) {
  uint64_t elements = 1;
  for (uint64_t extent : shape) elements *= extent;  // the server's shapes do not overflow
  std::optional<size_t> unknown;
  uint64_t known = 1;
  bool overflow = false;
  std::vector<uint64_t> result;
  for (int i = 0; i < target.extents_size(); ++i) {
    const int64_t extent = target.extents(i);
    if (extent == -1 && !unknown.has_value()) {
      unknown = i;
      result.push_back(0);
      continue;
    }
    if (extent < 0) return StepError(number, "reshape", shape, "only one extent may be -1");
    if (extent != 0 && known > UINT64_MAX / static_cast<uint64_t>(extent)) {
      overflow = true;
    } else {
      known *= static_cast<uint64_t>(extent);
    }
    result.push_back(static_cast<uint64_t>(extent));
  }
  if (!overflow && unknown.has_value() && known != 0 && elements % known == 0) {
    result[*unknown] = elements / known;
  } else if (overflow || unknown.has_value() || known != elements) {
    return StepError(number, "reshape", shape,
                     absl::StrCat("cannot reshape ", elements, " elements into (",
                                  absl::StrJoin(target.extents(), ", "), ")"));
  }
  return result;
}

absl::StatusOr<std::vector<uint64_t>> StepShape(int number, const v1::ViewStep& step,
                                                std::vector<uint64_t> shape) {
  switch (step.step_case()) {
    case v1::ViewStep::kIndex:
      return IndexShape(number, step.index(), std::move(shape));
    case v1::ViewStep::kTranspose: {
      if (step.transpose().axes().empty()) {
        std::reverse(shape.begin(), shape.end());
        return shape;
      }
      absl::StatusOr<std::vector<size_t>> axes =
          Axes(number, "transpose", shape, step.transpose(), shape.size());
      if (!axes.ok()) return axes.status();
      if (axes->size() != shape.size()) {
        return StepError(number, "transpose", shape,
                         absl::StrCat(axes->size(), " axes do not permute ", shape.size()));
      }
      std::vector<uint64_t> result;
      for (size_t axis : *axes) result.push_back(shape[axis]);
      return result;
    }
    case v1::ViewStep::kExpandDims: {
      const size_t ndim = shape.size() + step.expand_dims().axes_size();
      absl::StatusOr<std::vector<size_t>> axes =
          Axes(number, "expand_dims", shape, step.expand_dims(), ndim);
      if (!axes.ok()) return axes.status();
      std::vector<uint64_t> result;
      size_t next = 0;
      for (size_t axis = 0; axis < ndim; ++axis) {
        const bool inserted = std::find(axes->begin(), axes->end(), axis) != axes->end();
        result.push_back(inserted ? 1 : shape[next++]);
      }
      return result;
    }
    case v1::ViewStep::kSqueeze: {
      absl::StatusOr<std::vector<size_t>> axes =
          Axes(number, "squeeze", shape, step.squeeze(), shape.size());
      if (!axes.ok()) return axes.status();
      std::vector<uint64_t> result;
      for (size_t axis = 0; axis < shape.size(); ++axis) {
        const bool listed = std::find(axes->begin(), axes->end(), axis) != axes->end();
        if (listed && shape[axis] != 1) {
          return StepError(number, "squeeze", shape,
                           absl::StrCat("axis ", axis, " has length ", shape[axis], ", not 1"));
        }
        if (listed || (axes->empty() && shape[axis] == 1)) continue;
        result.push_back(shape[axis]);
      }
      return result;
    }
    case v1::ViewStep::kBroadcastTo: {
      std::vector<uint64_t> target(step.broadcast_to().extents().begin(),
                                   step.broadcast_to().extents().end());
      bool fits = target.size() >= shape.size();
      for (size_t i = 0; fits && i < shape.size(); ++i) {
        const uint64_t from = shape[shape.size() - 1 - i];
        fits = from == 1 || from == target[target.size() - 1 - i];
      }
      if (!fits) {
        return StepError(number, "broadcast_to", shape,
                         absl::StrCat("it does not broadcast to ", ShapeText(target)));
      }
      return target;
    }
    case v1::ViewStep::kReshape:
      return ReshapeShape(number, step.reshape(), shape);
    case v1::ViewStep::STEP_NOT_SET:
      break;
  }
  return StepError(number, "empty", shape, "the step is empty");
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ViewShape(std::span<const uint64_t> shape,
                                                const ViewSteps& steps) {
  std::vector<uint64_t> result(shape.begin(), shape.end());
  for (int i = 0; i < steps.size(); ++i) {
    absl::StatusOr<std::vector<uint64_t>> next = StepShape(i, steps[i], std::move(result));
    if (!next.ok()) return next.status();
    result = *std::move(next);
  }
  return result;
}

absl::StatusOr<uint64_t> ViewBytes(const v1::BufferInfo& buffer, const ViewSteps& steps) {
  if (steps.empty()) return buffer.size_bytes();
  absl::StatusOr<DType> dtype = FromProtoDType(buffer.dtype());
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<std::vector<uint64_t>> shape = ViewShape(
      std::span<const uint64_t>(buffer.shape().data(), static_cast<size_t>(buffer.shape_size())),
      steps);
  if (!shape.ok()) return shape.status();
  // A broadcast view may be far larger than its buffer.
  uint64_t bytes = DTypeSize(*dtype);
  for (uint64_t extent : *shape) {
    if (extent != 0 && bytes > UINT64_MAX / extent) {
      return absl::OutOfRangeError("the view's size in bytes overflows 64 bits");
    }
    bytes *= extent;
  }
  return bytes;
}

}  // namespace gpucompute

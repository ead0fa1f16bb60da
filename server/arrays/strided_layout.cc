#include "server/arrays/strided_layout.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpucompute {
namespace {

// a * b and a + b, or nothing when the exact result does not fit in int64.
std::optional<int64_t> Mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<int64_t> Add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

absl::Status Overflow(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": the view's offsets overflow 64 bits"));
}

absl::Status TooManyDims(int ndim, int max_dims) {
  return absl::InvalidArgumentError(absl::StrCat("the view would have ", ndim,
                                                 " dimensions; the server allows at most ",
                                                 max_dims));
}

// NumPy's AxisError text.
absl::Status AxisOutOfBounds(int64_t axis, int ndim) {
  return absl::InvalidArgumentError(
      absl::StrCat("axis ", axis, " is out of bounds for array of dimension ", ndim));
}

// `axis` counted from the front of `ndim` axes.
absl::StatusOr<int> NormalizeAxis(int64_t axis, int ndim) {
  if (axis < -ndim || axis >= ndim) return AxisOutOfBounds(axis, ndim);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

// Keeps the convention of the header: an axis of extent 1 has stride 0.
void ZeroUnitStrides(StridedLayout& layout) {
  for (int d = 0; d < layout.ndim(); ++d) {
    if (layout.shape[d] == 1) layout.strides[d] = 0;
  }
}

bool IsContiguous(const StridedLayout& l, bool c_order) {
  if (l.num_elements() == 0) return true;
  int64_t expected = 1;
  for (int k = 0; k < l.ndim(); ++k) {
    const int d = c_order ? l.ndim() - 1 - k : k;
    if (l.shape[d] != 1 && l.strides[d] != expected) return false;
    expected *= l.shape[d];
  }
  return true;
}

// The start and length of Python's slice start:stop:step over `n` positions
// (PySlice_AdjustIndices), without overflow for any int64 inputs.
struct SliceRange {
  int64_t start = 0;
  int64_t length = 0;
};
SliceRange AdjustSlice(int64_t n, std::optional<int64_t> start_in, std::optional<int64_t> stop_in,
                       int64_t step) {
  auto clamp = [&](int64_t v, int64_t low, int64_t high) {
    if (v < 0) v = v < -n ? low : v + n;  // v + n cannot overflow: v < 0 <= n
    return std::min(std::max(v, low), high);
  };
  SliceRange r;
  if (step > 0) {
    const int64_t start = start_in ? clamp(*start_in, 0, n) : 0;
    const int64_t stop = stop_in ? clamp(*stop_in, 0, n) : n;
    r.start = start;
    r.length = stop > start ? (stop - start - 1) / step + 1 : 0;
  } else {
    const int64_t start = start_in ? clamp(*start_in, -1, n - 1) : n - 1;
    const int64_t stop = stop_in ? clamp(*stop_in, -1, n - 1) : -1;
    r.start = start;
    // -step overflows for INT64_MIN; any step longer than the axis takes one element.
    r.length = start > stop ? (step < -n ? 1 : (start - stop - 1) / -step + 1) : 0;
  }
  return r;
}

}  // namespace

int64_t StridedLayout::num_elements() const {
  // An empty layout may have other extents whose product alone would overflow.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

bool StridedLayout::IsCContiguous() const { return IsContiguous(*this, true); }
bool StridedLayout::IsFContiguous() const { return IsContiguous(*this, false); }

bool StridedLayout::HasBroadcast() const {
  // An empty array has no element to reach twice, whatever its strides: a dense (3,0)
  // has stride 0 on its axis of 3.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return false;
  for (int d = 0; d < ndim(); ++d) {
    if (shape[d] > 1 && strides[d] == 0) return true;
  }
  return false;
}

StridedLayout DenseLayout(const std::vector<uint64_t>& shape, bool fortran_order) {
  StridedLayout l;
  l.shape.assign(shape.begin(), shape.end());
  l.strides.assign(shape.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t d = fortran_order ? k : shape.size() - 1 - k;
    l.strides[d] = stride;
    stride *= l.shape[d];
  }
  ZeroUnitStrides(l);
  return l;
}

absl::StatusOr<ElementSpan> TouchedSpan(const StridedLayout& layout) {
  ElementSpan span{layout.offset, layout.offset - 1};
  for (int64_t e : layout.shape) {
    if (e == 0) return span;
  }
  span.last = layout.offset;
  for (int d = 0; d < layout.ndim(); ++d) {
    std::optional<int64_t> reach = Mul(layout.strides[d], layout.shape[d] - 1);
    if (!reach) return Overflow("span");
    std::optional<int64_t> moved = Add(*reach < 0 ? span.first : span.last, *reach);
    if (!moved) return Overflow("span");
    (*reach < 0 ? span.first : span.last) = *moved;
  }
  return span;
}

std::string NumpyShape(std::span<const int64_t> shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ","), ")");
}

absl::StatusOr<StridedLayout> IndexView(const StridedLayout& in, std::span<const IndexItem> items,
                                        int max_dims) {
  int consumed = 0;
  int ellipses = 0;
  for (const IndexItem& item : items) {
    if (item.kind == IndexItem::Kind::kIndex || item.kind == IndexItem::Kind::kSlice) ++consumed;
    if (item.kind == IndexItem::Kind::kEllipsis) ++ellipses;
  }
  if (ellipses > 1) {
    return absl::InvalidArgumentError("an index can only have a single ellipsis ('...')");
  }
  if (consumed > in.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("too many indices for array: array is ",
                                                   in.ndim(), "-dimensional, but ", consumed,
                                                   " were indexed"));
  }
  StridedLayout out;
  out.offset = in.offset;
  int axis = 0;  // the next axis of `in`
  auto keep_whole = [&](int count) {
    for (int k = 0; k < count; ++k, ++axis) {
      out.shape.push_back(in.shape[axis]);
      out.strides.push_back(in.strides[axis]);
    }
  };
  for (const IndexItem& item : items) {
    switch (item.kind) {
      case IndexItem::Kind::kIndex: {
        const int64_t n = in.shape[axis];
        if (item.index < -n || item.index >= n) {
          return absl::InvalidArgumentError(absl::StrCat("index ", item.index,
                                                         " is out of bounds for axis ", axis,
                                                         " with size ", n));
        }
        const int64_t i = item.index < 0 ? item.index + n : item.index;
        // Within the axis, so within what `in` already reaches: no overflow.
        out.offset += i * in.strides[axis];
        ++axis;
        break;
      }
      case IndexItem::Kind::kSlice: {
        const int64_t step = item.step.value_or(1);
        if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
        const SliceRange r = AdjustSlice(in.shape[axis], item.start, item.stop, step);
        if (r.length > 0) out.offset += r.start * in.strides[axis];
        std::optional<int64_t> stride = r.length > 1 ? Mul(in.strides[axis], step) : 0;
        if (!stride) return Overflow(absl::StrCat("slice of axis ", axis));
        out.shape.push_back(r.length);
        out.strides.push_back(*stride);
        ++axis;
        break;
      }
      case IndexItem::Kind::kNewAxis:
        out.shape.push_back(1);
        out.strides.push_back(0);
        break;
      case IndexItem::Kind::kEllipsis:
        keep_whole(in.ndim() - consumed);
        break;
    }
  }
  keep_whole(in.ndim() - axis);
  if (out.ndim() > max_dims) return TooManyDims(out.ndim(), max_dims);
  ZeroUnitStrides(out);
  return out;
}

absl::StatusOr<StridedLayout> TransposeView(const StridedLayout& in,
                                            std::span<const int32_t> axes) {
  const int n = in.ndim();
  std::vector<int> order(n);
  if (axes.empty()) {
    for (int d = 0; d < n; ++d) order[d] = n - 1 - d;
  } else {
    if (static_cast<int>(axes.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "axes don't match array: ", axes.size(), " axes for an array of dimension ", n));
    }
    std::vector<bool> seen(n, false);
    for (int d = 0; d < n; ++d) {
      absl::StatusOr<int> a = NormalizeAxis(axes[d], n);
      if (!a.ok()) return a.status();
      if (seen[*a]) return absl::InvalidArgumentError("repeated axis in transpose");
      seen[*a] = true;
      order[d] = *a;
    }
  }
  StridedLayout out;
  out.offset = in.offset;
  for (int a : order) {
    out.shape.push_back(in.shape[a]);
    out.strides.push_back(in.strides[a]);
  }
  return out;
}

absl::StatusOr<StridedLayout> ExpandDimsView(const StridedLayout& in,
                                             std::span<const int32_t> axes, int max_dims) {
  const int64_t n = in.ndim() + static_cast<int64_t>(axes.size());
  if (n > max_dims) return TooManyDims(static_cast<int>(n), max_dims);
  std::vector<bool> is_new(n, false);
  for (int32_t axis : axes) {
    absl::StatusOr<int> a = NormalizeAxis(axis, static_cast<int>(n));
    if (!a.ok()) return a.status();
    if (is_new[*a]) return absl::InvalidArgumentError("repeated axis in expand_dims");
    is_new[*a] = true;
  }
  StridedLayout out;
  out.offset = in.offset;
  int next = 0;
  for (int d = 0; d < n; ++d) {
    out.shape.push_back(is_new[d] ? 1 : in.shape[next]);
    out.strides.push_back(is_new[d] ? 0 : in.strides[next]);
    if (!is_new[d]) ++next;
  }
  return out;
}

absl::StatusOr<StridedLayout> SqueezeView(const StridedLayout& in, std::span<const int32_t> axes) {
  std::vector<bool> drop(in.ndim(), axes.empty());
  if (axes.empty()) {
    for (int d = 0; d < in.ndim(); ++d) drop[d] = in.shape[d] == 1;
  }
  for (int32_t axis : axes) {
    absl::StatusOr<int> a = NormalizeAxis(axis, in.ndim());
    if (!a.ok()) return a.status();
    if (drop[*a]) return absl::InvalidArgumentError("repeated axis in squeeze");
    if (in.shape[*a] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot select an axis to squeeze out which has size not equal to one (axis ", *a,
          " of shape ", NumpyShape(in.shape), ")"));
    }
    drop[*a] = true;
  }
  StridedLayout out;
  out.offset = in.offset;
  for (int d = 0; d < in.ndim(); ++d) {
    if (drop[d]) continue;
    out.shape.push_back(in.shape[d]);
    out.strides.push_back(in.strides[d]);
  }
  return out;
}

absl::StatusOr<StridedLayout> BroadcastToView(const StridedLayout& in,
                                              std::span<const int64_t> shape, int max_dims) {
  const int n = static_cast<int>(shape.size());
  auto refuse = [&] {
    return absl::InvalidArgumentError(absl::StrCat("cannot broadcast an array of shape ",
                                                   NumpyShape(in.shape), " to shape ",
                                                   NumpyShape(shape)));
  };
  if (n > max_dims) return TooManyDims(n, max_dims);
  if (n < in.ndim()) return refuse();
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  std::optional<int64_t> count = 1;
  for (int64_t e : shape) {
    if (e < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast_to shape ", NumpyShape(shape), " has a negative extent"));
    }
    if (empty) continue;  // no elements, however large the other extents
    count = Mul(*count, e);
    if (!count) return Overflow(absl::StrCat("broadcast_to ", NumpyShape(shape)));
  }
  StridedLayout out;
  out.offset = in.offset;
  out.shape.assign(shape.begin(), shape.end());
  out.strides.assign(n, 0);
  for (int k = 0; k < in.ndim(); ++k) {
    const int d = n - in.ndim() + k;
    if (in.shape[k] == shape[d]) {
      out.strides[d] = in.strides[k];
    } else if (in.shape[k] != 1) {
      return refuse();
    }
  }
  ZeroUnitStrides(out);
  return out;
}

absl::StatusOr<StridedLayout> ReshapeView(const StridedLayout& in, std::span<const int64_t> shape,
                                          int max_dims) {
  const int64_t total = in.num_elements();
  std::vector<int64_t> dims(shape.begin(), shape.end());
  auto refuse = [&] {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape array of size ", total,
                                                   " into shape ", NumpyShape(shape)));
  };
  if (static_cast<int>(dims.size()) > max_dims) {
    return TooManyDims(static_cast<int>(dims.size()), max_dims);
  }
  int unknown = -1;
  int64_t known = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == -1 && unknown < 0) {
      unknown = static_cast<int>(d);
      continue;
    }
    if (dims[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshape shape ", NumpyShape(shape),
                       " may have one extent of -1 and no other negative extent"));
    }
    std::optional<int64_t> k = Mul(known, dims[d]);
    if (!k) return refuse();
    known = *k;
  }
  if (unknown >= 0) {
    if (known == 0 || total % known != 0) return refuse();
    dims[unknown] = total / known;
  } else if (known != total) {
    return refuse();
  }

  StridedLayout out;
  out.offset = in.offset;
  out.shape = dims;
  out.strides.assign(dims.size(), 0);
  if (total == 0) return out;
  // NumPy's no-copy reshape (_attempt_nocopy_reshape): the axes of extent above 1 of
  // both shapes are split into groups of equal element counts; each group of old axes
  // must step through memory as one C-ordered run, which the new axes of the group then
  // subdivide.
  std::vector<int64_t> old_dims, old_strides, new_axes;
  for (int d = 0; d < in.ndim(); ++d) {
    if (in.shape[d] == 1) continue;
    old_dims.push_back(in.shape[d]);
    old_strides.push_back(in.strides[d]);
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] != 1) new_axes.push_back(static_cast<int64_t>(d));
  }
  size_t oi = 0, ni = 0;
  while (oi < old_dims.size() && ni < new_axes.size()) {
    size_t oj = oi + 1, nj = ni + 1;
    int64_t op = old_dims[oi], np = dims[new_axes[ni]];
    while (op != np) {  // both groups' products stay below total: no overflow
      if (np < op) {
        np *= dims[new_axes[nj++]];
      } else {
        op *= old_dims[oj++];
      }
    }
    for (size_t k = oi; k + 1 < oj; ++k) {
      if (old_strides[k] != old_dims[k + 1] * old_strides[k + 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot reshape a view of shape ", NumpyShape(in.shape), " into shape ",
            NumpyShape(shape),
            " without copying its elements; copy it into a new buffer first (an elementwise "
            "'x')"));
      }
    }
    int64_t stride = old_strides[oj - 1];
    for (size_t k = nj; k-- > ni;) {
      out.strides[new_axes[k]] = stride;
      stride *= dims[new_axes[k]];  // at most the group's first stride times its extent
    }
    oi = oj;
    ni = nj;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> BroadcastShapes(
    std::span<const std::vector<int64_t>> shapes) {
  size_t n = 0;
  for (const auto& s : shapes) n = std::max(n, s.size());
  std::vector<int64_t> out(n, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out[n - s.size() + k];
      if (s[k] == o || s[k] == 1) continue;
      if (o == 1) {
        o = s[k];
        continue;
      }
      std::vector<std::string> texts;
      for (const auto& t : shapes) texts.push_back(NumpyShape(t));
      return absl::InvalidArgumentError(
          absl::StrCat("operands could not be broadcast together with shapes ",
                       absl::StrJoin(texts, " ")));
    }
  }
  // Operands of bounded sizes can still broadcast to a shape of 2^80 elements.
  if (std::find(out.begin(), out.end(), 0) == out.end()) {
    std::optional<int64_t> count = 1;
    for (int64_t e : out) {
      count = Mul(*count, e);
      if (!count) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the operands broadcast to shape ", NumpyShape(out),
            ", whose element count overflows 64 bits"));
      }
    }
  }
  return out;
}

Overlap CompareOverlap(const StridedLayout& a, const StridedLayout& b) {
  absl::StatusOr<ElementSpan> sa = TouchedSpan(a);
  absl::StatusOr<ElementSpan> sb = TouchedSpan(b);
  if (!sa.ok() || !sb.ok()) return Overlap::kPartial;
  if (sa->last < sa->first || sb->last < sb->first) return Overlap::kDisjoint;
  if (sa->last < sb->first || sb->last < sa->first) return Overlap::kDisjoint;
  if (a.offset == b.offset && a.shape == b.shape) {
    bool same = true;
    for (int d = 0; d < a.ndim(); ++d) {
      same = same && (a.shape[d] == 1 || a.strides[d] == b.strides[d]);
    }
    if (same) return Overlap::kSame;
  }
  return Overlap::kPartial;
}

void CoalesceAxes(std::span<StridedLayout*> layouts) {
  if (layouts.empty()) return;
  const std::vector<int64_t> shape = layouts[0]->shape;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    for (StridedLayout* l : layouts) {
      l->shape = {0};
      l->strides = {0};
    }
    return;
  }
  std::vector<int64_t> merged_shape;
  std::vector<std::vector<int64_t>> merged_strides(layouts.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool joins = !merged_shape.empty();
    for (size_t k = 0; joins && k < layouts.size(); ++k) {
      joins = merged_strides[k].back() == shape[d] * layouts[k]->strides[d];
    }
    if (joins) {
      merged_shape.back() *= shape[d];
      for (size_t k = 0; k < layouts.size(); ++k) merged_strides[k].back() = layouts[k]->strides[d];
    } else {
      merged_shape.push_back(shape[d]);
      for (size_t k = 0; k < layouts.size(); ++k) merged_strides[k].push_back(layouts[k]->strides[d]);
    }
  }
  for (size_t k = 0; k < layouts.size(); ++k) {
    layouts[k]->shape = merged_shape;
    layouts[k]->strides = std::move(merged_strides[k]);
  }
}

}  // namespace gpucompute

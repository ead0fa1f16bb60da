// Fuzzes the view arithmetic: ApplyViewSteps over a random buffer shape with random
// ViewSteps whose integers are often near the ends of int64, and checks what it returns:
// every layout it accepts stays inside its base buffer's elements, has no more axes than
// allowed, and keeps its span when coalesced. The fuzz build runs it under the
// sanitizers, so an overflow in the arithmetic is a failure too.
//
// Input: a byte for the base's dimensions (0 to 4) and F order, a byte per extent, then
// steps of one kind byte and their operands; an integer operand is a byte choosing a
// small value or one of the extremes (see Reader::Int).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "gpucompute/v1/gpucompute.pb.h"
#include "server/arrays/strided_layout.h"
#include "server/arrays/view_steps.h"

namespace gpucompute {
namespace {

constexpr int kMaxDims = 8;

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // Small values most of the time; with the top bit set, one near the ends of int64.
  int64_t Int() {
    const uint8_t b = Byte();
    if ((b & 0x80) == 0) return static_cast<int64_t>(b & 0x3f) - 16;
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    const int64_t extremes[] = {kMin,        kMin + 1,   kMax,           kMax - 1,
                                int64_t{1} << 62, -(int64_t{1} << 62), int64_t{1} << 32,
                                -(int64_t{1} << 32)};
    return extremes[b % 8];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void AddAxes(Reader& in, v1::AxisList* list) {
  const int n = in.Byte() % 5;
  for (int k = 0; k < n; ++k) list->add_axes(static_cast<int32_t>(in.Int()));
}

v1::ViewStep Step(Reader& in) {
  v1::ViewStep step;
  switch (in.Byte() % 6) {
    case 0: {
      const int n = in.Byte() % 6;
      for (int k = 0; k < n; ++k) {
        v1::IndexItem* item = step.mutable_index()->add_items();
        switch (in.Byte() % 4) {
          case 0:
            item->set_index(in.Int());
            break;
          case 1: {
            const uint8_t present = in.Byte();
            v1::Slice* slice = item->mutable_slice();
            if (present & 1) slice->set_start(in.Int());
            if (present & 2) slice->set_stop(in.Int());
            if (present & 4) slice->set_step(in.Int());
            break;
          }
          case 2:
            item->set_new_axis(true);
            break;
          default:
            item->set_ellipsis(true);
        }
      }
      break;
    }
    case 1:
      AddAxes(in, step.mutable_transpose());
      break;
    case 2:
      AddAxes(in, step.mutable_expand_dims());
      break;
    case 3:
      AddAxes(in, step.mutable_squeeze());
      break;
    case 4: {
      const int n = in.Byte() % 6;
      for (int k = 0; k < n; ++k) {
        step.mutable_broadcast_to()->add_extents(static_cast<uint64_t>(in.Int()));
      }
      break;
    }
    default: {
      const int n = in.Byte() % 6;
      for (int k = 0; k < n; ++k) step.mutable_reshape()->add_extents(in.Int());
    }
  }
  return step;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpucompute;
  Reader in(data, size);
  const uint8_t head = in.Byte();
  std::vector<uint64_t> shape(head % 5);
  for (uint64_t& extent : shape) extent = in.Byte() % 9;
  const StridedLayout base = DenseLayout(shape, (head & 0x80) != 0 && shape.size() >= 2);
  const int64_t elements = base.num_elements();
  google::protobuf::RepeatedPtrField<v1::ViewStep> steps;
  while (!in.empty() && steps.size() < kMaxViewSteps + 1) *steps.Add() = Step(in);

  absl::StatusOr<StridedLayout> view = ApplyViewSteps(base, steps, kMaxDims);
  if (!view.ok()) {
    Check(view.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  Check(view->ndim() <= kMaxDims);
  Check(view->strides.size() == view->shape.size());
  for (int64_t extent : view->shape) Check(extent >= 0);
  absl::StatusOr<ElementSpan> span = TouchedSpan(*view);
  Check(span.ok());
  if (view->num_elements() > 0) {
    Check(span->first >= 0 && span->last < elements && span->first <= span->last);
  } else {
    Check(span->last < span->first);
  }
  // Coalescing keeps the elements it iterates over.
  StridedLayout coalesced = *view;
  StridedLayout* one[] = {&coalesced};
  CoalesceAxes(one);
  Check(coalesced.num_elements() == view->num_elements());
  if (view->num_elements() > 0) {
    absl::StatusOr<ElementSpan> after = TouchedSpan(coalesced);
    Check(after.ok() && after->first == span->first && after->last == span->last);
  }
  return 0;
}

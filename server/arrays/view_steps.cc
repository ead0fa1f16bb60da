#include "server/arrays/view_steps.h"

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

const char* StepName(const v1::ViewStep& step) {
  switch (step.step_case()) {
    case v1::ViewStep::kIndex:
      return "index";
    case v1::ViewStep::kTranspose:
      return "transpose";
    case v1::ViewStep::kExpandDims:
      return "expand_dims";
    case v1::ViewStep::kSqueeze:
      return "squeeze";
    case v1::ViewStep::kBroadcastTo:
      return "broadcast_to";
    case v1::ViewStep::kReshape:
      return "reshape";
    case v1::ViewStep::STEP_NOT_SET:
      break;
  }
  return "empty";
}

absl::StatusOr<std::vector<IndexItem>> IndexItems(const v1::Indexing& indexing) {
  std::vector<IndexItem> items;
  for (const v1::IndexItem& item : indexing.items()) {
    IndexItem i;
    switch (item.item_case()) {
      case v1::IndexItem::kIndex:
        i.kind = IndexItem::Kind::kIndex;
        i.index = item.index();
        break;
      case v1::IndexItem::kSlice:
        i.kind = IndexItem::Kind::kSlice;
        if (item.slice().has_start()) i.start = item.slice().start();
        if (item.slice().has_stop()) i.stop = item.slice().stop();
        if (item.slice().has_step()) i.step = item.slice().step();
        break;
      case v1::IndexItem::kNewAxis:
        i.kind = IndexItem::Kind::kNewAxis;
        break;
      case v1::IndexItem::kEllipsis:
        i.kind = IndexItem::Kind::kEllipsis;
        break;
      case v1::IndexItem::ITEM_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat("index item ", items.size(), " is empty"));
    }
    items.push_back(i);
  }
  return items;
}

template <typename T>
std::span<const T> Span(const google::protobuf::RepeatedField<T>& field) {
  return {field.data(), static_cast<size_t>(field.size())};
}

absl::StatusOr<StridedLayout> ApplyStep(const StridedLayout& in, const v1::ViewStep& step,
                                        int max_dims) {
  switch (step.step_case()) {
    case v1::ViewStep::kIndex: {
      absl::StatusOr<std::vector<IndexItem>> items = IndexItems(step.index());
      if (!items.ok()) return items.status();
      return IndexView(in, *items, max_dims);
    }
    case v1::ViewStep::kTranspose:
      return TransposeView(in, Span(step.transpose().axes()));
    case v1::ViewStep::kExpandDims:
      return ExpandDimsView(in, Span(step.expand_dims().axes()), max_dims);
    case v1::ViewStep::kSqueeze:
      return SqueezeView(in, Span(step.squeeze().axes()));
    case v1::ViewStep::kBroadcastTo: {
      std::vector<int64_t> shape;
      for (uint64_t e : step.broadcast_to().extents()) {
        if (e > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return absl::InvalidArgumentError(absl::StrCat("extent ", e, " is too large"));
        }
        shape.push_back(static_cast<int64_t>(e));
      }
      return BroadcastToView(in, shape, max_dims);
    }
    case v1::ViewStep::kReshape:
      return ReshapeView(in, Span(step.reshape().extents()), max_dims);
    case v1::ViewStep::STEP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the step names no operation");
}

}  // namespace

absl::StatusOr<StridedLayout> ApplyViewSteps(
    StridedLayout base, const google::protobuf::RepeatedPtrField<v1::ViewStep>& steps,
    int max_dims) {
  if (steps.size() > kMaxViewSteps) {
    return absl::InvalidArgumentError(absl::StrCat("a view has ", steps.size(),
                                                   " steps; the server allows at most ",
                                                   kMaxViewSteps));
  }
  StridedLayout layout = std::move(base);
  for (int k = 0; k < steps.size(); ++k) {
    absl::StatusOr<StridedLayout> next = ApplyStep(layout, steps[k], max_dims);
    if (!next.ok()) {
      return absl::Status(next.status().code(),
                          absl::StrCat("view step ", k, " (", StepName(steps[k]),
                                       ") of shape ", NumpyShape(layout.shape), ": ",
                                       next.status().message()));
    }
    layout = *std::move(next);
  }
  return layout;
}

}  // namespace gpucompute

// The view syntax (view_syntax.h): a recursive-descent parser over the text, and its
// inverse.
#include "client/cpp/view_syntax.h"

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/string_view.h"

namespace gpucompute {
namespace {

constexpr std::array<std::string_view, 5> kMethods = {"transpose", "reshape", "squeeze",
                                                      "expand_dims", "broadcast_to"};

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<ArrayRef> Reference() {
    SkipSpaces();
    const size_t name_start = pos_;
    while (pos_ < text_.size() && !SuffixStartsAt(pos_)) ++pos_;
    std::string_view name = text_.substr(name_start, pos_ - name_start);
    while (!name.empty() && IsSpace(name.back())) name.remove_suffix(1);
    if (name.empty()) {
      pos_ = name_start;
      return Expected("a buffer id or name");
    }
    ArrayRef ref{std::string(name)};
    while (true) {
      SkipSpaces();
      if (pos_ == text_.size()) return ref;
      absl::StatusOr<v1::ViewStep> step = Suffix();
      if (!step.ok()) return step.status();
      ref = ref.With(*std::move(step));
    }
  }

 private:
  // Whether a suffix starts at `at` (a '[', or a '.' before T or a method and its '(').
  bool SuffixStartsAt(size_t at) const {
    if (text_[at] == '[') return true;
    if (text_[at] != '.') return false;
    std::string_view rest = text_.substr(at + 1);
    if (rest.starts_with("T") &&
        (rest.size() == 1 || rest[1] == '[' || rest[1] == '.' || IsSpace(rest[1]))) {
      return true;
    }
    for (std::string_view method : kMethods) {
      if (!rest.starts_with(method)) continue;
      size_t next = method.size();
      while (next < rest.size() && IsSpace(rest[next])) ++next;
      if (next < rest.size() && rest[next] == '(') return true;
    }
    return false;
  }

  absl::StatusOr<v1::ViewStep> Suffix() {
    if (Take('[')) return IndexStep();
    if (Take('.')) {
      SkipSpaces();
      if (TakeWord("T")) {
        v1::ViewStep step;
        step.mutable_transpose();
        return step;
      }
      for (std::string_view method : kMethods) {
        if (TakeWord(method)) return MethodStep(method);
      }
    }
    return Expected(
        "'[', '.T' or a method (.transpose .reshape .squeeze .expand_dims .broadcast_to)");
  }

  absl::StatusOr<v1::ViewStep> IndexStep() {
    v1::ViewStep step;
    v1::Indexing* indexing = step.mutable_index();
    SkipSpaces();
    if (Take(']')) return step;
    while (true) {
      absl::Status item = IndexItem(indexing->add_items());
      if (!item.ok()) return item;
      SkipSpaces();
      if (Take(']')) return step;
      if (!Take(',')) return Expected("',' or ']'");
      SkipSpaces();
      if (Take(']')) return step;  // x[0,] as Python's tuple
    }
  }

  absl::Status IndexItem(v1::IndexItem* item) {
    SkipSpaces();
    if (text_.substr(pos_).starts_with("...")) {
      pos_ += 3;
      item->set_ellipsis(true);
      return absl::OkStatus();
    }
    if (TakeWord("None")) {
      item->set_new_axis(true);
      return absl::OkStatus();
    }
    std::optional<int64_t> first;
    if (NumberAhead()) {
      absl::StatusOr<int64_t> number = Integer(std::numeric_limits<int64_t>::min());
      if (!number.ok()) return number.status();
      first = *number;
    }
    SkipSpaces();
    if (!Take(':')) {
      if (!first.has_value()) return Expected("an integer, a slice, None or '...'");
      item->set_index(*first);
      return absl::OkStatus();
    }
    v1::Slice* slice = item->mutable_slice();
    if (first.has_value()) slice->set_start(*first);
    for (int part = 0; part < 2; ++part) {
      SkipSpaces();
      if (NumberAhead()) {
        const size_t at = pos_;
        absl::StatusOr<int64_t> number = Integer(std::numeric_limits<int64_t>::min());
        if (!number.ok()) return number.status();
        if (part == 0) {
          slice->set_stop(*number);
        } else if (*number == 0) {
          pos_ = at;
          return Expected("a nonzero slice step");
        } else {
          slice->set_step(*number);
        }
      }
      SkipSpaces();
      if (part == 1 || !Take(':')) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<v1::ViewStep> MethodStep(std::string_view method) {
    SkipSpaces();
    if (!Take('(')) return Expected("'('");
    // One tuple in place of the list: x.reshape((2, -1)).
    SkipSpaces();
    const bool tuple = Take('(');
    const bool extents = method == "reshape" || method == "broadcast_to";
    const int64_t min = method == "broadcast_to" ? 0
                        : extents               ? std::numeric_limits<int64_t>::min()
                                                : std::numeric_limits<int32_t>::min();
    const int64_t max = extents ? std::numeric_limits<int64_t>::max()
                                : std::numeric_limits<int32_t>::max();
    std::vector<int64_t> values;
    SkipSpaces();
    while (NumberAhead()) {
      absl::StatusOr<int64_t> number = Integer(min, max);
      if (!number.ok()) return number.status();
      values.push_back(*number);
      SkipSpaces();
      if (!Take(',')) break;
      SkipSpaces();
    }
    SkipSpaces();
    if (!Take(')')) return Expected(values.empty() ? "an integer or ')'" : "',' or ')'");
    SkipSpaces();
    if (tuple && !Take(')')) return Expected("')'");
    v1::ViewStep step;
    if (method == "reshape") {
      step.mutable_reshape()->mutable_extents()->Add(values.begin(), values.end());
    } else if (method == "broadcast_to") {
      for (int64_t value : values) step.mutable_broadcast_to()->add_extents(value);
    } else {
      v1::AxisList* axes = method == "transpose" ? step.mutable_transpose()
                           : method == "squeeze" ? step.mutable_squeeze()
                                                 : step.mutable_expand_dims();
      for (int64_t value : values) axes->add_axes(static_cast<int32_t>(value));
    }
    return step;
  }

  bool NumberAhead() const {
    size_t at = pos_;
    if (at < text_.size() && (text_[at] == '-' || text_[at] == '+')) ++at;
    return at < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[at]));
  }

  // A decimal integer in [min, max] at pos_ (NumberAhead is true).
  absl::StatusOr<int64_t> Integer(int64_t min,
                                  int64_t max = std::numeric_limits<int64_t>::max()) {
    const size_t start = pos_;
    const bool negative = text_[pos_] == '-';
    if (text_[pos_] == '-' || text_[pos_] == '+') ++pos_;
    // The magnitude, up to 2^63 (INT64_MIN's).
    const uint64_t limit = uint64_t{1} << 63;
    uint64_t magnitude = 0;
    bool too_large = false;
    while (pos_ < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (magnitude > (limit - digit) / 10) too_large = true;
      if (!too_large) magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    const bool in_int64 = !too_large && (negative || magnitude < limit);
    const int64_t value = !in_int64  ? 0
                          : negative ? static_cast<int64_t>(0 - magnitude)
                                     : static_cast<int64_t>(magnitude);
    if (!in_int64 || value < min || value > max) {
      const std::string_view number = text_.substr(start, pos_ - start);
      pos_ = start;
      return Expected(absl::StrCat("an integer in [", min, ", ", max, "], not ", ToAbsl(number)));
    }
    return value;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }

  bool Take(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  // `word` at pos_, not followed by another identifier character.
  bool TakeWord(std::string_view word) {
    if (!text_.substr(pos_).starts_with(word)) return false;
    const size_t end = pos_ + word.size();
    if (end < text_.size() &&
        (absl::ascii_isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }

  absl::Status Expected(std::string_view what) const {
    const std::string found =
        pos_ < text_.size() ? absl::StrCat("'", ToAbsl(text_.substr(pos_, 1)), "'") : "the end";
    return absl::InvalidArgumentError(absl::StrCat("in '", ToAbsl(text_), "' at position ",
                                                   pos_ + 1, ": expected ", ToAbsl(what),
                                                   ", found ", found));
  }

  const std::string_view text_;
  size_t pos_ = 0;
};

void AppendItem(std::string* out, const v1::IndexItem& item) {
  switch (item.item_case()) {
    case v1::IndexItem::kIndex:
      absl::StrAppend(out, item.index());
      return;
    case v1::IndexItem::kSlice: {
      const v1::Slice& slice = item.slice();
      if (slice.has_start()) absl::StrAppend(out, slice.start());
      out->push_back(':');
      if (slice.has_stop()) absl::StrAppend(out, slice.stop());
      if (slice.has_step()) absl::StrAppend(out, ":", slice.step());
      return;
    }
    case v1::IndexItem::kNewAxis:
      out->append("None");
      return;
    case v1::IndexItem::kEllipsis:
    case v1::IndexItem::ITEM_NOT_SET:
      out->append("...");
      return;
  }
}

}  // namespace

absl::StatusOr<ArrayRef> ParseArrayRef(std::string_view text) { return Parser(text).Reference(); }

std::string FormatArrayRef(const ArrayRef& ref) {
  std::string out = ref.buffer();
  for (const v1::ViewStep& step : ref.steps()) {
    switch (step.step_case()) {
      case v1::ViewStep::kIndex:
        out.push_back('[');
        for (int i = 0; i < step.index().items_size(); ++i) {
          if (i > 0) out.append(", ");
          AppendItem(&out, step.index().items(i));
        }
        out.push_back(']');
        break;
      case v1::ViewStep::kTranspose:
        if (step.transpose().axes().empty()) {
          out.append(".T");
        } else {
          absl::StrAppend(&out, ".transpose(", absl::StrJoin(step.transpose().axes(), ", "), ")");
        }
        break;
      case v1::ViewStep::kReshape:
        absl::StrAppend(&out, ".reshape(", absl::StrJoin(step.reshape().extents(), ", "), ")");
        break;
      case v1::ViewStep::kSqueeze:
        absl::StrAppend(&out, ".squeeze(", absl::StrJoin(step.squeeze().axes(), ", "), ")");
        break;
      case v1::ViewStep::kExpandDims:
        absl::StrAppend(&out, ".expand_dims(", absl::StrJoin(step.expand_dims().axes(), ", "),
                        ")");
        break;
      case v1::ViewStep::kBroadcastTo:
        absl::StrAppend(&out, ".broadcast_to(", absl::StrJoin(step.broadcast_to().extents(), ", "),
                        ")");
        break;
      case v1::ViewStep::STEP_NOT_SET:
        break;
    }
  }
  return out;
}

}  // namespace gpucompute

// The values of the gpucompute CLI's arguments: shapes, scalars, dtypes and layouts.
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cpp/npy.h"

namespace gpucompute::cli {

absl::StatusOr<std::vector<uint64_t>> ParseShape(std::string_view text) {
  absl::string_view inner = absl::StripAsciiWhitespace(ToAbsl(text));
  if (inner.size() >= 2 && ((inner.front() == '(' && inner.back() == ')') ||
                            (inner.front() == '[' && inner.back() == ']'))) {
    inner = absl::StripAsciiWhitespace(inner.substr(1, inner.size() - 2));
  }
  std::vector<uint64_t> shape;
  if (inner.empty()) return shape;
  std::vector<absl::string_view> parts = absl::StrSplit(inner, ',');
  // "3," is the one-dimensional shape, as in Python.
  if (parts.size() > 1 && absl::StripAsciiWhitespace(parts.back()).empty()) parts.pop_back();
  for (absl::string_view part : parts) {
    part = absl::StripAsciiWhitespace(part);
    uint64_t dimension;
    if (part.empty() || part.find('-') != absl::string_view::npos ||
        !absl::SimpleAtoi(part, &dimension)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape '", ToAbsl(text), "' is not a comma-separated list of sizes, e.g. 1000,10"));
    }
    shape.push_back(dimension);
  }
  return shape;
}

std::optional<v1::Scalar> ParseScalar(std::string_view text) {
  v1::Scalar scalar;
  if (text == "True" || text == "False") {
    scalar.set_bool_value(text == "True");
    return scalar;
  }
  if (text.empty() || absl::ascii_isspace(static_cast<unsigned char>(text.front())) ||
      absl::ascii_isspace(static_cast<unsigned char>(text.back()))) {
    return std::nullopt;
  }
  int64_t integer;
  if (absl::SimpleAtoi(ToAbsl(text), &integer)) {
    scalar.set_int_value(integer);
    return scalar;
  }
  double number;
  if (absl::SimpleAtod(ToAbsl(text), &number)) {
    scalar.set_float_value(number);
    return scalar;
  }
  return std::nullopt;
}

absl::StatusOr<v1::DType> ParseProtoDType(std::string_view name) {
  absl::StatusOr<DType> dtype = DTypeFromName(name);
  if (!dtype.ok()) return dtype.status();
  return ToProtoDType(*dtype);
}

absl::StatusOr<v1::Layout> ParseLayout(std::string_view text) {
  if (text == "C" || text == "c") return v1::LAYOUT_C;
  if (text == "F" || text == "f") return v1::LAYOUT_F;
  return absl::InvalidArgumentError(
      absl::StrCat("layout must be C (row-major) or F (column-major), not '", ToAbsl(text), "'"));
}

}  // namespace gpucompute::cli

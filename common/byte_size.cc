#include "common/byte_size.h"

#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace gpucompute {
namespace {

constexpr char kExamples[] = "e.g. 4096, 64Ki, 512MiB, 8GiB or 1G";
constexpr char kUnits[] = "use B, K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024)";

// The multiplier of `unit` (already lower-cased), or 0 if it is not a unit.
uint64_t UnitScale(absl::string_view unit) {
  if (unit.empty() || unit == "b") return 1;
  if (unit.back() == 'b') unit.remove_suffix(1);
  const bool binary = unit.size() == 2 && unit[1] == 'i';
  if (unit.size() != (binary ? 2 : 1)) return 0;
  // k is 1000^1 (or 1024^1), m 1000^2, g 1000^3, t 1000^4.
  const size_t power = absl::string_view("kmgt").find(unit[0]) + 1;
  if (power == 0) return 0;  // npos + 1
  uint64_t scale = 1;
  for (size_t i = 0; i < power; ++i) scale *= binary ? 1024 : 1000;
  return scale;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  auto not_a_size = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size: ", why, " (", kExamples, ")"));
  };
  if (t.empty()) return not_a_size("it is empty");
  if (t[0] == '-') return not_a_size("it is negative");
  if (!IsDigit(t[0])) return not_a_size("it does not start with a number");

  // Digits, then an optional fraction, then the unit.
  size_t end = 0;
  while (end < t.size() && IsDigit(t[end])) ++end;
  const absl::string_view whole = t.substr(0, end);
  absl::string_view fraction;
  if (end < t.size() && t[end] == '.') {
    const size_t start = ++end;
    while (end < t.size() && IsDigit(t[end])) ++end;
    fraction = t.substr(start, end - start);
    if (fraction.empty()) return not_a_size("a decimal point needs digits after it");
  }
  const absl::string_view unit = t.substr(end);
  const uint64_t scale = UnitScale(absl::AsciiStrToLower(unit));
  if (scale == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' has an unknown unit '", unit, "' (", kUnits, ")"));
  }

  // In 128 bits, so that no step can wrap before the final comparison.
  const absl::uint128 kMax = UINT64_MAX;
  auto too_large = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is too large: more than ", UINT64_MAX, " bytes"));
  };
  absl::uint128 value = 0;
  for (char c : whole) {
    value = value * 10 + (c - '0');
    if (value > kMax) return too_large();
  }
  value *= scale;
  if (value > kMax) return too_large();
  // Trailing zeros change nothing; more places than this are no one's byte size, and
  // fewer keep the arithmetic below within 128 bits.
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > 18) return not_a_size("it has more than 18 decimal places");
  absl::uint128 numerator = 0;
  absl::uint128 denominator = 1;
  for (char c : fraction) {
    numerator = numerator * 10 + (c - '0');
    denominator *= 10;
  }
  numerator *= scale;
  if (numerator % denominator != 0) return not_a_size("it is not a whole number of bytes");
  value += numerator / denominator;
  if (value > kMax) return too_large();
  return absl::Uint128Low64(value);
}

}  // namespace gpucompute

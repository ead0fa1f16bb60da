// Exit outcomes and argument parsing of the gpucompute CLI.
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cpp/npy.h"

namespace gpucompute::cli {
namespace {

int ServerExitCode(int code) {
  // A failure reported with code OK would otherwise exit 10 and look like success
  // to nobody; UNKNOWN is what it is.
  return kExitServerBase + (code == 0 ? static_cast<int>(absl::StatusCode::kUnknown) : code);
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

Outcome Outcome::Usage(std::string message) {
  return Outcome{kExitUsage, std::move(message), /*show_usage=*/true};
}

Outcome Outcome::Local(std::string_view what, const absl::Status& status) {
  return Outcome{kExitLocalError, absl::StrCat(ToAbsl(what), ": ", status.message()), false};
}

Outcome Outcome::Server(std::string_view what, const absl::Status& status) {
  const int code = static_cast<int>(status.code());
  const std::string request_id = RequestIdOf(status);
  return Outcome{
      ServerExitCode(code),
      absl::StrCat(ToAbsl(what), ": ", CodeName(code), ": ", status.message(),
                   request_id.empty() ? "" : absl::StrCat(" (request id ", request_id, ")")),
      false};
}

Outcome Outcome::OperationFailed(std::string_view what, const v1::Operation& operation) {
  return Outcome{ServerExitCode(operation.error_code()),
                 absl::StrCat(ToAbsl(what), ": operation ", operation.id(), " failed: ",
                              CodeName(operation.error_code()), ": ", operation.error_message()),
                 false};
}

absl::StatusOr<ParsedArgs> ParsedArgs::Parse(std::span<const std::string> args,
                                             std::span<const FlagSpec> flags) {
  ParsedArgs parsed;
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    // Only "--word" and the declared short aliases are flags, so that expressions
    // and numbers such as "-x*2" or "-1" stay positional.
    const bool long_flag = arg.size() > 2 && arg[0] == '-' && arg[1] == '-' &&
                           absl::ascii_isalpha(static_cast<unsigned char>(arg[2]));
    const bool short_flag =
        arg == "-h" || std::any_of(flags.begin(), flags.end(), [&](const FlagSpec& f) {
          return !f.alias.empty() && arg.substr(0, f.alias.size()) == f.alias &&
                 (arg.size() == f.alias.size() || arg[f.alias.size()] == '=');
        });
    if (flags_ended || (!long_flag && !short_flag)) {
      if (arg == "--" && !flags_ended) {
        flags_ended = true;
        continue;
      }
      parsed.positional_.push_back(arg);
      continue;
    }
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    if (name == "--help" || name == "-h") {
      parsed.help_ = true;
      continue;
    }
    const auto spec = std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& f) {
      return f.name == name || (!f.alias.empty() && f.alias == name);
    });
    if (spec == flags.end()) {
      for (std::string_view global :
           {"--server", "--client", "--json", "--stream", "--timeout", "--token", "--token-file",
            "--tls", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name", "--request-id"}) {
        if (name == global) {
          return absl::InvalidArgumentError(
              absl::StrCat("the global flag ", name, " goes before the command"));
        }
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    const std::string canonical(spec->name);
    std::string value;
    if (spec->takes_value) {
      if (equals != std::string::npos) {
        value = arg.substr(equals + 1);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(canonical, " needs a value"));
      }
    } else if (equals != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(canonical, " takes no value"));
    }
    if (parsed.Has(canonical)) {
      return absl::InvalidArgumentError(absl::StrCat(canonical, " is given twice"));
    }
    parsed.flags_.emplace_back(canonical, std::move(value));
  }
  return parsed;
}

bool ParsedArgs::Has(std::string_view flag) const {
  return std::any_of(flags_.begin(), flags_.end(),
                     [&](const auto& entry) { return entry.first == flag; });
}

std::optional<std::string> ParsedArgs::Value(std::string_view flag) const {
  for (const auto& [name, value] : flags_) {
    if (name == flag) return value;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<double>> ParsedArgs::Double(std::string_view flag) const {
  std::optional<std::string> text = Value(flag);
  if (!text.has_value()) return std::optional<double>();
  double value;
  if (!absl::SimpleAtod(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(flag), " needs a number, not '", *text, "'"));
  }
  return std::optional<double>(value);
}

absl::StatusOr<std::optional<int64_t>> ParsedArgs::Int(std::string_view flag) const {
  std::optional<std::string> text = Value(flag);
  if (!text.has_value()) return std::optional<int64_t>();
  int64_t value;
  if (!absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(flag), " needs an integer, not '", *text, "'"));
  }
  return std::optional<int64_t>(value);
}

absl::StatusOr<std::optional<uint64_t>> ParsedArgs::Uint(std::string_view flag) const {
  std::optional<std::string> text = Value(flag);
  if (!text.has_value()) return std::optional<uint64_t>();
  uint64_t value;
  // SimpleAtoi would wrap "-1" into a huge unsigned value.
  if (text->find('-') != std::string::npos || !absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(flag), " needs a non-negative integer, not '", *text, "'"));
  }
  return std::optional<uint64_t>(value);
}

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

// What the operation commands of the gpucompute CLI read and write: buffer references
// in the view syntax, NAME=VALUE bindings, outputs; and the requests of reduce and matmul.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cpp/view_syntax.h"

namespace gpucompute::cli {

Outcome UsageFrom(const absl::Status& status) {
  return Outcome::Usage(std::string(status.message()));
}

std::optional<Outcome> CheckPositional(const ParsedArgs& args, size_t min, size_t max) {
  const size_t count = args.positional().size();
  if (count < min) return Outcome::Usage("missing arguments");
  if (count > max) {
    return Outcome::Usage(absl::StrCat("unexpected argument '", args.positional()[max], "'"));
  }
  return std::nullopt;
}

absl::StatusOr<ArrayRef> ParseReference(std::string_view text) { return ParseArrayRef(text); }

Outcome BindOperands(const ParsedArgs& args, size_t first,
                     google::protobuf::Map<std::string, v1::Operand>* inputs) {
  for (size_t i = first; i < args.positional().size(); ++i) {
    const std::string& binding = args.positional()[i];
    const size_t equals = binding.find('=');
    if (equals == std::string::npos || equals == 0) {
      return Outcome::Usage(absl::StrCat("'", binding, "' is not NAME=VALUE"));
    }
    const std::string name = binding.substr(0, equals);
    const std::string value = binding.substr(equals + 1);
    if (inputs->contains(name)) {
      return Outcome::Usage(absl::StrCat("'", name, "' is bound twice"));
    }
    if (value.empty()) return Outcome::Usage(absl::StrCat("'", name, "' is bound to nothing"));
    if (std::optional<v1::Scalar> scalar = ParseScalar(value)) {
      *(*inputs)[name].mutable_scalar() = *scalar;
      continue;
    }
    absl::StatusOr<ArrayRef> ref = ParseReference(value);
    if (!ref.ok()) return UsageFrom(ref.status());
    (*inputs)[name] = BufferOperand(*ref);
  }
  return Outcome::Ok();
}

absl::StatusOr<v1::Output> OutputFromFlags(const ParsedArgs& args, std::string_view buffer_flag) {
  v1::Output output;
  std::optional<std::string> buffer = args.Value(buffer_flag);
  std::optional<std::string> name = args.Value("--name");
  std::optional<std::string> dtype = args.Value("--dtype");
  if (buffer.has_value() && name.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give ", ToAbsl(buffer_flag), " (an existing buffer) or --name (a new one), not both"));
  }
  if (buffer.has_value() && dtype.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype applies to new buffers; ", ToAbsl(buffer_flag), " keeps its dtype"));
  }
  if (buffer.has_value()) {
    absl::StatusOr<ArrayRef> ref = ParseReference(*buffer);
    if (!ref.ok()) return ref.status();
    output = ExistingOutput(*ref);
  }
  if (name.has_value()) output.set_name(*name);
  if (dtype.has_value()) {
    absl::StatusOr<v1::DType> parsed = ParseProtoDType(*dtype);
    if (!parsed.ok()) return parsed.status();
    output.set_dtype(*parsed);
  }
  return output;
}

namespace {

// --axis: one axis ("1", the request's `axis`), or a list ("0,2", "(0, 2)"; "()" or ""
// for none, the request's `axes`).
absl::Status ReadAxes(const ParsedArgs& args, v1::ReduceOp* op) {
  std::optional<std::string> text = args.Value("--axis");
  if (!text.has_value()) return absl::OkStatus();
  absl::string_view inner = absl::StripAsciiWhitespace(*text);
  const bool list = inner.empty() || inner.find(',') != absl::string_view::npos ||
                    inner.front() == '(' || inner.front() == '[';
  if (inner.size() >= 2 && ((inner.front() == '(' && inner.back() == ')') ||
                            (inner.front() == '[' && inner.back() == ']'))) {
    inner = absl::StripAsciiWhitespace(inner.substr(1, inner.size() - 2));
  }
  std::vector<absl::string_view> parts;
  if (!inner.empty()) parts = absl::StrSplit(inner, ',');
  // "1," is the one-axis list, as in Python.
  if (parts.size() > 1 && absl::StripAsciiWhitespace(parts.back()).empty()) parts.pop_back();
  std::vector<int32_t> axes;
  for (absl::string_view part : parts) {
    int32_t axis;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &axis)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--axis needs an axis or a comma-separated list of them, e.g. 0,2, not '", *text, "'"));
    }
    axes.push_back(axis);
  }
  if (list) {
    op->mutable_axes()->mutable_axes()->Add(axes.begin(), axes.end());
  } else {
    op->set_axis(axes.front());
  }
  return absl::OkStatus();
}

}  // namespace

Outcome BuildReduce(const ParsedArgs& args, v1::SubmitRequest* request) {
  if (auto usage = CheckPositional(args, 2, SIZE_MAX)) return *usage;
  static constexpr std::pair<std::string_view, v1::ReduceKind> kKinds[] = {
      {"sum", v1::REDUCE_KIND_SUM},       {"prod", v1::REDUCE_KIND_PROD},
      {"min", v1::REDUCE_KIND_MIN},       {"max", v1::REDUCE_KIND_MAX},
      {"mean", v1::REDUCE_KIND_MEAN},     {"norm2", v1::REDUCE_KIND_NORM2},
      {"argmin", v1::REDUCE_KIND_ARGMIN}, {"argmax", v1::REDUCE_KIND_ARGMAX},
      {"var", v1::REDUCE_KIND_VAR},       {"std", v1::REDUCE_KIND_STD},
      {"any", v1::REDUCE_KIND_ANY},       {"all", v1::REDUCE_KIND_ALL},
  };
  const std::string& kind_name = args.positional()[0];
  const auto kind = std::find_if(std::begin(kKinds), std::end(kKinds),
                                 [&](const auto& entry) { return entry.first == kind_name; });
  if (kind == std::end(kKinds)) {
    return Outcome::Usage(
        absl::StrCat("unknown reduction '", kind_name,
                     "' (sum prod min max mean norm2 argmin argmax var std any all)"));
  }
  absl::StatusOr<std::optional<double>> ddof = args.Double("--ddof");
  if (!ddof.ok()) return UsageFrom(ddof.status());
  if (ddof->has_value() && kind->second != v1::REDUCE_KIND_VAR &&
      kind->second != v1::REDUCE_KIND_STD) {
    return Outcome::Usage("--ddof applies to var and std only");
  }
  absl::StatusOr<v1::Output> output = OutputFromFlags(args, "--out");
  if (!output.ok()) return UsageFrom(output.status());
  v1::ReduceOp* op = request->mutable_reduce();
  op->set_kind(kind->second);
  if (absl::Status axes = ReadAxes(args, op); !axes.ok()) return UsageFrom(axes);
  op->set_keepdims(args.Has("--keepdims"));
  op->set_ddof(ddof->value_or(0.0));
  *op->mutable_output() = *std::move(output);
  const std::string& input = args.positional()[1];
  if (args.positional().size() > 2) {
    // KIND EXPR NAME=VALUE...: the values of an expression, as eval takes it.
    op->set_expression(input);
    return BindOperands(args, 2, op->mutable_inputs());
  }
  absl::StatusOr<ArrayRef> ref = ParseReference(input);
  if (!ref.ok()) return UsageFrom(ref.status());
  op->set_input(ref->buffer());
  *op->mutable_input_view() = ref->steps();
  return Outcome::Ok();
}

Outcome BuildMatmul(const ParsedArgs& args, v1::SubmitRequest* request) {
  if (auto usage = CheckPositional(args, 2, 2)) return *usage;
  absl::StatusOr<ArrayRef> a = ParseReference(args.positional()[0]);
  if (!a.ok()) return UsageFrom(a.status());
  absl::StatusOr<ArrayRef> b = ParseReference(args.positional()[1]);
  if (!b.ok()) return UsageFrom(b.status());
  absl::StatusOr<std::optional<double>> alpha = args.Double("--alpha");
  if (!alpha.ok()) return UsageFrom(alpha.status());
  absl::StatusOr<std::optional<double>> beta = args.Double("--beta");
  if (!beta.ok()) return UsageFrom(beta.status());
  if (beta->has_value() && !args.Has("--out")) {
    return Outcome::Usage("--beta scales an existing C: give it with --out");
  }
  absl::StatusOr<v1::Output> c = OutputFromFlags(args, "--out");
  if (!c.ok()) return UsageFrom(c.status());
  *request = Matmul(*a, *b, *std::move(c),
                    {.transpose_a = args.Has("--transpose-a"),
                     .transpose_b = args.Has("--transpose-b"),
                     .alpha = alpha->value_or(1.0),
                     .beta = beta->value_or(0.0),
                     .allow_tf32 = args.Has("--tf32")});
  return Outcome::Ok();
}

}  // namespace gpucompute::cli

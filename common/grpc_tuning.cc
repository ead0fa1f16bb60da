#include "common/grpc_tuning.h"

#include <grpc/grpc.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpucompute {

absl::StatusOr<GrpcIntArgs> ParseGrpcArgs(absl::string_view text) {
  GrpcIntArgs args;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    int value = 0;
    if (eq == 0 || eq == absl::string_view::npos ||
        !absl::SimpleAtoi(entry.substr(eq + 1), &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", entry, "' is not NAME=INTEGER (a gRPC channel argument)"));
    }
    args.emplace_back(std::string(entry.substr(0, eq)), value);
  }
  return args;
}

absl::StatusOr<GrpcIntArgs> GrpcArgsFromEnvironment() {
  const char* text = std::getenv(kGrpcArgsEnvironmentVariable);
  if (text == nullptr) return GrpcIntArgs{};
  absl::StatusOr<GrpcIntArgs> args = ParseGrpcArgs(text);
  if (!args.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kGrpcArgsEnvironmentVariable, ": ", args.status().message()));
  }
  return args;
}

void HoldGrpcUntilExit() { grpc_init(); }

}  // namespace gpucompute

// How a command of the gpucompute CLI ends: its exit code and the message for stderr.
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"

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

}  // namespace gpucompute::cli

// Pieces of the `gpucompute` command-line tool shared by its source files: exit
// outcomes (outcome.cc), the flag parser (flag_parser.cc, on CLI11), the reading of
// argument values (values.cc), output formatting (format.cc) and the subcommands
// (commands.cc, operands.cc, run.cc, bench.cc, tenant.cc), tied together by the command table in main.cc.
#ifndef GPUCOMPUTE_CLIENT_CLI_CLI_H_
#define GPUCOMPUTE_CLIENT_CLI_CLI_H_

#include <google/protobuf/map.h>
#include <google/protobuf/message.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/client.h"
#include "common/string_view.h"

namespace gpucompute::cli {

// ---------------------------------------------------------------------------
// Exit status

inline constexpr int kExitOk = 0;
inline constexpr int kExitLocalError = 1;
inline constexpr int kExitUsage = 2;
// Server errors exit with this plus the gRPC status code.
inline constexpr int kExitServerBase = 10;

// How a command ended: the exit code and, on failure, the message for stderr.
struct Outcome {
  int exit_code = kExitOk;
  // "<what>: <message>", printed after "gpucompute: ".
  std::string message;
  // Usage errors also print the command's usage.
  bool show_usage = false;

  static Outcome Ok() { return {}; }
  static Outcome Usage(std::string message);
  // A failure on this machine (files, .npy contents): exit 1.
  static Outcome Local(std::string_view what, const absl::Status& status);
  // An RPC error: exit 10 + its code.
  static Outcome Server(std::string_view what, const absl::Status& status);
  // A finished operation in state FAILED: exit 10 + its error_code.
  static Outcome OperationFailed(std::string_view what, const v1::Operation& operation);
};

// ---------------------------------------------------------------------------
// Flags

struct FlagSpec {
  // With the dashes: "--out".
  std::string_view name;
  // A short alias such as "-o", or empty.
  std::string_view alias;
  bool takes_value = true;
};

// A subcommand's arguments: positionals and flags ("--flag VALUE", "--flag=VALUE",
// switches), in any order. "--" ends the flags. A flag given twice is an error. Only
// "--" and a letter, or a declared short alias, starts a flag, so that expressions and
// numbers such as "-x*2" or "-1" are positionals.
class ParsedArgs {
 public:
  // Errors are usage messages. "--help" and "-h" are always accepted.
  static absl::StatusOr<ParsedArgs> Parse(std::span<const std::string> args,
                                          std::span<const FlagSpec> flags);
  // The global flags (--server, --json, ...: MainHelp), which come before the command:
  // positional() is the command and everything after it.
  static absl::StatusOr<ParsedArgs> ParseGlobal(std::span<const std::string> args);

  const std::vector<std::string>& positional() const { return positional_; }
  bool help() const { return help_; }
  bool Has(std::string_view flag) const;
  // The value of a value flag, when given.
  std::optional<std::string> Value(std::string_view flag) const;

  // Typed values of optional flags; errors name the flag.
  absl::StatusOr<std::optional<double>> Double(std::string_view flag) const;
  absl::StatusOr<std::optional<int64_t>> Int(std::string_view flag) const;
  absl::StatusOr<std::optional<uint64_t>> Uint(std::string_view flag) const;

 private:
  static absl::StatusOr<ParsedArgs> ParseWith(std::span<const std::string> args,
                                              std::span<const FlagSpec> flags, bool global);

  std::vector<std::string> positional_;
  std::vector<std::pair<std::string, std::string>> flags_;
  bool help_ = false;
};

// "1000,10" -> {1000, 10}; "" and "()" -> {} (a 0-dimensional array).
absl::StatusOr<std::vector<uint64_t>> ParseShape(std::string_view text);
// True/False -> bool, an integer -> int, another number -> float; nullopt otherwise.
std::optional<v1::Scalar> ParseScalar(std::string_view text);
absl::StatusOr<v1::DType> ParseProtoDType(std::string_view name);
absl::StatusOr<v1::Layout> ParseLayout(std::string_view text);

// ---------------------------------------------------------------------------
// Operands (operands.cc)

// A buffer reference in the view syntax (client/cpp/view_syntax.h): "x", "x[::2].T", ...
absl::StatusOr<ArrayRef> ParseReference(std::string_view text);
// Binds positionals[first...], each NAME=VALUE, into `inputs`: VALUE is a scalar when
// ParseScalar reads it, else a buffer reference in the view syntax. Errors are usage.
Outcome BindOperands(const ParsedArgs& args, size_t first,
                     google::protobuf::Map<std::string, v1::Operand>* inputs);
// Where an operation writes: an existing buffer or a view of one (`buffer_flag`, e.g.
// --out) or a new one (--name, --dtype).
absl::StatusOr<v1::Output> OutputFromFlags(const ParsedArgs& args, std::string_view buffer_flag);
// The usage error a status describes.
Outcome UsageFrom(const absl::Status& status);
// Nullopt when the number of positional arguments is within [min, max].
std::optional<Outcome> CheckPositional(const ParsedArgs& args, size_t min, size_t max);

// ---------------------------------------------------------------------------
// Output

std::string FormatBytes(uint64_t bytes);
std::string FormatMilliseconds(double seconds);
// A rate in units per second, with 3 significant digits or more.
std::string FormatRate(double value);
std::string FormatDType(v1::DType dtype);
// float64[1000,10]; float64[] for 0-d.
std::string FormatArrayType(v1::DType dtype, std::span<const uint64_t> shape);
// buf-... (name) float64[1000,10], plus " F" for column-major buffers.
std::string FormatBufferRef(const v1::BufferInfo& buffer);
// Shortest text that reads back as the same value; `dtype` chooses float32 rounding.
std::string FormatScalar(const v1::Scalar& scalar, v1::DType dtype = v1::DTYPE_FLOAT64);
std::string FormatOperationKind(v1::OperationKind kind);
std::string FormatOperationState(v1::Operation::State state);
// The one-line summary of an operation.
std::string FormatOperation(const v1::Operation& operation);
// Rows of cells as left-aligned columns separated by two spaces.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

// A message in the protobuf JSON mapping on one line, with the proto field names and
// every field present.
std::string ToJson(const google::protobuf::Message& message);
std::string JsonString(std::string_view text);

// A progress line on stderr for transfers over 8 MiB when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_bytes);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(uint64_t done_bytes);
  // Draws the final state and ends the line.
  void Finish();
  ProgressFn AsCallback();

 private:
  void Draw(uint64_t done_bytes);

  std::string label_;
  uint64_t total_bytes_;
  bool enabled_;
  bool drawn_ = false;
  int64_t start_nanos_;
  int64_t last_draw_nanos_ = 0;
};

// ---------------------------------------------------------------------------
// Commands

struct GlobalOptions {
  std::string server;
  std::string client_name;
  std::string request_id;
  bool json = false;
  std::string stream;
  std::optional<double> timeout_seconds;
  // --token / --token-file / $GPUCOMPUTE_TOKEN, and TLS (see ClientOptions).
  std::string token;
  // --tenant / $GPUCOMPUTE_TENANT: sent as gpucompute-tenant (ClientOptions::tenant).
  std::string tenant;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  bool tls = false;
};

// The connection the global flags describe.
ClientOptions ClientOptionsFor(const GlobalOptions& options);

// What every command works with: the global flags, the connection (made on first
// use) and stdout.
class CliContext {
 public:
  explicit CliContext(GlobalOptions options) : options_(std::move(options)) {}

  const GlobalOptions& options() const { return options_; }
  bool json() const { return options_.json; }
  absl::StatusOr<Client*> client();

  // Writes one line (or JSON object) to stdout.
  void Print(std::string_view line) const;

 private:
  GlobalOptions options_;
  std::unique_ptr<Client> client_;
};

using CommandFn = Outcome (*)(CliContext& context, const ParsedArgs& args);
// Builds the request of an operation command from its arguments; usage errors come back
// as the Outcome, success as Outcome::Ok().
using BuildRequestFn = Outcome (*)(const ParsedArgs& args, v1::SubmitRequest* request);

struct Command {
  std::string_view name;
  // Arguments after the name, for the usage line.
  std::string_view synopsis;
  std::string_view summary;
  // Flags and details, for `help COMMAND`.
  std::string details;
  std::vector<FlagSpec> flags;
  CommandFn run;
  // Operation commands only (eval, gemv, reduce, matmul, rand): the request alone, for
  // `run`.
  BuildRequestFn build = nullptr;
};

// The command named `name`, or null.
const Command* FindCommand(std::string_view name);

Outcome RunInfo(CliContext& context, const ParsedArgs& args);
Outcome RunStats(CliContext& context, const ParsedArgs& args);
Outcome RunTrim(CliContext& context, const ParsedArgs& args);
Outcome RunProfile(CliContext& context, const ParsedArgs& args);
Outcome RunList(CliContext& context, const ParsedArgs& args);
Outcome RunRemove(CliContext& context, const ParsedArgs& args);
Outcome RunCreate(CliContext& context, const ParsedArgs& args);
Outcome RunRenew(CliContext& context, const ParsedArgs& args);
Outcome RunPut(CliContext& context, const ParsedArgs& args);
Outcome RunGet(CliContext& context, const ParsedArgs& args);
Outcome RunEval(CliContext& context, const ParsedArgs& args);
Outcome RunGemv(CliContext& context, const ParsedArgs& args);
Outcome RunReduce(CliContext& context, const ParsedArgs& args);
Outcome RunMatmul(CliContext& context, const ParsedArgs& args);
Outcome RunRandom(CliContext& context, const ParsedArgs& args);
Outcome RunWait(CliContext& context, const ParsedArgs& args);
Outcome RunOperation(CliContext& context, const ParsedArgs& args);
Outcome RunStream(CliContext& context, const ParsedArgs& args);
Outcome RunFile(CliContext& context, const ParsedArgs& args);
Outcome RunBench(CliContext& context, const ParsedArgs& args);
Outcome RunTenant(CliContext& context, const ParsedArgs& args);

Outcome BuildEval(const ParsedArgs& args, v1::SubmitRequest* request);
Outcome BuildGemv(const ParsedArgs& args, v1::SubmitRequest* request);
Outcome BuildReduce(const ParsedArgs& args, v1::SubmitRequest* request);
Outcome BuildMatmul(const ParsedArgs& args, v1::SubmitRequest* request);
Outcome BuildRandom(const ParsedArgs& args, v1::SubmitRequest* request);

}  // namespace gpucompute::cli

#endif  // GPUCOMPUTE_CLIENT_CLI_CLI_H_

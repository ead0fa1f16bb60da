// gpucompute: the command-line client. Parses the global flags, finds the subcommand
// in the table below, and turns its Outcome into stderr text and an exit code.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cli/cli.h"
#include "common/grpc_tuning.h"
#include "common/transfer_memory.h"

namespace gpucompute::cli {
namespace {

constexpr std::string_view kDefaultServer = "127.0.0.1:50051";

constexpr FlagSpec ValueFlag(std::string_view name, std::string_view alias = "") {
  return FlagSpec{name, alias, /*takes_value=*/true};
}
constexpr FlagSpec SwitchFlag(std::string_view name) {
  return FlagSpec{name, "", /*takes_value=*/false};
}

constexpr FlagSpec kNoWait = SwitchFlag("--no-wait");
constexpr FlagSpec kOut = ValueFlag("--out");
constexpr FlagSpec kName = ValueFlag("--name");
constexpr FlagSpec kDType = ValueFlag("--dtype");

constexpr FlagSpec kTransport = ValueFlag("--transport");
constexpr FlagSpec kShmSegment = ValueFlag("--shm-segment");
constexpr absl::string_view kTransportDetails =
    "Transports: grpc streams the bytes over the connection; shm moves them through a\n"
    "POSIX shared-memory segment the server maps, for a server on this host started\n"
    "with --allow-shared-memory; auto takes shm when the server allows it and is on\n"
    "this host, else grpc. The JSON output says which was used (\"transport\") and\n"
    "how much shared memory it mapped (\"segment_bytes\").\n";

constexpr absl::string_view kOutputDetails =
    "  --out BUFFER   write into this existing buffer (id or name; eval: or a view)\n"
    "  --name NAME    name the new result buffer (default: unnamed)\n"
    "  --no-wait      print the operation id and return at once\n";

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"info", "", "server version, backend, devices, memory and limits", "", {}, RunInfo},
      {"stats",
       "",
       "operation counts, device time and traffic since the server started",
       "",
       {},
       RunStats},
      {"trim",
       "[--device N] [--keep BYTES]",
       "return unused device pool memory to the device",
       "Frees what the device memory pools hold beyond what buffers use, so that other\n"
       "programs can have it; buffers are not touched. Prints each pool afterwards.\n"
       "  --device N     trim this device's pool only (default: every device)\n"
       "  --keep BYTES   bytes each pool may keep beyond what buffers use (default 0)\n",
       {ValueFlag("--device"), ValueFlag("--keep")},
       RunTrim},
      {"profile",
       "start|stop",
       "start or stop the profiler's capture range",
       "For a server run under `nsys profile --capture-range=cudaProfilerApi`: only\n"
       "the work between 'profile start' and 'profile stop' is recorded. Backends\n"
       "without a profiler (the CPU backend) answer FAILED_PRECONDITION (exit 19).\n",
       {},
       RunProfile},
      {"ls", "", "list this client's buffers", "", {}, RunList},
      {"rm",
       "BUFFER...",
       "delete buffers (by id or name)",
       "Deletes each buffer; a failure does not stop the others (the exit code is the\n"
       "first failure's).\n",
       {},
       RunRemove},
      {"create",
       "--shape S [--dtype D] [--layout C|F] [--fill V] [--name N] [--device N]",
       "allocate a buffer",
       "  --shape S      sizes separated by commas, e.g. 1000,10; \"\" for a 0-d array\n"
       "  --dtype D      float32 float64 int32 int64 bool (default float64)\n"
       "  --layout C|F   row-major (default) or column-major\n"
       "  --fill V       set every element to V (a number, True or False); otherwise\n"
       "                 every element is zero\n"
       "  --name N       name the buffer\n"
       "  --device N     allocate on device N (default: the server's)\n"
       "  --ttl SECONDS  give the buffer a lease: unless used or renewed within\n"
       "                 SECONDS, the server reclaims it (default: no lease)\n",
       {ValueFlag("--shape"), ValueFlag("--dtype"), ValueFlag("--layout"), ValueFlag("--fill"),
        ValueFlag("--name"), ValueFlag("--device"), ValueFlag("--ttl")},
       RunCreate},
      {"renew",
       "BUFFER... [--ttl SECONDS]",
       "renew buffers' leases",
       "Renews each buffer's lease now, keeping its time-to-live, or setting it to\n"
       "--ttl SECONDS (0 ends the lease). Every use of a buffer renews it as well.\n",
       {ValueFlag("--ttl")},
       RunRenew},
      {"put",
       "FILE.npy [--name N] [--ttl SECONDS] [--into BUFFER [--offset BYTES]] [--transport T]"
       " [--shm-segment SIZE]",
       "upload a .npy file into a new buffer, or into part of an existing one",
       absl::StrCat(
       "The file is streamed: it is never loaded whole. Supported: '<f4' '<f8' '<i4'\n"
       "'<i8' '|b1', C or Fortran order (Fortran order makes an F-layout buffer).\n"
       "  --name N         name the new buffer\n"
       "  --ttl SECONDS    give the new buffer a lease (see create)\n"
       "  --into BUFFER    overwrite bytes of an existing buffer of the same dtype with\n"
       "                   the file's data, as stored\n"
       "  --offset BYTES   where in BUFFER the data goes (default 0)\n"
       "  --transport T    auto (default), grpc or shm; see below\n"
       "  --shm-segment SIZE  the most shared memory shm maps (default 16MiB, at least\n"
       "                   a page): a larger file moves through it in pieces\n"
       "Prints the buffer, its dtype and shape, the bytes and the transfer rate. A\n"
       "progress bar appears on stderr for transfers over 8 MiB when it is a terminal.\n",
       kTransportDetails),
       {ValueFlag("--name"), ValueFlag("--ttl"), ValueFlag("--into"), ValueFlag("--offset"),
        kTransport, kShmSegment},
       RunPut},
      {"get",
       "BUFFER -o FILE.npy [--transport T] [--shm-segment SIZE]",
       "download a buffer, or a view of one, into a .npy file",
       absl::StrCat(
       "Writes the buffer's dtype and shape, and Fortran order for F-layout buffers.\n"
       "BUFFER may be a view ('x[::2].T'; see 'gpucompute help'): the file then holds\n"
       "its elements in C order, in its shape, downloaded over grpc.\n"
       "A failed download removes the partial file.\n"
       "  -o, --output FILE   the file to write\n"
       "  --transport T       auto (default), grpc or shm; see below\n"
       "  --shm-segment SIZE  the most shared memory shm maps (default 16MiB, at least\n"
       "                      a page): a larger buffer moves through it in pieces\n",
       kTransportDetails),
       {ValueFlag("--output", "-o"), kTransport, kShmSegment},
       RunGet},
      {"eval",
       "EXPR [NAME=VALUE...] [--shape S] [--out BUFFER | --name N] [--dtype D] [--no-wait]",
       "evaluate an elementwise expression",
       absl::StrCat(
           "EXPR uses + - * / ** (power), comparisons, where(c, a, b) and functions such as\n"
           "sin exp log sqrt abs min max; every name in it is bound with NAME=VALUE. VALUE\n"
           "is a number (an integer if it parses as one, else a float), True or False (a\n"
           "scalar), or else a buffer id or name, or a view of one ('x[::2].T').\n"
           "Buffers of different shapes broadcast as in NumPy. index(k) is each element's\n"
           "coordinate along axis k of the result ('index(0)' --shape 5 is arange(5)).\n"
           "  --shape S      the result's shape, e.g. 3,4 (the buffers broadcast to it)\n"
           "  --dtype D      dtype of a new result (default: NumPy 2's promotion)\n",
           kOutputDetails),
       {kOut, kName, kDType, kNoWait, ValueFlag("--shape")},
       RunEval,
       BuildEval},
      {"gemv",
       "A X [--y BUFFER | --name N] [--transpose] [--alpha V] [--beta V] [--no-wait]",
       "y = alpha * op(A) * x + beta * y",
       "A and X are buffers or views of them ('A[:, 0:8]', 'v[::2]').\n"
       "  --y BUFFER     accumulate into this existing 1-D buffer (else a new one)\n"
       "  --name N       name the new y\n"
       "  --transpose    use A transposed\n"
       "  --alpha V      default 1\n"
       "  --beta V       default 0 (ignored for a new y)\n"
       "  --no-wait      print the operation id and return at once\n",
       {ValueFlag("--y"), kName, SwitchFlag("--transpose"), ValueFlag("--alpha"),
        ValueFlag("--beta"), kNoWait},
       RunGemv,
       BuildGemv},
      {"reduce",
       "KIND INPUT|EXPR NAME=VALUE... [--axis A] [--keepdims] [--ddof D]"
       " [--out BUFFER | --name N] [--dtype D] [--no-wait]",
       "reduce a buffer, a view or an expression over any axes",
       absl::StrCat(
           "KIND: sum prod min max mean norm2 argmin argmax var std any all.\n"
           "Reduces INPUT (a buffer or a view of one, 'x[:, ::2]'), or the values of an\n"
           "expression bound as eval binds it (reduce sum 'x*y' x=a y=b), in one pass.\n"
           "Over every axis, or over --axis. Results of up to the server's inline limit\n"
           "are printed as `value V` or `values [...]`.\n"
           "  --axis A       one axis (1, -1), or several: 0,2 (\"()\" reduces none)\n"
           "  --keepdims     keep the reduced axes with length 1\n"
           "  --ddof D       var and std divide by N - D (default 0)\n"
           "  --dtype D      dtype of a new result (default: NumPy's)\n",
           kOutputDetails),
       {ValueFlag("--axis"), SwitchFlag("--keepdims"), ValueFlag("--ddof"), kOut, kName, kDType,
        kNoWait},
       RunReduce,
       BuildReduce},
      {"matmul",
       "A B [--out C | --name N] [--transpose-a] [--transpose-b] [--alpha V] [--beta V]"
       " [--tf32] [--no-wait]",
       "C = alpha * op(A) @ op(B) + beta * C, as numpy.matmul",
       "A and B are float32 or float64 buffers or views of them ('A.T', 'B[0:64]'):\n"
       "2-D multiply as matrices, 3-D are batches over their first axis, 1-D are vectors.\n"
       "  --out C        accumulate into this existing buffer (else a new one)\n"
       "  --name N       name the new C\n"
       "  --transpose-a, --transpose-b   use A or B transposed in its last two axes\n"
       "  --alpha V      default 1\n"
       "  --beta V       default 0; needs --out\n"
       "  --tf32         float32 on CUDA: allow TF32 tensor cores (fewer mantissa bits)\n"
       "  --no-wait      print the operation id and return at once\n",
       {kOut, kName, SwitchFlag("--transpose-a"), SwitchFlag("--transpose-b"),
        ValueFlag("--alpha"), ValueFlag("--beta"), SwitchFlag("--tf32"), kNoWait},
       RunMatmul,
       BuildMatmul},
      {"rand",
       "uniform|normal|normal-v1|normal-v2|normal-v3|integers --shape S --dtype D [--seed N] "
       "[--offset N] [FLAGS]",
       "fill a buffer with counter-based random numbers (Philox4x32-10)",
       absl::StrCat("The same seed and offset give the same numbers on every backend and run; the\n"
                    "result's next_offset continues the sequence. `normal` uses the second\n"
                    "normal transform (NORMAL_TRANSFORM_V2, also `normal-v2`); `normal-v3`\n"
                    "the third (float32 by the inverse CDF, faster on GPUs; float64 as v2);\n"
                    "`normal-v1` gives the first one's numbers, as requests without a\n"
                    "transform get.\n"
                    "  --shape S      shape of a new buffer (not needed with --out)\n"
                    "  --dtype D      float32/float64 (uniform, normal) or int32/int64 (integers)\n"
                    "  --seed N, --offset N   Philox key and first counter (default 0)\n"
                    "  --mean M, --std S      normal's parameters (default 0 and 1)\n"
                    "  --low L, --high H      integers on [L, H)\n"
                    "  --layout C|F   layout of a new buffer\n",
                    kOutputDetails),
       {ValueFlag("--shape"), kDType, ValueFlag("--seed"), ValueFlag("--offset"),
        ValueFlag("--mean"), ValueFlag("--std"), ValueFlag("--low"), ValueFlag("--high"),
        ValueFlag("--layout"), kOut, kName, kNoWait},
       RunRandom,
       BuildRandom},
      {"run",
       "FILE",
       "run a file of operations through one session",
       "FILE (or - for stdin) holds one operation per line, written as the eval, gemv,\n"
       "reduce, matmul and rand commands take them (quotes group words; # starts a comment).\n"
       "All of them go to the server at once through one session and run in order of\n"
       "their dependencies; each completion is printed as it arrives, after its tag.\n"
       "A line's tag is its line number, or NAME when the line starts with @NAME. A\n"
       "later line uses an earlier line's result as the buffer tag:TAG, e.g.\n"
       "  @s reduce sum x\n"
       "  eval 'x / s' x=x s=tag:s --name y\n"
       "The new unnamed results are freed when the file is done; --name keeps one.\n"
       "The exit code is the first failure's (10 + its code), or 0. Lines are checked\n"
       "before anything is sent: a malformed line runs nothing (exit 2).\n",
       {},
       RunFile},
      {"wait",
       "OP_ID [--timeout S]",
       "wait for an operation and print it",
       "  --timeout S    give up after S seconds (default: no limit); the exit code is\n"
       "                 then 14 (DEADLINE_EXCEEDED)\n",
       {ValueFlag("--timeout")},
       RunWait},
      {"op", "OP_ID", "print an operation without waiting", "", {}, RunOperation},
      {"bench",
       "[--sizes LIST] [--repeat N] [--transport LIST] [--streams N] [--chunk-bytes BYTES]"
       " [--latency N]",
       "upload and download speed per transport and size, against the server's ceiling",
       "Uploads an array of each size into a new buffer and downloads it again, through\n"
       "each transport, and prints the GB/s of each way beside the copy ceiling the\n"
       "server measured at start (info: host-to-device and device-to-host), as a ratio.\n"
       "Each figure is the median wall time of --repeat calls after one warm-up, from\n"
       "this client's side. The bytes are checked; the buffers are deleted.\n"
       "  --sizes LIST        array sizes, e.g. 1MiB,64MiB,512MiB (multiples of 8 bytes;\n"
       "                      default 1MiB,64MiB,256MiB); K, M, G are powers of 1000,\n"
       "                      Ki, Mi, Gi (or KiB, MiB, GiB) powers of 1024\n"
       "  --repeat N          timed calls of each (default 3)\n"
       "  --transport LIST    all (default), or some of grpc (one stream), grpc-parallel\n"
       "                      (--streams connections), shm (shared memory: the client\n"
       "                      copies the array into its segment and out) and\n"
       "                      shm-inplace (the array already in the segment); all takes\n"
       "                      the shm ones when the server allows it and is on this host\n"
       "  --streams N         streams of grpc-parallel (default 8)\n"
       "  --chunk-bytes BYTES message size of the gRPC transfers, both ways (default 4MiB)\n"
       "  --latency N         also time N Submit(wait) calls of the smallest operation (x +\n"
       "                      1 on one element, in place) and print their p50 and p99\n",
       {ValueFlag("--sizes"), ValueFlag("--repeat"), ValueFlag("--transport"),
        ValueFlag("--streams"), ValueFlag("--chunk-bytes"), ValueFlag("--latency")},
       RunBench},
      {"tenant",
       "export DIR | import DIR [--replace]",
       "move this client's named buffers to another server through files",
       "export writes every named buffer of this client (this token's tenant, this\n"
       "--client name) into DIR, one file each in the format the server persists\n"
       "buffers in (--persist-dir), with their bytes as they are, and a MANIFEST last:\n"
       "an export that did not finish has none, and import refuses it. DIR must not\n"
       "hold an export already. Unnamed buffers are not exported.\n"
       "import creates each buffer of the export in DIR on the server, with its name,\n"
       "dtype, shape, layout and lease, and checks every file's CRC32C as it reads it.\n"
       "If a name exists on the server already, nothing is imported (exit 16,\n"
       "ALREADY_EXISTS) unless --replace, which deletes that buffer first. A failure\n"
       "part way deletes the buffers this import created; with --replace a name it\n"
       "deleted stays gone, so run the import again.\n"
       "Both stream one chunk at a time, over grpc. Buffer ids change: a buffer keeps\n"
       "its name, not its id.\n"
       "  --replace      import: replace buffers of the same names\n",
       {SwitchFlag("--replace")},
       RunTenant},
      {"stream",
       "create [--device N] | rm ID... | sync [ID] [--timeout S] | ls",
       "manage streams",
       "Operations on one stream run in order; different streams may overlap.\n"
       "  create         create a stream and print its id (use it with --stream)\n"
       "  rm ID...       delete streams once their work is done\n"
       "  sync [ID]      wait until the stream (default: --stream, else the default\n"
       "                 stream) is idle; exit 14 if --timeout S passes first\n"
       "  ls             list this client's streams\n",
       {ValueFlag("--device"), ValueFlag("--timeout")},
       RunStream},
  };
  return *commands;
}


std::string UsageLine(const Command& command) {
  return absl::StrCat("usage: gpucompute [GLOBAL FLAGS] ", ToAbsl(command.name),
                      command.synopsis.empty() ? "" : " ", ToAbsl(command.synopsis));
}

std::string CommandHelp(const Command& command) {
  std::string text = absl::StrCat(UsageLine(command), "\n\n", ToAbsl(command.summary), ".\n");
  if (!command.details.empty()) absl::StrAppend(&text, "\n", ToAbsl(command.details));
  absl::StrAppend(&text, "\nRun 'gpucompute help' for the global flags and exit codes.\n");
  return text;
}

std::string MainHelp() {
  std::string text =
      "gpucompute: command-line client of a gpucompute server, which keeps arrays\n"
      "(buffers) in device memory and runs operations on them.\n"
      "\n"
      "usage: gpucompute [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
      "\n"
      "Global flags (before the command):\n"
      "  --server HOST:PORT  server address (default $GPUCOMPUTE_SERVER, else\n"
      "                      127.0.0.1:50051)\n"
      "  --client NAME       client name sent with every call (default\n"
      "                      $GPUCOMPUTE_CLIENT); buffer names, the default stream and\n"
      "                      listings are per client\n"
      "  --request-id ID     request id sent with every call (else the server makes\n"
      "                      one per call); errors from the server show the call's id\n"
      "  --json              print one JSON object per command on stdout (the protobuf\n"
      "                      JSON mapping with proto field names; 64-bit integers are\n"
      "                      strings)\n"
      "  --stream ID         stream for submitted operations (default: the client's\n"
      "                      default stream)\n"
      "  --timeout SECONDS   deadline of each call (uploads and downloads excepted);\n"
      "                      an operation still running then is printed, exit 14\n"
      "  --token TOKEN       bearer token sent with every call (default\n"
      "                      $GPUCOMPUTE_TOKEN); it names your tenant\n"
      "  --token-file PATH   read the token from the first line of PATH\n"
      "  --tenant NAME       tenant sent with every call (default $GPUCOMPUTE_TENANT),\n"
      "                      for a proxy that routes tenants to replicas; it must be\n"
      "                      the one the token names. A replica that does not serve it\n"
      "                      names the one that does, and the client goes there once\n"
      "                      and stays\n"
      "  --tls               connect with TLS, verifying the server with the system's CAs\n"
      "  --tls-ca PATH       connect with TLS, verifying the server with this PEM CA\n"
      "  --tls-cert PATH     client certificate (PEM) for mutual TLS, with --tls-key\n"
      "  --tls-key PATH      the client certificate's PEM private key\n"
      "  --tls-server-name NAME  name the server's certificate must carry (default:\n"
      "                      the host of --server)\n"
      "\n"
      "Commands:\n";
  size_t width = 0;
  for (const Command& command : Commands()) width = std::max(width, command.name.size());
  for (const Command& command : Commands()) {
    absl::StrAppend(&text, "  ", ToAbsl(command.name),
                    std::string(width + 2 - command.name.size(), ' '), ToAbsl(command.summary),
                    "\n");
  }
  absl::StrAppend(
      &text, "  help", std::string(width - 2, ' '),
      "this text, or 'help COMMAND' for one command\n",
      "\n"
      "Buffers are named by id (buf-...) or by the name given when they were made.\n"
      "Where a command reads a buffer, a view of it may stand instead, in NumPy's\n"
      "syntax (quote it for the shell): x[0:10, ::2]  x[-1]  x[..., None]  x.T\n"
      "x.transpose(1, 0, 2)  x.reshape(2, -1)  x.squeeze()  x.expand_dims(0)\n"
      "x.broadcast_to(4, 3), chained in any order ('x[0:10, ::2].T'). A view is\n"
      "not a copy and costs no memory.\n"
      "Operations wait for their result unless --no-wait is given, and print one line:\n"
      "  ID KIND  STATE  device T  queued T  read B  wrote B  R GB/s  [R GFLOP/s]\n"
      "  [-> OUTPUT BUFFERS]  [value V | values [...]]  [next_offset N]\n"
      "or, for a failed operation, ID KIND  failed  error CODE: MESSAGE.\n"
      "\n"
      "Exit status:\n"
      "  0        success\n"
      "  1        local error: file I/O, a malformed or unsupported .npy file\n"
      "  2        usage error (the message and the usage go to stderr)\n"
      "  10+CODE  the server answered with gRPC status CODE: 13 INVALID_ARGUMENT,\n"
      "           15 NOT_FOUND, 16 ALREADY_EXISTS, 18 RESOURCE_EXHAUSTED,\n"
      "           19 FAILED_PRECONDITION, 21 OUT_OF_RANGE, 24 UNAVAILABLE (no server)\n"
      "  10+CODE  an operation finished FAILED with error_code CODE\n"
      "  14       wait or stream sync: still busy at --timeout (DEADLINE_EXCEEDED)\n"
      "Errors go to stderr as 'gpucompute: WHAT: MESSAGE'.\n"
      "\n"
      "'gpucompute help COMMAND' or 'gpucompute COMMAND --help' describes a command.\n");
  return text;
}

void PrintError(std::string_view message) {
  std::fprintf(stderr, "gpucompute: %.*s\n", static_cast<int>(message.size()), message.data());
}

// Exit code 2 with the message and, when known, the command's usage.
int UsageError(std::string_view message, const Command* command) {
  PrintError(command == nullptr ? std::string(message)
                                : absl::StrCat(ToAbsl(command->name), ": ", ToAbsl(message)));
  if (command != nullptr) {
    std::fprintf(stderr, "%s\nRun 'gpucompute help %.*s' for details.\n",
                 UsageLine(*command).c_str(), static_cast<int>(command->name.size()),
                 command->name.data());
  } else {
    std::fprintf(stderr, "Run 'gpucompute help' for usage.\n");
  }
  return kExitUsage;
}

int Help(const std::vector<std::string>& topics) {
  if (topics.empty()) {
    std::fputs(MainHelp().c_str(), stdout);
    return kExitOk;
  }
  const Command* command = FindCommand(topics[0]);
  if (command == nullptr || topics.size() > 1) {
    return UsageError(absl::StrCat("help: unknown command '", topics[0], "'"), nullptr);
  }
  std::fputs(CommandHelp(*command).c_str(), stdout);
  return kExitOk;
}

std::string EnvOr(const char* name, std::string_view fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : std::string(fallback);
}

// The first line of `path`, without surrounding white space.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file: cannot read ", path));
  }
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("--token-file: ", path, " is empty"));
  return token;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  GlobalOptions options;
  options.server = EnvOr("GPUCOMPUTE_SERVER", kDefaultServer);
  options.client_name = EnvOr("GPUCOMPUTE_CLIENT", "");
  options.token = EnvOr("GPUCOMPUTE_TOKEN", "");
  options.tenant = EnvOr("GPUCOMPUTE_TENANT", "");

  // Global flags come before the command.
  absl::StatusOr<ParsedArgs> global = ParsedArgs::ParseGlobal(args);
  if (!global.ok()) return UsageError(std::string(global.status().message()), nullptr);
  if (global->help()) return Help({});
  options.json = global->Has("--json");
  options.tls = global->Has("--tls");
  static constexpr std::pair<std::string_view, std::string GlobalOptions::*> kStringFlags[] = {
      {"--client", &GlobalOptions::client_name},
      {"--stream", &GlobalOptions::stream},
      {"--token", &GlobalOptions::token},
      {"--tenant", &GlobalOptions::tenant},
      {"--tls-ca", &GlobalOptions::tls_ca_file},
      {"--tls-cert", &GlobalOptions::tls_cert_file},
      {"--tls-key", &GlobalOptions::tls_key_file},
      {"--tls-server-name", &GlobalOptions::tls_server_name},
      {"--request-id", &GlobalOptions::request_id},
  };
  for (const auto& [flag, field] : kStringFlags) {
    if (std::optional<std::string> value = global->Value(flag)) options.*field = *value;
  }
  if (std::optional<std::string> server = global->Value("--server")) {
    if (server->empty()) return UsageError("--server needs HOST:PORT", nullptr);
    options.server = *server;
  }
  if (std::optional<std::string> path = global->Value("--token-file")) {
    absl::StatusOr<std::string> token = ReadTokenFile(*path);
    if (!token.ok()) return UsageError(std::string(token.status().message()), nullptr);
    options.token = *std::move(token);
  }
  if (std::optional<std::string> timeout = global->Value("--timeout")) {
    double seconds;
    if (!absl::SimpleAtod(*timeout, &seconds) || !(seconds > 0)) {
      return UsageError(
          absl::StrCat("--timeout needs a positive number of seconds, not '", *timeout, "'"),
          nullptr);
    }
    options.timeout_seconds = seconds;
  }
  const std::vector<std::string>& command_args = global->positional();
  if (command_args.empty()) return UsageError("missing command", nullptr);

  const std::string& name = command_args[0];
  const std::span<const std::string> rest(command_args.data() + 1, command_args.size() - 1);
  if (name == "help") return Help({rest.begin(), rest.end()});
  const Command* command = FindCommand(name);
  if (command == nullptr) return UsageError(absl::StrCat("unknown command '", name, "'"), nullptr);

  absl::StatusOr<ParsedArgs> parsed = ParsedArgs::Parse(rest, command->flags);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()), command);
  if (parsed->help()) {
    std::fputs(CommandHelp(*command).c_str(), stdout);
    return kExitOk;
  }

  CliContext context(std::move(options));
  const Outcome outcome = command->run(context, *parsed);
  if (outcome.exit_code == kExitOk) return kExitOk;
  if (outcome.show_usage) return UsageError(outcome.message, command);
  PrintError(outcome.message);
  return outcome.exit_code;
}

}  // namespace

const Command* FindCommand(std::string_view name) {
  for (const Command& command : Commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

}  // namespace gpucompute::cli

int main(int argc, char** argv) {
  gpucompute::RetainTransferMemory();
  gpucompute::HoldGrpcUntilExit();
  // As the server does (server/main.cc): the client library's locks are absl::Mutex too.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return gpucompute::cli::Main(argc, argv);
}

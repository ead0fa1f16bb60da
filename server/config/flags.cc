#include "server/config/flags.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "gpucompute/v1/limits.h"

namespace gpucompute {
namespace {

// Flag value types whose parsing says what a malformed value should look like.

struct ByteSize {
  uint64_t bytes = 0;
};

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return absl::StrCat(size.bytes); }

// A byte size, or "keep" (also "max") for no limit.
struct ReleaseThreshold {
  uint64_t bytes = UINT64_MAX;
};

bool AbslParseFlag(absl::string_view text, ReleaseThreshold* threshold, std::string* error) {
  if (text == "keep" || text == "max") {
    threshold->bytes = UINT64_MAX;
    return true;
  }
  ByteSize size;
  if (!AbslParseFlag(text, &size, error)) {
    absl::StrAppend(error, " (or 'keep')");
    return false;
  }
  threshold->bytes = size.bytes;
  return true;
}

std::string AbslUnparseFlag(ReleaseThreshold threshold) {
  return threshold.bytes == UINT64_MAX ? "keep" : absl::StrCat(threshold.bytes);
}

// A non-negative number of seconds, possibly fractional.
struct Seconds {
  double value = 0;
};

bool AbslParseFlag(absl::string_view text, Seconds* s, std::string* error) {
  if (!absl::SimpleAtod(text, &s->value) || !(s->value >= 0)) {
    *error = "needs a non-negative number of seconds";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(Seconds s) { return absl::StrCat(s.value); }

struct NonNegative {
  int value = 0;
};

bool AbslParseFlag(absl::string_view text, NonNegative* n, std::string* error) {
  if (!absl::SimpleAtoi(text, &n->value) || n->value < 0) {
    *error = "needs a non-negative integer";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(NonNegative n) { return absl::StrCat(n.value); }

// A fraction in (0, 1].
struct Fraction {
  double value = 1;
};

bool AbslParseFlag(absl::string_view text, Fraction* f, std::string* error) {
  if (!absl::SimpleAtod(text, &f->value) || !(f->value > 0 && f->value <= 1)) {
    *error = "needs a fraction greater than 0 and at most 1";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(Fraction f) { return absl::StrCat(f.value); }

// A count that may exceed an int.
struct Count {
  uint64_t value = 0;
};

bool AbslParseFlag(absl::string_view text, Count* n, std::string* error) {
  if (!absl::SimpleAtoi(text, &n->value)) {
    *error = "needs a non-negative integer";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(Count n) { return absl::StrCat(n.value); }

// A directory that may be left to the backend's default ("default"), or disabled ("" or
// "none").
struct CacheDir {
  std::optional<std::string> path;
};

bool AbslParseFlag(absl::string_view text, CacheDir* dir, std::string*) {
  if (text == "default") {
    dir->path.reset();
  } else {
    dir->path = text == "none" ? std::string() : std::string(text);
  }
  return true;
}

std::string AbslUnparseFlag(const CacheDir& dir) {
  if (!dir.path.has_value()) return "default";
  return dir.path->empty() ? "none" : *dir.path;
}

}  // namespace

// In the namespace of LogFormat, where the flag library looks for them.
bool AbslParseFlag(absl::string_view text, LogFormat* format, std::string* error) {
  if (text == "json") {
    *format = LogFormat::kJson;
  } else if (text == "text") {
    *format = LogFormat::kText;
  } else {
    *error = "needs json or text";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

}  // namespace gpucompute

ABSL_FLAG(std::string, backend, "auto", "compute backend; auto takes CUDA when a GPU is present");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "address to listen on");
ABSL_FLAG(gpucompute::ByteSize, memory_limit, {},
          "bytes buffers may hold in all, e.g. 8GiB, 512MiB; 0 picks a default: half of the "
          "memory for the CPU, each GPU's memory less max(5%, 256MiB) for CUDA");
ABSL_FLAG(gpucompute::NonNegative, cpu_threads, {},
          "CPU backend worker threads; 0 is one per hardware thread");
ABSL_FLAG(bool, allow_shared_memory, false,
          "let clients register POSIX shared-memory regions and copy between them and "
          "buffers (SharedMemoryService); only for trusted clients on this host");
ABSL_FLAG(bool, allow_cuda_ipc, false,
          "let clients export buffers as CUDA IPC handles and register their own device "
          "memory as regions (CUDA backend); only for trusted clients on this host");
ABSL_FLAG(gpucompute::Seconds, region_idle_timeout, {600},
          "release a shared-memory region or export unused this long, in seconds; 0 never "
          "does");
ABSL_FLAG(gpucompute::NonNegative, max_streams, {1024},
          "streams of all clients together, default streams included; idle default streams "
          "are reclaimed to make room (on the CPU backend each stream is a thread)");
ABSL_FLAG(gpucompute::NonNegative, graph_min_ops, {4},
          "CUDA: record a run of at least this many kernel-only operations launched "
          "together on a stream (a chain's steps, a session message's operations) and "
          "launch it as one CUDA graph; 0 never does");
ABSL_FLAG(std::optional<absl::Duration>, lane_spin, std::nullopt,
          "how long the thread that plans and launches Submit's operations and chains spins "
          "after each, kept warm for the next call (e.g. 500us, 2ms); 0 runs them on the "
          "calls' own threads; default: 2ms with at least 8 CPUs, else 0");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "on SIGTERM, how long calls and operations in flight get to finish (e.g. 10s, "
          "500ms); then calls are cancelled, queued operations fail and running CPU ones "
          "stop. It exits within this + the device work already launched (CUDA) + the "
          "time to write the named buffers (--persist-dir)");
ABSL_FLAG(gpucompute::NonNegative, default_device, {},
          "device for buffers and streams whose request names none");
ABSL_FLAG(gpucompute::ByteSize, pool_initial, {},
          "CUDA: bytes each device's memory pool reserves at start");
ABSL_FLAG(gpucompute::ReleaseThreshold, pool_release_threshold, {},
          "CUDA: bytes each pool keeps reserved when memory is freed; keep keeps "
          "everything, 0 returns freed memory to the device");
ABSL_FLAG(gpucompute::CacheDir, kernel_cache_dir, {},
          "CUDA: where compiled kernels are cached across restarts; \"\" or none disables "
          "the cache; the default is $GPUCOMPUTE_KERNEL_CACHE, else "
          "$XDG_CACHE_HOME/gpucompute/kernels, else ~/.cache/gpucompute/kernels");
ABSL_FLAG(std::string, cuda_module, "",
          "the CUDA backend module, opened only to run on CUDA; the default is "
          "$GPUCOMPUTE_CUDA_MODULE, else libgpucompute_cuda_backend.so beside this program, "
          "else the one of the build tree that built it");
ABSL_FLAG(gpucompute::Seconds, default_result_ttl, {},
          "lease in seconds of an unnamed operation result that asks for none: unless used "
          "or renewed, it is reclaimed this long after it was last used; 0 gives none; at "
          "most 2592000 (30 days)");
ABSL_FLAG(std::string, persist_dir, "",
          "write every named buffer to this directory at shutdown (after in-flight work) "
          "and restore them at start; empty persists nothing");
ABSL_FLAG(std::string, unauthenticated_tenant, "",
          "with --persist-dir and authentication: restore the buffers persisted without "
          "authentication into this tenant; empty leaves them to an admin, as tenant "
          "'(unauthenticated)'");
ABSL_FLAG(absl::Duration, snapshot_interval, absl::ZeroDuration(),
          "with --persist-dir, also write the named buffers this often (e.g. 5m); 0 only "
          "at shutdown");
ABSL_FLAG(gpucompute::Seconds, upload_idle_timeout, {60},
          "seconds an Upload may receive no chunk before it fails (DEADLINE_EXCEEDED) and its "
          "memory is released; 0 waits forever");
ABSL_FLAG(gpucompute::NonNegative, max_calls_per_tenant, {1024},
          "calls one tenant may have in flight (streams and calls that wait included); "
          "without authentication the server is one tenant; 0 is no bound");
ABSL_FLAG(gpucompute::NonNegative, max_uploads_per_tenant, {64},
          "uploads one tenant may have under way, each holding memory reserved from its "
          "header on; 0 is no bound");
ABSL_FLAG(gpucompute::Fraction, max_reserved_fraction_per_tenant, {0.5},
          "with authentication, the fraction of the memory limit that one tenant's uploads "
          "under way may reserve together, so that others can still allocate; 1 is no bound");
ABSL_FLAG(gpucompute::ByteSize, max_message_bytes, {gpucompute::kMaxMessageBytes},
          "largest gRPC message either way, from 4160KiB (the clients' default 4MiB chunks and "
          "their framing) to 64MiB; upload and download chunks stay 64KiB below it "
          "(Limits.max_chunk_bytes), and clients that choose larger chunks must stay there");
ABSL_FLAG(gpucompute::NonNegative, max_dimensions, {gpucompute::kMaxDimensions},
          "dimensions of a buffer a request creates, 1 to 8");
ABSL_FLAG(gpucompute::Count, max_elements, {gpucompute::kDefaultMaxElements},
          "elements of a buffer a request creates (an empty array: of its non-empty "
          "dimensions), 1 to 2^48; the default 2^40 is more than any device holds");
ABSL_FLAG(gpucompute::ByteSize, max_expression_bytes, {gpucompute::kMaxExpressionBytes},
          "bytes of an elementwise expression, 1 to 64KiB");
ABSL_FLAG(gpucompute::NonNegative, max_expression_depth, {gpucompute::expr::kMaxNestingDepth},
          "nesting levels of an elementwise expression (each parenthesis, call, unary "
          "operator and ** exponent is one), 1 to 256");
ABSL_FLAG(gpucompute::LogFormat, log_format, gpucompute::LogFormat::kJson,
          "log lines on stderr: json (one object per line) or text");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics on http://HOST:PORT/metrics; empty serves none");
ABSL_FLAG(std::string, tls_cert, "",
          "serve TLS with this PEM certificate chain (with --tls-key); empty serves plaintext");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "require client certificates that this PEM CA verifies (mutual TLS); a "
          "certificate's common name names its tenant when the call carries no token");
ABSL_FLAG(std::string, tokens_file, "",
          "bearer tokens, one 'TOKEN TENANT [admin]' a line, # comments; calls must send "
          "'authorization: Bearer TOKEN'; re-read on SIGHUP");
ABSL_FLAG(std::string, quota_file, "",
          "per-tenant quotas: lines 'default KEY=VALUE...' and 'tenant NAME KEY=VALUE...' "
          "with keys device_bytes, buffers, streams, operations; 0 or absent is none; "
          "re-read on SIGHUP");
ABSL_FLAG(std::string, replica_name, "",
          "this server's name in --placement-file: it serves the tenants whose rows name it "
          "and refuses the others' calls (FAILED_PRECONDITION naming their replica)");
ABSL_FLAG(std::string, placement_file, "",
          "with --replica-name: the placement table, one 'TENANT REPLICA' a line, # comments "
          "(the map file the proxy routes on); re-read on SIGHUP");
ABSL_FLAG(std::string, replica_addresses, "",
          "NAME=HOST:PORT,... where the other replicas listen, sent to a client that called "
          "the wrong one");
ABSL_FLAG(std::string, replica_address_template, "",
          "HOST:PORT of a replica --replica-addresses does not list, {replica} standing for "
          "its name, e.g. {replica}.gpucompute-replicas.gpucompute.svc.cluster.local:50051");
ABSL_FLAG(bool, allow_insecure_remote, false,
          "listen on a non-loopback address without authentication (no --tokens-file, no "
          "--tls-client-ca): anyone who reaches the port can use every buffer");

namespace gpucompute {
namespace {

// The flags in the order the usage lists them, each with what its value looks like.
struct FlagDoc {
  const char* name;
  const char* value;
  bool help_tells_default = false;  // its help says what the default is
};
constexpr FlagDoc kFlagDocs[] = {
    {"backend", "auto|cpu|cuda"},
    {"listen", "HOST:PORT"},
    {"memory_limit", "SIZE"},
    {"cpu_threads", "N"},
    {"max_streams", "N"},
    {"graph_min_ops", "N"},
    {"shutdown_grace", "DURATION"},
    {"lane_spin", "DURATION", true},
    {"default_device", "N"},
    {"pool_initial", "SIZE"},
    {"pool_release_threshold", "SIZE|keep"},
    {"kernel_cache_dir", "DIR", true},
    {"cuda_module", "PATH", true},
    {"metrics_listen", "HOST:PORT"},
    {"allow_shared_memory", "true|false"},
    {"allow_cuda_ipc", "true|false"},
    {"region_idle_timeout", "SECONDS"},
    {"default_result_ttl", "SECONDS"},
    {"persist_dir", "DIR"},
    {"snapshot_interval", "DURATION"},
    {"unauthenticated_tenant", "NAME"},
    {"tls_cert", "PATH"},
    {"tls_key", "PATH"},
    {"tls_client_ca", "PATH"},
    {"tokens_file", "PATH"},
    {"allow_insecure_remote", "true|false"},
    {"quota_file", "PATH"},
    {"replica_name", "NAME"},
    {"placement_file", "PATH"},
    {"replica_addresses", "NAME=HOST:PORT,..."},
    {"replica_address_template", "HOST:PORT"},
    {"upload_idle_timeout", "SECONDS"},
    {"max_calls_per_tenant", "N"},
    {"max_uploads_per_tenant", "N"},
    {"max_reserved_fraction_per_tenant", "FRACTION"},
    {"max_message_bytes", "SIZE"},
    {"max_dimensions", "N"},
    {"max_elements", "N"},
    {"max_expression_bytes", "SIZE"},
    {"max_expression_depth", "N"},
    {"log_format", "json|text"},
};

// Command lines spell flags with dashes, Abseil names them with underscores; both are
// taken.
std::string FlagName(absl::string_view spelled) {
  std::string name(spelled);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

std::string Spelled(absl::string_view name) {
  std::string spelled(name);
  for (char& c : spelled) {
    if (c == '_') c = '-';
  }
  return spelled;
}

// Appends `text` to `out` wrapped at 80 columns, each line indented by `indent`.
void AppendWrapped(absl::string_view text, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  size_t column = indent;
  absl::StrAppend(out, pad);
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > 80) {
      absl::StrAppend(out, "\n", pad);
      column = indent;
      first = true;
    }
    if (!first) {
      out->push_back(' ');
      ++column;
    }
    absl::StrAppend(out, word);
    column += word.size();
    first = false;
  }
  out->push_back('\n');
}

std::string Usage() {
  std::string usage =
      "usage: gpucompute-server [flags]\n\n"
      "Serves gpucompute.v1: arrays resident in device memory, asynchronous kernels\n"
      "on them.\n\n"
      "A SIZE is a number of bytes, with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti\n"
      "(powers of 1024), B optional: 1G is 10^9 bytes, 1Gi and 1GiB are 2^30.\n\n";
  for (const FlagDoc& doc : kFlagDocs) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(doc.name);
    absl::StrAppend(&usage, "  --", Spelled(doc.name), "=", doc.value, "\n");
    std::string help = flag->Help();
    if (!doc.help_tells_default) {
      const std::string default_value = flag->DefaultValue();
      absl::StrAppend(&help, " (default ", default_value.empty() ? "none" : default_value, ")");
    }
    AppendWrapped(help, 6, &usage);
  }
  absl::StrAppend(&usage,
                  "  --flagfile=PATH\n"
                  "      read flags from PATH, one per line; lines starting with # are "
                  "comments\n"
                  "  --help\n"
                  "      print this text\n\n"
                  "SIGTERM or SIGINT stops the server (exit status 0), also while it starts.\n"
                  "SIGHUP re-reads --tokens-file, --quota-file and --placement-file (a malformed\n"
                  "file keeps what it configured in use).\n");
  return usage;
}

class CommandLineParser {
 public:
  // Sets the flag named in `arg` ("--name=value", "--name", "--noname"), taking its
  // value from `next` when `arg` has none and the flag is not a boolean; `used_next`
  // says whether it did. Returns an error message, empty on success.
  std::string Apply(absl::string_view arg, const std::string* next, bool* used_next) {
    *used_next = false;
    absl::string_view body = arg;
    if (!absl::ConsumePrefix(&body, "--") && !absl::ConsumePrefix(&body, "-")) {
      return absl::StrCat("unexpected argument '", arg, "'");
    }
    const size_t eq = body.find('=');
    const std::string name = FlagName(body.substr(0, eq));
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) value = std::string(body.substr(eq + 1));

    if (name == "flagfile") {
      if (!value.has_value()) {
        if (next == nullptr) return "--flagfile needs a value";
        value = *next;
        *used_next = true;
      }
      return ReadFlagfile(*value);
    }
    absl::CommandLineFlag* flag = Find(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = Find(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && !value.has_value()) {
        flag = negated;
        value = "false";
      }
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", Spelled(name));
    if (!value.has_value()) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (next != nullptr) {
        value = *next;
        *used_next = true;
      } else {
        return absl::StrCat("--", Spelled(name), " needs a value");
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      // Abseil says "Illegal value 'V' specified for flag 'F'; REASON": the reason is ours.
      if (const size_t reason = error.find("; "); reason != std::string::npos) {
        error.erase(0, reason + 2);
      }
      return absl::StrCat("--", Spelled(name), ": ", error);
    }
    return "";
  }

  std::string ApplyAll(const std::vector<std::string>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
      bool used_next = false;
      const std::string* next = i + 1 < args.size() ? &args[i + 1] : nullptr;
      if (std::string error = Apply(args[i], next, &used_next); !error.empty()) return error;
      if (used_next) ++i;
    }
    return "";
  }

 private:
  static absl::CommandLineFlag* Find(const std::string& name) {
    for (const FlagDoc& doc : kFlagDocs) {
      if (name == doc.name) return absl::FindCommandLineFlag(name);
    }
    return nullptr;  // flags of linked libraries are not the server's
  }

  std::string ReadFlagfile(const std::string& path) {
    // A flagfile naming itself, directly or not, would never end.
    if (++flagfile_depth_ > 16) return absl::StrCat("--flagfile: ", path, " nests too deeply");
    std::ifstream in(path);
    if (!in) return absl::StrCat("--flagfile: cannot read ", path);
    std::vector<std::string> args;
    std::string line;
    while (std::getline(in, line)) {
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (text.empty() || text[0] == '#') continue;
      args.emplace_back(text);
    }
    std::string error = ApplyAll(args);
    --flagfile_depth_;
    return error.empty() ? error : absl::StrCat(error, " (in ", path, ")");
  }

  int flagfile_depth_ = 0;
};

}  // namespace

ParsedCommandLine ParseServerCommandLine(const std::vector<std::string>& args) {
  ParsedCommandLine parsed;
  parsed.usage = Usage();
  for (const FlagDoc& doc : kFlagDocs) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(doc.name);
    std::string ignored;
    flag->ParseFrom(flag->DefaultValue(), &ignored);
  }
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      parsed.outcome = ParsedCommandLine::Outcome::kHelp;
      return parsed;
    }
  }
  if (std::string error = CommandLineParser().ApplyAll(args); !error.empty()) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = std::move(error);
    return parsed;
  }

  if (absl::GetFlag(FLAGS_max_streams).value == 0) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = "--max-streams: needs a positive integer";
    return parsed;
  }
  ServerOptions& o = parsed.options;
  o.backend = absl::GetFlag(FLAGS_backend);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.memory_limit_bytes = absl::GetFlag(FLAGS_memory_limit).bytes;
  o.cpu_threads = absl::GetFlag(FLAGS_cpu_threads).value;
  o.default_device = absl::GetFlag(FLAGS_default_device).value;
  o.max_streams = absl::GetFlag(FLAGS_max_streams).value;
  o.graph_min_ops = absl::GetFlag(FLAGS_graph_min_ops).value;
  o.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (o.shutdown_grace < absl::ZeroDuration()) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = "--shutdown-grace: must not be negative";
  }
  o.lane_spin = absl::GetFlag(FLAGS_lane_spin);
  if (o.lane_spin.has_value() && *o.lane_spin < absl::ZeroDuration()) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = "--lane-spin: must not be negative";
  }
  o.pool_initial_bytes = absl::GetFlag(FLAGS_pool_initial).bytes;
  o.pool_release_threshold_bytes = absl::GetFlag(FLAGS_pool_release_threshold).bytes;
  o.kernel_cache_dir = absl::GetFlag(FLAGS_kernel_cache_dir).path;
  o.cuda_module = absl::GetFlag(FLAGS_cuda_module);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.allow_shared_memory = absl::GetFlag(FLAGS_allow_shared_memory);
  o.allow_cuda_ipc = absl::GetFlag(FLAGS_allow_cuda_ipc);
  o.region_idle_timeout_seconds = absl::GetFlag(FLAGS_region_idle_timeout).value;
  o.default_result_ttl_seconds = absl::GetFlag(FLAGS_default_result_ttl).value;
  if (!(o.default_result_ttl_seconds <= kMaxTtlSeconds)) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = absl::StrCat("--default-result-ttl: at most ",
                                static_cast<int64_t>(kMaxTtlSeconds), " seconds");
  }
  o.persist_dir = absl::GetFlag(FLAGS_persist_dir);
  o.snapshot_interval = absl::GetFlag(FLAGS_snapshot_interval);
  o.unauthenticated_tenant = absl::GetFlag(FLAGS_unauthenticated_tenant);
  if (o.snapshot_interval < absl::ZeroDuration()) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = "--snapshot-interval: must not be negative";
  }
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  o.allow_insecure_remote = absl::GetFlag(FLAGS_allow_insecure_remote);
  o.quota_file = absl::GetFlag(FLAGS_quota_file);
  o.replica_name = absl::GetFlag(FLAGS_replica_name);
  o.placement_file = absl::GetFlag(FLAGS_placement_file);
  o.replica_addresses = absl::GetFlag(FLAGS_replica_addresses);
  o.replica_address_template = absl::GetFlag(FLAGS_replica_address_template);
  o.upload_idle_timeout_seconds = absl::GetFlag(FLAGS_upload_idle_timeout).value;
  o.max_calls_per_tenant = absl::GetFlag(FLAGS_max_calls_per_tenant).value;
  o.max_uploads_per_tenant = absl::GetFlag(FLAGS_max_uploads_per_tenant).value;
  o.max_reserved_fraction_per_tenant = absl::GetFlag(FLAGS_max_reserved_fraction_per_tenant).value;
  o.log_format = absl::GetFlag(FLAGS_log_format);
  RequestLimits& limits = o.limits;
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  limits.max_dimensions = absl::GetFlag(FLAGS_max_dimensions).value;
  limits.max_elements = absl::GetFlag(FLAGS_max_elements).value;
  limits.max_expression_bytes = absl::GetFlag(FLAGS_max_expression_bytes).bytes;
  limits.max_expression_depth = absl::GetFlag(FLAGS_max_expression_depth).value;
  // Its messages name the flags.
  if (absl::Status status = ValidateRequestLimits(limits); !status.ok()) {
    parsed.outcome = ParsedCommandLine::Outcome::kError;
    parsed.error = std::string(status.message());
  }
  return parsed;
}

}  // namespace gpucompute

// `gpucompute bench`: upload and download speed against a running server, per transport
// and size, beside the copy ceiling the server measured at start (GetServerInfo). The
// timing is the client library's (client/cpp/transfer_timing.h), as gpucompute-bench's.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/cli.h"
#include "client/cpp/shared_memory.h"
#include "client/cpp/transfer_timing.h"
#include "common/byte_size.h"

namespace gpucompute::cli {
namespace {

constexpr char kDefaultSizes[] = "1MiB,64MiB,256MiB";
constexpr int kDefaultRepeat = 3;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxLatencyCalls = 100000;
constexpr int kLatencyWarmups = 10;
constexpr uint64_t kMinChunkBytes = 4096;  // the server's smallest download chunk

// One row of the table: a transport with its settings.
struct Transport {
  std::string name;  // grpc, grpc-parallel, shm, shm-inplace
  int streams = 1;
};

struct Settings {
  std::vector<uint64_t> sizes;
  int repeat = kDefaultRepeat;
  std::vector<std::string> transports;  // as given; empty: all that can run
  int streams = kAutoUploadStreams;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  int latency_calls = 0;  // Submit(wait) calls timed; 0: none
};

absl::StatusOr<Settings> ParseSettings(const ParsedArgs& args) {
  Settings settings;
  if (!args.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args.positional()[0], "'"));
  }
  for (absl::string_view text :
       absl::StrSplit(args.Value("--sizes").value_or(kDefaultSizes), ',')) {
    absl::StatusOr<uint64_t> size = ParseByteSize(text);
    if (!size.ok())
      return absl::InvalidArgumentError(absl::StrCat("--sizes: ", size.status().message()));
    if (*size == 0 || *size % sizeof(double) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes: ", text, " is not a positive multiple of 8 bytes (the arrays are float64)"));
    }
    settings.sizes.push_back(*size);
  }
  for (const auto& [flag, min, max, value] :
       {std::tuple{"--repeat", 1, kMaxRepeat, &settings.repeat},
        std::tuple{"--streams", 2, kMaxTransferStreams, &settings.streams},
        std::tuple{"--latency", 0, kMaxLatencyCalls, &settings.latency_calls}}) {
    absl::StatusOr<std::optional<int64_t>> given = args.Int(flag);
    if (!given.ok()) return given.status();
    if (!given->has_value()) continue;
    if (**given < min || **given > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be from ", min, " to ", max, ", not ", **given));
    }
    *value = static_cast<int>(**given);
  }
  if (std::optional<std::string> chunk = args.Value("--chunk-bytes")) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(*chunk);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--chunk-bytes: ", bytes.status().message()));
    }
    if (*bytes < kMinChunkBytes || *bytes > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("--chunk-bytes must be from ", kMinChunkBytes,
                                                     " to ", kMaxChunkBytes, " bytes, not ",
                                                     *bytes));
    }
    settings.chunk_bytes = *bytes;
  }
  const std::string transports = args.Value("--transport").value_or("all");
  if (transports != "all") {
    for (absl::string_view t : absl::StrSplit(transports, ',')) {
      if (t != "grpc" && t != "grpc-parallel" && t != "shm" && t != "shm-inplace") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--transport takes all, or a list of grpc, grpc-parallel, shm and shm-inplace, not '",
            t, "'"));
      }
      if (std::find(settings.transports.begin(), settings.transports.end(), t) ==
          settings.transports.end()) {
        settings.transports.emplace_back(t);
      }
    }
  }
  return settings;
}

bool Wants(const Settings& settings, std::string_view transport) {
  return settings.transports.empty() ||
         std::find(settings.transports.begin(), settings.transports.end(), transport) !=
             settings.transports.end();
}

// GB/s over the ceiling, or 0 where the server measured none.
double Ratio(double gbps, double ceiling_gbps) {
  return ceiling_gbps > 0 ? gbps / ceiling_gbps : 0;
}

std::string JsonNumber(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.10g", value) : "null";
}

struct Result {
  Transport transport;
  TransferTiming timing;
};

// Submit(wait) round trips, in microseconds, nearest rank.
struct Latency {
  int calls = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// Times `calls` Submit(wait) of `x + 1` on one float64 element written in place, after
// kLatencyWarmups untimed: the round trip of the smallest operation, which is what a
// proxy in front of the server adds to.
absl::StatusOr<Latency> TimeSubmitWait(Client& client, int calls) {
  v1::CreateBufferRequest create;
  create.set_dtype(v1::DTYPE_FLOAT64);
  create.add_shape(1);
  absl::StatusOr<v1::BufferInfo> x = client.CreateBuffer(create);
  if (!x.ok()) return x.status();
  v1::SubmitRequest request;
  request.set_wait(true);
  v1::ElementwiseOp* op = request.mutable_elementwise();
  op->set_expression("x + 1");
  (*op->mutable_inputs())["x"].set_buffer(x->id());
  op->mutable_output()->set_buffer(x->id());
  std::vector<double> micros;
  absl::Status status;
  for (int i = 0; i < kLatencyWarmups + calls && status.ok(); ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::Operation> done = client.Submit(request);
    const double elapsed = absl::ToDoubleMicroseconds(absl::Now() - start);
    if (!done.ok()) {
      status = done.status();
    } else if (done->state() != v1::Operation::STATE_SUCCEEDED) {
      status = absl::InternalError(
          absl::StrCat("operation ", done->id(), " did not succeed: ", done->error_message()));
    } else if (i >= kLatencyWarmups) {
      micros.push_back(elapsed);
    }
  }
  (void)client.DeleteBuffer(x->id());
  if (!status.ok()) return status;
  std::sort(micros.begin(), micros.end());
  auto rank = [&](double q) {
    return micros[std::min(micros.size() - 1, static_cast<size_t>(q * micros.size()))];
  };
  return Latency{calls, rank(0.5), rank(0.99)};
}

}  // namespace

Outcome RunBench(CliContext& context, const ParsedArgs& args) {
  absl::StatusOr<Settings> settings = ParseSettings(args);
  if (!settings.ok()) return Outcome::Usage(std::string(settings.status().message()));
  ClientOptions options = ClientOptionsFor(context.options());
  options.chunk_bytes = settings->chunk_bytes;
  options.transfer_streams = 1;
  absl::StatusOr<std::unique_ptr<Client>> single = Client::Connect(options);
  if (!single.ok()) {
    return Outcome::Usage(absl::StrCat("cannot connect: ", single.status().message()));
  }
  options.transfer_streams = settings->streams;
  absl::StatusOr<std::unique_ptr<Client>> parallel = Client::Connect(options);
  if (!parallel.ok()) return Outcome::Server("bench", parallel.status());

  absl::StatusOr<v1::ServerInfo> info = (*single)->GetServerInfo();
  if (!info.ok()) return Outcome::Server("bench", info.status());
  // A server with a smaller --max-message-bytes refuses larger upload chunks; say so now
  // rather than fail the first transfer. (A server that reports 0 predates the field.)
  if (const uint64_t server_max = info->limits().max_chunk_bytes();
      server_max != 0 && settings->chunk_bytes > server_max) {
    return Outcome::Usage(absl::StrCat("--chunk-bytes ", settings->chunk_bytes,
                                       " is larger than the server's max_chunk_bytes of ",
                                       server_max));
  }
  const uint64_t largest = *std::max_element(settings->sizes.begin(), settings->sizes.end());
  // Shared memory: when asked for, it must work; by default, when it can. shm-inplace
  // has a segment of its own, holding its array and what it downloads at once.
  const bool wants_shm = Wants(*settings, "shm") || Wants(*settings, "shm-inplace");
  std::unique_ptr<SharedMemoryTransport> shm, shm_inplace;
  if (wants_shm) {
    absl::Status usable = CheckSharedMemoryUsable(*info);
    if (usable.ok() && Wants(*settings, "shm")) {
      shm = std::make_unique<SharedMemoryTransport>(**single);
      usable = shm->Reserve(largest);
    }
    if (usable.ok() && Wants(*settings, "shm-inplace")) {
      shm_inplace = std::make_unique<SharedMemoryTransport>(**single);
      usable = shm_inplace->Reserve(2 * largest);
    }
    if (!usable.ok()) {
      if (!settings->transports.empty()) return Outcome::Server("bench: shm", usable);
      shm.reset();
      shm_inplace.reset();
    }
  }
  std::vector<std::pair<Transport, std::unique_ptr<TransferPath>>> paths;
  if (Wants(*settings, "grpc"))
    paths.emplace_back(Transport{"grpc", 1}, GrpcTransferPath(**single));
  if (Wants(*settings, "grpc-parallel")) {
    paths.emplace_back(Transport{"grpc-parallel", settings->streams}, GrpcTransferPath(**parallel));
  }
  if (shm != nullptr) paths.emplace_back(Transport{"shm", 0}, SharedMemoryTransferPath(*shm));
  if (shm_inplace != nullptr) {
    paths.emplace_back(Transport{"shm-inplace", 0}, SharedMemoryInPlacePath(*shm_inplace));
  }

  std::vector<Result> results;
  for (const uint64_t size : settings->sizes) {
    const std::vector<char> source = TransferSource(size);
    v1::UploadHeader header;
    header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
    header.mutable_create()->add_shape(size / sizeof(double));
    for (auto& [transport, path] : paths) {
      absl::StatusOr<TransferTiming> timing = TimeTransfers(
          **single, *path, header, std::as_bytes(std::span(source)), settings->repeat);
      if (!timing.ok()) {
        return Outcome::Server(absl::StrCat("bench: ", transport.name, " ", FormatBytes(size)),
                               timing.status());
      }
      results.push_back({transport, *timing});
    }
  }

  Latency latency;
  if (settings->latency_calls > 0) {
    absl::StatusOr<Latency> timed = TimeSubmitWait(**single, settings->latency_calls);
    if (!timed.ok()) return Outcome::Server("bench: Submit(wait)", timed.status());
    latency = *timed;
  }

  const double h2d = info->host_to_device_gbps();
  const double d2h = info->device_to_host_gbps();
  if (context.json()) {
    std::vector<std::string> rows;
    for (const Result& r : results) {
      rows.push_back(absl::StrCat(
          "{\"transport\":", JsonString(r.transport.name), ",\"streams\":", r.transport.streams,
          ",\"size_bytes\":", r.timing.bytes,
          ",\"upload_seconds\":", JsonNumber(r.timing.upload_seconds),
          ",\"upload_gbps\":", JsonNumber(r.timing.upload_gbps()),
          ",\"upload_vs_ceiling\":", JsonNumber(Ratio(r.timing.upload_gbps(), h2d)),
          ",\"upload_server_gbps\":", JsonNumber(r.timing.upload_server_gbps),
          ",\"download_seconds\":", JsonNumber(r.timing.download_seconds),
          ",\"download_gbps\":", JsonNumber(r.timing.download_gbps()),
          ",\"download_vs_ceiling\":", JsonNumber(Ratio(r.timing.download_gbps(), d2h)),
          ",\"download_server_gbps\":", JsonNumber(r.timing.download_server_gbps), "}"));
    }
    context.Print(absl::StrCat(
        "{\"server\":", JsonString(context.options().server),
        ",\"backend\":", JsonString(info->backend()), ",\"repeat\":", settings->repeat,
        ",\"chunk_bytes\":", settings->chunk_bytes, ",\"ceiling\":{\"host_to_device_gbps\":",
        JsonNumber(h2d), ",\"device_to_host_gbps\":", JsonNumber(d2h),
        ",\"description\":", JsonString(info->copy_ceiling()), "}",
        ",\"shm\":", shm != nullptr ? "true" : "false", ",\"results\":[", absl::StrJoin(rows, ","),
        "],\"latency\":{\"calls\":", latency.calls, ",\"p50_us\":", JsonNumber(latency.p50_us),
        ",\"p99_us\":", JsonNumber(latency.p99_us), "}}"));
    return Outcome::Ok();
  }

  auto ratio = [](double gbps, double ceiling) {
    return ceiling > 0 ? absl::StrFormat("%.3g", gbps / ceiling) : std::string("-");
  };
  std::vector<std::vector<std::string>> table = {
      {"transport", "streams", "size", "upload GB/s", "vs h2d", "download GB/s", "vs d2h"}};
  for (const Result& r : results) {
    table.push_back({r.transport.name,
                     r.transport.streams > 0 ? absl::StrCat(r.transport.streams) : "-",
                     FormatBytes(r.timing.bytes), FormatRate(r.timing.upload_gbps()),
                     ratio(r.timing.upload_gbps(), h2d), FormatRate(r.timing.download_gbps()),
                     ratio(r.timing.download_gbps(), d2h)});
  }
  context.Print(absl::StrCat(
      "server ", context.options().server, ", ", info->backend(),
      " backend; ceiling: ", info->copy_ceiling().empty() ? "not measured" : info->copy_ceiling(),
      ", h2d ", FormatRate(h2d), " GB/s, d2h ", FormatRate(d2h), " GB/s"));
  context.Print(absl::StrCat("median of ", settings->repeat, " after one warm-up; chunks of ",
                             FormatBytes(settings->chunk_bytes),
                             wants_shm && shm == nullptr && shm_inplace == nullptr
                                 ? "; shm: not usable with this server"
                                 : ""));
  context.Print(FormatTable(table));
  if (latency.calls > 0) {
    context.Print(
        absl::StrFormat("Submit(wait) of x + 1 on one element, %d calls: p50 %.1f us, "
                        "p99 %.1f us",
                        latency.calls, latency.p50_us, latency.p99_us));
  }
  return Outcome::Ok();
}

}  // namespace gpucompute::cli

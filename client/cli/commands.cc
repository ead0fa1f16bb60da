// The subcommands of the gpucompute CLI. Each checks its arguments, makes its calls
// through the Client, prints one result (a line, a table or one JSON object) and says
// how it ended; main() prints the error and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli/cli.h"
#include "client/cpp/npy.h"
#include "client/cpp/shared_memory.h"
#include "common/byte_size.h"

namespace gpucompute::cli {

ClientOptions ClientOptionsFor(const GlobalOptions& options) {
  ClientOptions client_options;
  client_options.target = options.server;
  client_options.client_name = options.client_name;
  client_options.token = options.token;
  client_options.tenant = options.tenant;
  client_options.tls = options.tls;
  client_options.tls_ca_file = options.tls_ca_file;
  client_options.tls_cert_file = options.tls_cert_file;
  client_options.tls_key_file = options.tls_key_file;
  client_options.tls_server_name = options.tls_server_name;
  client_options.request_id = options.request_id;
  if (options.timeout_seconds.has_value()) {
    client_options.timeout = absl::Seconds(*options.timeout_seconds);
  }
  return client_options;
}

absl::StatusOr<Client*> CliContext::client() {
  if (client_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(ClientOptionsFor(options_));
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
  }
  return client_.get();
}

void CliContext::Print(std::string_view line) const {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

namespace {

using ::google::protobuf::RepeatedField;

std::span<const uint64_t> ShapeOf(const RepeatedField<uint64_t>& shape) {
  return std::span<const uint64_t>(shape.data(), static_cast<size_t>(shape.size()));
}

// {"key":value,...} from already-encoded JSON values.
std::string JsonObject(std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  std::string out = "{";
  for (const auto& [key, value] : fields) {
    if (out.size() > 1) out += ',';
    absl::StrAppend(&out, JsonString(key), ":", value);
  }
  out += '}';
  return out;
}

std::string JsonStringArray(const std::vector<std::string>& items) {
  return absl::StrCat("[",
                      absl::StrJoin(items, ",",
                                    [](std::string* out, const std::string& item) {
                                      out->append(JsonString(item));
                                    }),
                      "]");
}

// The connection, or why the global flags do not allow one.
absl::StatusOr<Client*> Connect(CliContext& context) {
  absl::StatusOr<Client*> client = context.client();
  if (!client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot connect: ", client.status().message()));
  }
  return client;
}

// --device N, when given; a usage error names the flag.
absl::StatusOr<std::optional<int>> DeviceFlag(const ParsedArgs& args) {
  absl::StatusOr<std::optional<int64_t>> device = args.Int("--device");
  if (!device.ok()) return device.status();
  if (!device->has_value()) return std::optional<int>();
  if (**device < INT32_MIN || **device > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", **device, " is out of range"));
  }
  return std::optional<int>(static_cast<int>(**device));
}

// --ttl SECONDS: a lease for a new buffer (the server checks the range).
absl::StatusOr<std::optional<double>> TtlFlag(const ParsedArgs& args) {
  std::optional<std::string> text = args.Value("--ttl");
  if (!text.has_value()) return std::optional<double>();
  double seconds = 0;
  if (!absl::SimpleAtod(*text, &seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ttl needs a number of seconds, not '", *text, "'"));
  }
  return std::optional<double>(seconds);
}

Outcome ReportOperation(CliContext& context, std::string_view what,
                        const v1::Operation& operation) {
  context.Print(context.json() ? ToJson(operation) : FormatOperation(operation));
  if (operation.state() == v1::Operation::STATE_FAILED) {
    return Outcome::OperationFailed(what, operation);
  }
  return Outcome::Ok();
}

// Submits on the --stream stream; waits for the result unless --no-wait.
Outcome SubmitAndReport(CliContext& context, std::string_view what, const ParsedArgs& args,
                        v1::SubmitRequest request) {
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  const bool no_wait = args.Has("--no-wait");
  const std::optional<double> deadline = context.options().timeout_seconds;
  request.set_stream_id(context.options().stream);
  request.set_wait(!no_wait);
  // With a call deadline, have the server give up waiting a little before it, so
  // that a slow operation is reported with its id instead of a bare
  // DEADLINE_EXCEEDED.
  if (deadline.has_value()) request.set_wait_timeout_seconds(*deadline * 0.9);
  absl::StatusOr<v1::Operation> operation = (*client)->Submit(request);
  if (!operation.ok()) return Outcome::Server(what, operation.status());
  if (no_wait) {
    context.Print(context.json() ? ToJson(*operation) : operation->id());
    return Outcome::Ok();
  }
  // Without a deadline, wait as long as it takes (the server may bound each wait).
  while (!operation->done() && !deadline.has_value()) {
    operation = (*client)->WaitOperation(operation->id());
    if (!operation.ok()) return Outcome::Server(what, operation.status());
  }
  Outcome outcome = ReportOperation(context, what, *operation);
  if (!operation->done()) {
    return Outcome::Server(what, absl::DeadlineExceededError(absl::StrCat(
                                     "operation ", operation->id(), " is still ",
                                     FormatOperationState(operation->state()), " after ", *deadline,
                                     " s; 'gpucompute wait ", operation->id(), "' waits for it")));
  }
  return outcome;
}

Outcome BuildAndSubmit(CliContext& context, std::string_view what, const ParsedArgs& args,
                       BuildRequestFn build) {
  v1::SubmitRequest request;
  if (Outcome built = build(args, &request); built.exit_code != kExitOk) return built;
  return SubmitAndReport(context, what, args, std::move(request));
}

// "1.0 GB reserved, 800.0 MB used".
std::string PoolSummary(uint64_t reserved_bytes, uint64_t used_bytes) {
  return absl::StrCat(FormatBytes(reserved_bytes), " reserved, ", FormatBytes(used_bytes), " used");
}

// "8.0 MB[ at offset N] in 0.010 s  0.80 GB/s".
std::string TransferSummary(const v1::TransferStats& transfer, std::string_view where = "") {
  return absl::StrFormat("%s%s in %.3f s  %s GB/s", FormatBytes(transfer.bytes()), ToAbsl(where),
                         transfer.seconds(), FormatRate(transfer.gbps()));
}

// The shared-memory transport a put or get of `bytes` uses, or null for gRPC, as
// --transport says: "grpc"; "shm", or an error saying why it cannot be used; "auto" (the
// default), shared memory when the server allows it, runs on this host and can map this
// process's memory, else gRPC. Its segment is bounded (--shm-segment): a larger array
// moves through it in pieces.
absl::StatusOr<std::unique_ptr<SharedMemoryTransport>> ChooseTransport(Client& client,
                                                                       const ParsedArgs& args,
                                                                       uint64_t bytes) {
  const std::string transport = args.Value("--transport").value_or("auto");
  if (transport != "auto" && transport != "grpc" && transport != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport is auto, grpc or shm, not '", transport, "'"));
  }
  // Read whatever the transport: a mistyped size is an error, not ignored.
  uint64_t segment_bytes = kOneShotSegmentBytes;
  if (std::optional<std::string> text = args.Value("--shm-segment"); text.has_value()) {
    absl::StatusOr<uint64_t> parsed = ParseByteSize(*text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--shm-segment: ", parsed.status().message()));
    }
    segment_bytes = *parsed;
  }
  if (transport == "grpc") return nullptr;
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  absl::Status usable = info.ok() ? CheckSharedMemoryUsable(*info) : info.status();
  auto shm = std::make_unique<SharedMemoryTransport>(client,
                                                     SharedMemoryTransport::Bounded(segment_bytes));
  if (usable.ok()) usable = shm->Reserve(bytes);
  if (usable.ok()) return shm;
  if (transport == "shm") return usable;
  return nullptr;
}

// The outcome of a transfer that could not start on its transport.
Outcome TransportFailure(std::string_view what, const absl::Status& status) {
  return absl::IsInvalidArgument(status) ? UsageFrom(status) : Outcome::Server(what, status);
}

const char* TransportName(const std::unique_ptr<SharedMemoryTransport>& shm) {
  return shm != nullptr ? "shm" : "grpc";
}

// The bytes of shared memory the transfer mapped: 0 over gRPC.
std::string SegmentBytes(const std::unique_ptr<SharedMemoryTransport>& shm) {
  return absl::StrCat(shm != nullptr ? shm->region_bytes() : 0);
}

}  // namespace

// ---------------------------------------------------------------------------
// Server

Outcome RunInfo(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 0, 0)) return *usage;
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::ServerInfo> info = (*client)->GetServerInfo();
  if (!info.ok()) return Outcome::Server("info", info.status());
  if (context.json()) {
    context.Print(ToJson(*info));
    return Outcome::Ok();
  }
  std::vector<std::vector<std::string>> rows = {
      {"server", context.options().server},
      {"version",
       absl::StrCat(info->version(), " (", info->api(), "), ", info->backend(), " backend")},
  };
  for (const v1::DeviceInfo& device : info->devices()) {
    std::string text = absl::StrCat(device.name(), "  ", FormatBytes(device.total_memory_bytes()));
    if (device.peak_bandwidth_gbps() > 0) {
      absl::StrAppend(&text, "  ", FormatRate(device.peak_bandwidth_gbps()), " GB/s peak");
    }
    absl::StrAppend(&text, "  ", device.compute_units(), " compute units");
    if (device.index() == info->default_device()) absl::StrAppend(&text, "  (default)");
    rows.push_back({absl::StrCat("device ", device.index()), text});
    rows.push_back({absl::StrCat("pool ", device.index()),
                    PoolSummary(device.pool_reserved_bytes(), device.pool_used_bytes())});
  }
  if (!info->backend_error().empty()) {
    rows.push_back({"backend", absl::StrCat("FAILED: ", info->backend_error(),
                                            "; the server refuses work until it is restarted")});
  }
  rows.push_back({"memory", absl::StrCat(FormatBytes(info->memory_used_bytes()), " used of ",
                                         FormatBytes(info->memory_limit_bytes()), ", ",
                                         info->buffer_count(), " buffers")});
  const v1::Limits& limits = info->limits();
  rows.push_back(
      {"limits",
       absl::StrCat("messages ", FormatBytes(limits.max_message_bytes()), " (chunks ",
                    FormatBytes(limits.max_chunk_bytes()), "), ", limits.max_dimensions(),
                    " dimensions, ", limits.max_elements(), " elements, ",
                    limits.max_streams_per_client(), " streams per client, expressions ",
                    limits.max_expression_bytes(), " bytes and ", limits.max_expression_depth(),
                    " levels, ", limits.max_inline_values(), " inline values")});
  context.Print(FormatTable(rows));
  return Outcome::Ok();
}

Outcome RunStats(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 0, 0)) return *usage;
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::Stats> stats = (*client)->GetStats();
  if (!stats.ok()) return Outcome::Server("stats", stats.status());
  if (context.json()) {
    context.Print(ToJson(*stats));
    return Outcome::Ok();
  }
  context.Print(absl::StrFormat("uptime %.1f s  memory %s used, %s peak", stats->uptime_seconds(),
                                FormatBytes(stats->memory_used_bytes()),
                                FormatBytes(stats->memory_peak_bytes())));
  for (const v1::MemoryPoolUsage& pool : stats->pools()) {
    context.Print(absl::StrCat("pool ", pool.device(), "  ",
                               PoolSummary(pool.reserved_bytes(), pool.used_bytes())));
  }
  if (!stats->backend_error().empty()) {
    context.Print(absl::StrCat("backend FAILED: ", stats->backend_error()));
  }
  std::vector<std::vector<std::string>> rows = {
      {"KIND", "COUNT", "FAILED", "DEVICE", "READ", "WRITTEN", "GFLOP"}};
  for (const v1::KindStats& kind : stats->kinds()) {
    rows.push_back({FormatOperationKind(kind.kind()), absl::StrCat(kind.count()),
                    absl::StrCat(kind.failed()), FormatMilliseconds(kind.device_seconds()),
                    FormatBytes(kind.bytes_read()), FormatBytes(kind.bytes_written()),
                    absl::StrFormat("%.3f", static_cast<double>(kind.flops()) / 1e9)});
  }
  context.Print(FormatTable(rows));
  return Outcome::Ok();
}

Outcome RunTrim(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 0, 0)) return *usage;
  absl::StatusOr<std::optional<int>> device = DeviceFlag(args);
  if (!device.ok()) return UsageFrom(device.status());
  absl::StatusOr<std::optional<uint64_t>> keep = args.Uint("--keep");
  if (!keep.ok()) return UsageFrom(keep.status());
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::TrimMemoryPoolResponse> trimmed =
      (*client)->TrimMemoryPool(*device, keep->value_or(0));
  if (!trimmed.ok()) return Outcome::Server("trim", trimmed.status());
  if (context.json()) {
    context.Print(ToJson(*trimmed));
    return Outcome::Ok();
  }
  std::vector<std::vector<std::string>> rows = {{"DEVICE", "RESERVED", "USED"}};
  for (const v1::MemoryPoolUsage& pool : trimmed->pools()) {
    rows.push_back({absl::StrCat(pool.device()), FormatBytes(pool.reserved_bytes()),
                    FormatBytes(pool.used_bytes())});
  }
  context.Print(FormatTable(rows));
  return Outcome::Ok();
}

Outcome RunProfile(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  const std::string& action = args.positional()[0];
  if (action != "start" && action != "stop") {
    return Outcome::Usage(absl::StrCat("unknown action '", action, "' (start, stop)"));
  }
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  const bool start = action == "start";
  absl::Status status = start ? (*client)->StartProfiler() : (*client)->StopProfiler();
  if (!status.ok()) return Outcome::Server(absl::StrCat("profile ", action), status);
  const std::string_view state = start ? "started" : "stopped";
  context.Print(context.json() ? JsonObject({{"profiler", JsonString(state)}})
                               : absl::StrCat("profiler capture range ", ToAbsl(state)));
  return Outcome::Ok();
}

// ---------------------------------------------------------------------------
// Buffers

Outcome RunList(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 0, 0)) return *usage;
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::ListBuffersResponse> list = (*client)->ListBuffers();
  if (!list.ok()) return Outcome::Server("ls", list.status());
  if (context.json()) {
    context.Print(ToJson(*list));
    return Outcome::Ok();
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "TYPE", "LAYOUT", "SIZE", "DEVICE"}};
  for (const v1::BufferInfo& buffer : list->buffers()) {
    rows.push_back({buffer.id(), buffer.name().empty() ? "-" : buffer.name(),
                    FormatArrayType(buffer.dtype(), ShapeOf(buffer.shape())),
                    buffer.layout() == v1::LAYOUT_F ? "F" : "C", FormatBytes(buffer.size_bytes()),
                    absl::StrCat(buffer.device())});
  }
  context.Print(FormatTable(rows));
  context.Print(absl::StrCat(list->buffers_size(),
                             list->buffers_size() == 1 ? " buffer, " : " buffers, ",
                             FormatBytes(list->total_bytes())));
  return Outcome::Ok();
}

Outcome RunRemove(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, SIZE_MAX)) return *usage;
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  // Deletes what it can and reports the first failure.
  std::optional<Outcome> failure;
  std::vector<std::string> deleted;
  for (const std::string& buffer : args.positional()) {
    absl::Status status = (*client)->DeleteBuffer(buffer);
    if (!status.ok()) {
      if (!failure.has_value()) failure = Outcome::Server(absl::StrCat("rm ", buffer), status);
      continue;
    }
    deleted.push_back(buffer);
    if (!context.json()) context.Print(absl::StrCat("deleted ", buffer));
  }
  if (context.json()) {
    context.Print(JsonObject({{"deleted", JsonStringArray(deleted)}}));
  }
  return failure.value_or(Outcome::Ok());
}

Outcome RunRenew(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, SIZE_MAX)) return *usage;
  absl::StatusOr<std::optional<double>> ttl = TtlFlag(args);
  if (!ttl.ok()) return UsageFrom(ttl.status());
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  // Renews what it can and reports the first failure, as rm does.
  std::optional<Outcome> failure;
  for (const std::string& buffer : args.positional()) {
    absl::StatusOr<v1::BufferInfo> info = (*client)->RenewLease(buffer, *ttl);
    if (!info.ok()) {
      if (!failure.has_value())
        failure = Outcome::Server(absl::StrCat("renew ", buffer), info.status());
      continue;
    }
    context.Print(context.json()
                      ? ToJson(*info)
                      : absl::StrCat(FormatBufferRef(*info), "  ttl ", info->ttl_seconds(), " s"));
  }
  return failure.value_or(Outcome::Ok());
}

Outcome RunCreate(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 0, 0)) return *usage;
  v1::CreateBufferRequest request;
  absl::StatusOr<v1::DType> dtype = ParseProtoDType(args.Value("--dtype").value_or("float64"));
  if (!dtype.ok()) return UsageFrom(dtype.status());
  request.set_dtype(*dtype);
  std::optional<std::string> shape_text = args.Value("--shape");
  if (!shape_text.has_value()) return Outcome::Usage("--shape is required (\"\" for a 0-d array)");
  absl::StatusOr<std::vector<uint64_t>> shape = ParseShape(*shape_text);
  if (!shape.ok()) return UsageFrom(shape.status());
  for (uint64_t dimension : *shape) request.add_shape(dimension);
  if (std::optional<std::string> layout = args.Value("--layout")) {
    absl::StatusOr<v1::Layout> parsed = ParseLayout(*layout);
    if (!parsed.ok()) return UsageFrom(parsed.status());
    request.set_layout(*parsed);
  }
  if (std::optional<std::string> fill = args.Value("--fill")) {
    std::optional<v1::Scalar> scalar = ParseScalar(*fill);
    if (!scalar.has_value()) {
      return Outcome::Usage(
          absl::StrCat("--fill needs a number, True or False, not '", *fill, "'"));
    }
    *request.mutable_fill() = *scalar;
  }
  request.set_name(args.Value("--name").value_or(""));
  absl::StatusOr<std::optional<double>> ttl = TtlFlag(args);
  if (!ttl.ok()) return UsageFrom(ttl.status());
  request.set_ttl_seconds(ttl->value_or(0));
  absl::StatusOr<std::optional<int>> device = DeviceFlag(args);
  if (!device.ok()) return UsageFrom(device.status());
  if (device->has_value()) request.set_device(**device);

  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::BufferInfo> buffer = (*client)->CreateBuffer(request);
  if (!buffer.ok()) return Outcome::Server("create", buffer.status());
  context.Print(context.json() ? ToJson(*buffer)
                               : absl::StrCat(FormatBufferRef(*buffer), "  ",
                                              FormatBytes(buffer->size_bytes()), "  device ",
                                              buffer->device()));
  return Outcome::Ok();
}

Outcome RunPut(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  const std::string& path = args.positional()[0];
  // File errors name the file themselves.
  const std::string what = "put";
  std::optional<std::string> into = args.Value("--into");
  absl::StatusOr<std::optional<uint64_t>> offset = args.Uint("--offset");
  if (!offset.ok()) return UsageFrom(offset.status());
  if (offset->has_value() && !into.has_value()) return Outcome::Usage("--offset needs --into");
  if (into.has_value() && (args.Has("--name") || args.Has("--ttl"))) {
    return Outcome::Usage("--name and --ttl are for a new buffer; they cannot be used with --into");
  }
  absl::StatusOr<std::optional<double>> ttl = TtlFlag(args);
  if (!ttl.ok()) return UsageFrom(ttl.status());

  absl::StatusOr<NpyReader> reader = NpyReader::Open(path);
  if (!reader.ok()) return Outcome::Local(what, reader.status());
  const NpyHeader& npy = reader->header();
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());

  v1::UploadHeader header;
  if (into.has_value()) {
    // The server sees bytes only; catch a dtype mix-up here.
    absl::StatusOr<v1::BufferInfo> target = (*client)->GetBuffer(*into);
    if (!target.ok()) return Outcome::Server(what, target.status());
    if (target->dtype() != ToProtoDType(npy.dtype)) {
      return Outcome::Local(
          what, absl::InvalidArgumentError(
                    absl::StrCat("the file holds ", ToAbsl(DTypeName(npy.dtype)), " but buffer ",
                                 *into, " is ", FormatDType(target->dtype()))));
    }
    header.set_buffer(target->id());
    header.set_offset_bytes(offset->value_or(0));
  } else {
    v1::CreateBufferRequest* create = header.mutable_create();
    create->set_dtype(ToProtoDType(npy.dtype));
    for (uint64_t dimension : npy.shape) create->add_shape(dimension);
    create->set_layout(npy.fortran_order && npy.shape.size() >= 2 ? v1::LAYOUT_F : v1::LAYOUT_C);
    create->set_name(args.Value("--name").value_or(""));
    create->set_ttl_seconds(ttl->value_or(0));
  }

  bool read_failed = false;
  UploadReader read = [&](std::span<std::byte> out) -> absl::StatusOr<size_t> {
    absl::StatusOr<size_t> n = reader->Read(out);
    if (!n.ok()) read_failed = true;
    return n;
  };
  absl::StatusOr<std::unique_ptr<SharedMemoryTransport>> shm =
      ChooseTransport(**client, args, reader->data_bytes());
  if (!shm.ok()) return TransportFailure(what, shm.status());
  ProgressBar progress("put", reader->data_bytes());
  absl::StatusOr<v1::UploadResponse> response;
  if (*shm != nullptr) {
    absl::StatusOr<v1::CopyRegionResponse> copied =
        (*shm)->Upload(header, reader->data_bytes(), read, progress.AsCallback());
    if (copied.ok()) {
      response.emplace();
      *response->mutable_buffer() = copied->buffer();
      *response->mutable_transfer() = copied->transfer();
    } else {
      response = copied.status();
    }
  } else {
    response = (*client)->Upload(header, reader->data_bytes(), read, progress.AsCallback());
  }
  if (!response.ok()) {
    return read_failed ? Outcome::Local(what, response.status())
                       : Outcome::Server(what, response.status());
  }
  progress.Finish();
  if (context.json()) {
    context.Print(JsonObject({{"buffer", ToJson(response->buffer())},
                              {"transfer", ToJson(response->transfer())},
                              {"file", JsonString(path)},
                              {"transport", JsonString(TransportName(*shm))},
                              {"segment_bytes", SegmentBytes(*shm)}}));
  } else {
    const std::string where =
        into.has_value() ? absl::StrCat(" at offset ", offset->value_or(0)) : "";
    context.Print(absl::StrCat(FormatBufferRef(response->buffer()), "  uploaded ",
                               TransferSummary(response->transfer(), where), "  via ",
                               TransportName(*shm)));
  }
  return Outcome::Ok();
}

Outcome RunGet(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  const std::string& buffer_ref = args.positional()[0];
  std::optional<std::string> path = args.Value("--output");
  if (!path.has_value() || path->empty()) return Outcome::Usage("-o FILE.npy is required");
  absl::StatusOr<ArrayRef> array = ParseReference(buffer_ref);
  if (!array.ok()) return UsageFrom(array.status());
  if (array->is_view() && args.Value("--transport") == "shm") {
    return Outcome::Usage("a view downloads over grpc: shm copies whole byte ranges");
  }
  const std::string what = absl::StrCat("get ", buffer_ref);
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());

  absl::StatusOr<v1::BufferInfo> info = (*client)->GetBuffer(array->buffer());
  if (!info.ok()) return Outcome::Server(what, info.status());
  absl::StatusOr<DType> dtype = FromProtoDType(info->dtype());
  if (!dtype.ok()) return Outcome::Local(what, dtype.status());
  // A view's elements come in C order, in the view's shape; the file's header needs that
  // shape before the first byte arrives. A view that does not apply is the server's
  // INVALID_ARGUMENT, said here.
  absl::StatusOr<std::vector<uint64_t>> shape = ViewShape(ShapeOf(info->shape()), array->steps());
  if (!shape.ok()) return Outcome::Server(what, shape.status());
  NpyHeader npy{*dtype, *std::move(shape),
                !array->is_view() && info->layout() == v1::LAYOUT_F && info->shape_size() >= 2};

  absl::StatusOr<NpyWriter> writer = NpyWriter::Create(*path, npy);
  if (!writer.ok()) return Outcome::Local(what, writer.status());
  // A failed download leaves no partial file behind (special files such as
  // /dev/stdout are left alone).
  auto discard = [&] {
    std::error_code error;
    if (std::filesystem::is_regular_file(*path, error)) std::filesystem::remove(*path, error);
  };

  bool write_failed = false;
  DownloadSink sink = [&](uint64_t, std::string_view chunk) {
    absl::Status status = writer->Write(chunk);
    if (!status.ok()) write_failed = true;
    return status;
  };
  // By id: the name could be rebound between the two calls.
  const v1::DownloadRequest request = DownloadOf(ArrayRef(info->id(), array->steps()));
  absl::StatusOr<std::unique_ptr<SharedMemoryTransport>> shm =
      array->is_view() ? std::unique_ptr<SharedMemoryTransport>()
                       : ChooseTransport(**client, args, info->size_bytes());
  if (!shm.ok()) {
    discard();
    return TransportFailure(what, shm.status());
  }
  ProgressBar progress("get", ViewBytes(*info, array->steps()).value_or(0));
  absl::StatusOr<v1::DownloadResponse> response;
  if (*shm != nullptr) {
    absl::StatusOr<v1::CopyRegionResponse> copied =
        (*shm)->Download(request, sink, progress.AsCallback());
    if (copied.ok()) {
      response.emplace();
      *response->mutable_buffer() = copied->buffer();
      *response->mutable_transfer() = copied->transfer();
    } else {
      response = copied.status();
    }
  } else {
    response = (*client)->Download(request, sink, progress.AsCallback());
  }
  if (!response.ok()) {
    discard();
    return write_failed ? Outcome::Local(what, response.status())
                        : Outcome::Server(what, response.status());
  }
  if (absl::Status status = writer->Close(); !status.ok()) {
    discard();
    return Outcome::Local(what, status);
  }
  progress.Finish();
  if (context.json()) {
    context.Print(JsonObject({{"buffer", ToJson(response->buffer())},
                              {"transfer", ToJson(response->transfer())},
                              {"file", JsonString(*path)},
                              {"transport", JsonString(TransportName(*shm))},
                              {"segment_bytes", SegmentBytes(*shm)}}));
  } else {
    context.Print(absl::StrCat(FormatBufferRef(response->buffer()), "  downloaded to ", *path, "  ",
                               TransferSummary(response->transfer()), "  via ",
                               TransportName(*shm)));
  }
  return Outcome::Ok();
}

// ---------------------------------------------------------------------------
// Operations

Outcome BuildEval(const ParsedArgs& args, v1::SubmitRequest* request) {
  if (auto usage = CheckPositional(args, 1, SIZE_MAX)) return *usage;
  v1::ElementwiseOp* op = request->mutable_elementwise();
  op->set_expression(args.positional()[0]);
  if (Outcome bound = BindOperands(args, 1, op->mutable_inputs()); bound.exit_code != kExitOk) {
    return bound;
  }
  absl::StatusOr<v1::Output> output = OutputFromFlags(args, "--out");
  if (!output.ok()) return UsageFrom(output.status());
  *op->mutable_output() = *std::move(output);
  if (std::optional<std::string> shape_text = args.Value("--shape")) {
    absl::StatusOr<std::vector<uint64_t>> shape = ParseShape(*shape_text);
    if (!shape.ok()) return UsageFrom(shape.status());
    v1::SignedShape* extents = op->mutable_shape();
    for (uint64_t extent : *shape) {
      if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Outcome::Usage(absl::StrCat("--shape: the extent ", extent, " is too large"));
      }
      extents->add_extents(static_cast<int64_t>(extent));
    }
  }
  return Outcome::Ok();
}

Outcome BuildGemv(const ParsedArgs& args, v1::SubmitRequest* request) {
  if (auto usage = CheckPositional(args, 2, 2)) return *usage;
  absl::StatusOr<std::optional<double>> alpha = args.Double("--alpha");
  if (!alpha.ok()) return UsageFrom(alpha.status());
  absl::StatusOr<std::optional<double>> beta = args.Double("--beta");
  if (!beta.ok()) return UsageFrom(beta.status());
  absl::StatusOr<v1::Output> y = OutputFromFlags(args, "--y");
  if (!y.ok()) return UsageFrom(y.status());
  absl::StatusOr<ArrayRef> a = ParseReference(args.positional()[0]);
  if (!a.ok()) return UsageFrom(a.status());
  absl::StatusOr<ArrayRef> x = ParseReference(args.positional()[1]);
  if (!x.ok()) return UsageFrom(x.status());
  *request = Gemv(*a, *x, *std::move(y), args.Has("--transpose"), alpha->value_or(1.0),
                  beta->value_or(0.0));
  return Outcome::Ok();
}

Outcome BuildRandom(const ParsedArgs& args, v1::SubmitRequest* request) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  const std::string& distribution = args.positional()[0];
  v1::RandomOp* op = request->mutable_random();
  // "normal" is transform v2, "normal-v3" the newest; "normal-v1" reproduces fills made
  // before v2.
  if (distribution == "uniform") {
    op->set_distribution(v1::DISTRIBUTION_UNIFORM);
  } else if (distribution == "normal" || distribution == "normal-v2") {
    op->set_distribution(v1::DISTRIBUTION_NORMAL);
    op->set_normal_transform(v1::NORMAL_TRANSFORM_V2);
  } else if (distribution == "normal-v3") {
    op->set_distribution(v1::DISTRIBUTION_NORMAL);
    op->set_normal_transform(v1::NORMAL_TRANSFORM_V3);
  } else if (distribution == "normal-v1") {
    op->set_distribution(v1::DISTRIBUTION_NORMAL);
    op->set_normal_transform(v1::NORMAL_TRANSFORM_V1);
  } else if (distribution == "integers") {
    op->set_distribution(v1::DISTRIBUTION_INTEGERS);
  } else {
    return Outcome::Usage(absl::StrCat("unknown distribution '", distribution,
                                       "' (uniform normal normal-v1 normal-v2 normal-v3 integers)"));
  }
  const bool normal = op->distribution() == v1::DISTRIBUTION_NORMAL;
  for (std::string_view flag : {"--mean", "--std"}) {
    if (args.Has(flag) && !normal) {
      return Outcome::Usage(absl::StrCat(ToAbsl(flag), " applies to normal only"));
    }
  }
  for (std::string_view flag : {"--low", "--high"}) {
    if (args.Has(flag) && distribution != "integers") {
      return Outcome::Usage(absl::StrCat(ToAbsl(flag), " applies to integers only"));
    }
  }
  absl::StatusOr<v1::Output> output = OutputFromFlags(args, "--out");
  if (!output.ok()) return UsageFrom(output.status());
  *op->mutable_output() = *std::move(output);
  if (std::optional<std::string> shape_text = args.Value("--shape")) {
    absl::StatusOr<std::vector<uint64_t>> shape = ParseShape(*shape_text);
    if (!shape.ok()) return UsageFrom(shape.status());
    for (uint64_t dimension : *shape) op->add_shape(dimension);
  } else if (!args.Has("--out")) {
    return Outcome::Usage("--shape is required for a new buffer");
  }
  if (std::optional<std::string> layout = args.Value("--layout")) {
    absl::StatusOr<v1::Layout> parsed = ParseLayout(*layout);
    if (!parsed.ok()) return UsageFrom(parsed.status());
    op->set_layout(*parsed);
  }
  absl::StatusOr<std::optional<uint64_t>> seed = args.Uint("--seed");
  if (!seed.ok()) return UsageFrom(seed.status());
  absl::StatusOr<std::optional<uint64_t>> offset = args.Uint("--offset");
  if (!offset.ok()) return UsageFrom(offset.status());
  absl::StatusOr<std::optional<double>> mean = args.Double("--mean");
  if (!mean.ok()) return UsageFrom(mean.status());
  absl::StatusOr<std::optional<double>> stddev = args.Double("--std");
  if (!stddev.ok()) return UsageFrom(stddev.status());
  absl::StatusOr<std::optional<int64_t>> low = args.Int("--low");
  if (!low.ok()) return UsageFrom(low.status());
  absl::StatusOr<std::optional<int64_t>> high = args.Int("--high");
  if (!high.ok()) return UsageFrom(high.status());
  op->set_seed(seed->value_or(0));
  op->set_offset(offset->value_or(0));
  op->set_mean(mean->value_or(0.0));
  if (stddev->has_value()) op->set_stddev(**stddev);
  op->set_low(low->value_or(0));
  op->set_high(high->value_or(0));
  return Outcome::Ok();
}

Outcome RunEval(CliContext& context, const ParsedArgs& args) {
  return BuildAndSubmit(context, "eval", args, BuildEval);
}

Outcome RunGemv(CliContext& context, const ParsedArgs& args) {
  return BuildAndSubmit(context, "gemv", args, BuildGemv);
}

Outcome RunReduce(CliContext& context, const ParsedArgs& args) {
  return BuildAndSubmit(context, "reduce", args, BuildReduce);
}

Outcome RunMatmul(CliContext& context, const ParsedArgs& args) {
  return BuildAndSubmit(context, "matmul", args, BuildMatmul);
}

Outcome RunRandom(CliContext& context, const ParsedArgs& args) {
  return BuildAndSubmit(context, "rand", args, BuildRandom);
}

Outcome RunWait(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  absl::StatusOr<std::optional<double>> timeout = args.Double("--timeout");
  if (!timeout.ok()) return UsageFrom(timeout.status());
  if (timeout->value_or(0) < 0) return Outcome::Usage("--timeout must not be negative");
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  const std::string& id = args.positional()[0];
  absl::StatusOr<v1::Operation> operation = (*client)->WaitOperation(id, timeout->value_or(0));
  if (!operation.ok()) return Outcome::Server("wait", operation.status());
  Outcome outcome = ReportOperation(context, "wait", *operation);
  if (!operation->done()) {
    return Outcome::Server(
        "wait", absl::DeadlineExceededError(absl::StrCat("operation ", id, " is still ",
                                                         FormatOperationState(operation->state()),
                                                         " after ", timeout->value_or(0), " s")));
  }
  return outcome;
}

Outcome RunOperation(CliContext& context, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  absl::StatusOr<v1::Operation> operation = (*client)->GetOperation(args.positional()[0]);
  if (!operation.ok()) return Outcome::Server("op", operation.status());
  return ReportOperation(context, "op", *operation);
}

// ---------------------------------------------------------------------------
// Streams

namespace {

Outcome StreamCreate(CliContext& context, Client& client, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  absl::StatusOr<std::optional<int>> device = DeviceFlag(args);
  if (!device.ok()) return UsageFrom(device.status());
  absl::StatusOr<v1::StreamInfo> stream = client.CreateStream(*device);
  if (!stream.ok()) return Outcome::Server("stream create", stream.status());
  context.Print(context.json() ? ToJson(*stream)
                               : absl::StrCat(stream->id(), "  device ", stream->device()));
  return Outcome::Ok();
}

Outcome StreamRemove(CliContext& context, Client& client, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 2, SIZE_MAX)) return *usage;
  std::optional<Outcome> failure;
  std::vector<std::string> deleted;
  for (size_t i = 1; i < args.positional().size(); ++i) {
    const std::string& id = args.positional()[i];
    absl::Status status = client.DeleteStream(id);
    if (!status.ok()) {
      if (!failure.has_value()) failure = Outcome::Server(absl::StrCat("stream rm ", id), status);
      continue;
    }
    deleted.push_back(id);
    if (!context.json()) context.Print(absl::StrCat("deleted ", id));
  }
  if (context.json()) {
    context.Print(JsonObject({{"deleted", JsonStringArray(deleted)}}));
  }
  return failure.value_or(Outcome::Ok());
}

Outcome StreamSync(CliContext& context, Client& client, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 2)) return *usage;
  absl::StatusOr<std::optional<double>> timeout = args.Double("--timeout");
  if (!timeout.ok()) return UsageFrom(timeout.status());
  if (timeout->value_or(0) < 0) return Outcome::Usage("--timeout must not be negative");
  const std::string id =
      args.positional().size() > 1 ? args.positional()[1] : context.options().stream;
  absl::StatusOr<bool> idle = client.SynchronizeStream(id, timeout->value_or(0));
  if (!idle.ok()) return Outcome::Server("stream sync", idle.status());
  const std::string shown = id.empty() ? "default stream" : id;
  if (context.json()) {
    context.Print(JsonObject({{"stream_id", JsonString(id)}, {"idle", *idle ? "true" : "false"}}));
  } else {
    context.Print(absl::StrCat(shown, *idle ? "  idle" : "  busy"));
  }
  if (!*idle) {
    return Outcome::Server("stream sync",
                           absl::DeadlineExceededError(absl::StrCat(shown, " still has work after ",
                                                                    timeout->value_or(0), " s")));
  }
  return Outcome::Ok();
}

Outcome StreamList(CliContext& context, Client& client, const ParsedArgs& args) {
  if (auto usage = CheckPositional(args, 1, 1)) return *usage;
  absl::StatusOr<v1::ListStreamsResponse> list = client.ListStreams();
  if (!list.ok()) return Outcome::Server("stream ls", list.status());
  if (context.json()) {
    context.Print(ToJson(*list));
    return Outcome::Ok();
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "DEVICE", "DEFAULT", "PENDING"}};
  for (const v1::StreamInfo& stream : list->streams()) {
    rows.push_back({stream.id(), absl::StrCat(stream.device()), stream.is_default() ? "yes" : "no",
                    absl::StrCat(stream.pending_operations())});
  }
  context.Print(FormatTable(rows));
  return Outcome::Ok();
}

}  // namespace

Outcome RunStream(CliContext& context, const ParsedArgs& args) {
  if (args.positional().empty()) return Outcome::Usage("missing action: create, rm, sync or ls");
  const std::string& action = args.positional()[0];
  using Action = Outcome (*)(CliContext&, Client&, const ParsedArgs&);
  Action run = nullptr;
  if (action == "create") run = StreamCreate;
  if (action == "rm") run = StreamRemove;
  if (action == "sync") run = StreamSync;
  if (action == "ls") run = StreamList;
  if (run == nullptr) {
    return Outcome::Usage(absl::StrCat("unknown action '", action, "' (create, rm, sync, ls)"));
  }
  if (args.Has("--device") && action != "create") {
    return Outcome::Usage("--device applies to stream create only");
  }
  if (args.Has("--timeout") && action != "sync") {
    return Outcome::Usage("--timeout applies to stream sync only");
  }
  absl::StatusOr<Client*> client = Connect(context);
  if (!client.ok()) return UsageFrom(client.status());
  return run(context, **client, args);
}

}  // namespace gpucompute::cli

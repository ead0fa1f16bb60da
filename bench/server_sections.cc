// gpucompute-bench's sections on its in-process server: transfers (the client library's
// uploads and downloads, over gRPC and shared memory, against the copy ceilings), buffers
// (a new buffer, zeroed or filled, against the device-to-device copy) and e2e (the
// latency of one call, and four clients' load). benchmark.cc describes the columns.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <latch>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/benchmark.h"
#include "client/cpp/client.h"
#include "client/cpp/shared_memory.h"
#include "client/cpp/transfer_timing.h"
#include "server/server.h"
#include "server/util/status_macros.h"
#if defined(GPUCOMPUTE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "server/cuda/cuda_check.h"
#endif

namespace gpucompute::bench {
namespace {

constexpr int kLatencyLog2n = 20;
constexpr int kLoadClients = 4;
constexpr int kLoadChain = 100;

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Connect(const Server& server, const std::string& name,
                                                int transfer_streams) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", server.port());
  options.client_name = name;
  options.transfer_streams = transfer_streams;
  options.timeout = absl::Seconds(600);  // a hung server ends the run instead of hanging it
  return Client::Connect(options);
}

absl::Status Succeeded(const absl::StatusOr<v1::Operation>& op) {
  if (!op.ok()) return op.status();
  if (op->state() != v1::Operation::STATE_SUCCEEDED) {
    return absl::Status(static_cast<absl::StatusCode>(op->error_code()),
                        absl::StrCat("operation ", op->id(), " failed: ", op->error_message()));
  }
  return absl::OkStatus();
}

absl::Status RunTransfers(const Options& options, const CopyCeilings& ceilings,
                          const Server& server) {
  const uint64_t bytes = options.transfer_bytes();
  const double mib = static_cast<double>(bytes) / (1 << 20);
  const std::vector<char> source = TransferSource(bytes);
  std::vector<char> sink(bytes, 1);
  const double h2d_seconds = ceilings.h2d_seconds, d2h_seconds = ceilings.d2h_seconds;

  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-transfers"));
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  header.mutable_create()->add_shape(bytes / sizeof(double));
  const auto data = std::as_bytes(std::span(source));

  // The gRPC rows: one stream, and the library's own choice (parallel streams on
  // separate connections for large arrays); then shared memory, through one segment
  // registered once (not timed) and reused.
  struct Row {
    std::string op;
    double seconds;
    std::string server_gbps;
  };
  std::vector<Row> rows;
  auto add_rows = [&](TransferPath& path, const std::string& prefix,
                      const std::string& suffix) -> absl::Status {
    ASSIGN_OR_RETURN(const TransferTiming t,
                     TimeTransfers(*client, path, header, data, options.repeat));
    rows.push_back({prefix + "upload" + suffix, t.upload_seconds, Fixed(t.upload_server_gbps, 3)});
    rows.push_back(
        {prefix + "download" + suffix, t.download_seconds, Fixed(t.download_server_gbps, 3)});
    return absl::OkStatus();
  };
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> single,
                     Connect(server, "bench-transfers", /*transfer_streams=*/1));
    RETURN_IF_ERROR(add_rows(*GrpcTransferPath(*single), "", " (1 stream)"));
  }
  RETURN_IF_ERROR(add_rows(*GrpcTransferPath(*client), "", " (library's choice)"));
  SharedMemoryTransport shm(*client);
  RETURN_IF_ERROR(shm.Reserve(bytes));
  RETURN_IF_ERROR(add_rows(*SharedMemoryTransferPath(shm), "shm ", ""));

  // Into an existing buffer: the same copy without a new allocation's first touch.
  ASSIGN_OR_RETURN(const v1::CopyRegionResponse target, shm.Upload(header, data));
  std::vector<double> shm_overwrite_wall, shm_overwrite_server;
  v1::UploadHeader overwrite;
  overwrite.set_buffer(target.buffer().id());
  for (int r = 0; r <= options.repeat; ++r) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::CopyRegionResponse> up = shm.Upload(overwrite, data);
    const double wall = SecondsSince(start);
    if (!up.ok()) return up.status();
    if (r > 0) {
      shm_overwrite_wall.push_back(wall);
      shm_overwrite_server.push_back(up->transfer().gbps());
    }
  }
  RETURN_IF_ERROR(client->DeleteBuffer(target.buffer().id()));
  rows.push_back(
      {"shm upload into", Median(shm_overwrite_wall), Fixed(Median(shm_overwrite_server), 3)});

  // A whole workflow, as a user runs it: the array up, one expression into a new buffer,
  // the result down, both buffers deleted; through shared memory and through gRPC.
  v1::SubmitRequest eval = Elementwise("x * 2 + 1", {{"x", BufferOperand("wf_x")}});
  eval.set_wait(true);
  v1::UploadHeader workflow_header = header;
  workflow_header.mutable_create()->set_name("wf_x");
  std::string sink_string;  // what Download(string*) fills
  auto workflow = [&](bool use_shm) -> absl::StatusOr<double> {
    std::vector<double> walls;
    for (int r = 0; r <= options.repeat; ++r) {
      const Clock::time_point start = Clock::now();
      if (use_shm) {
        RETURN_IF_ERROR(shm.Upload(workflow_header, data).status());
      } else {
        RETURN_IF_ERROR(client->Upload(workflow_header, data).status());
      }
      absl::StatusOr<v1::Operation> op = client->Submit(eval);
      RETURN_IF_ERROR(Succeeded(op));
      v1::DownloadRequest result;
      result.set_buffer(op->outputs(0).id());
      if (use_shm) {
        RETURN_IF_ERROR(shm.Download(result,
                                     [&](uint64_t offset, std::string_view chunk) {
                                       ParallelCopy(sink.data() + offset, chunk.data(),
                                                    chunk.size());
                                       return absl::OkStatus();
                                     })
                            .status());
      } else {
        RETURN_IF_ERROR(client->Download(result, &sink_string).status());
      }
      const double wall = SecondsSince(start);
      RETURN_IF_ERROR(client->DeleteBuffer("wf_x"));
      RETURN_IF_ERROR(client->DeleteBuffer(op->outputs(0).id()));
      if (r > 0) walls.push_back(wall);
    }
    return Median(walls);
  };
  ASSIGN_OR_RETURN(const double workflow_shm, workflow(true));
  ASSIGN_OR_RETURN(const double workflow_grpc, workflow(false));
  sink_string = std::string();

  // The ceiling: the pinned copy where there is one (CUDA), else the backend's own copy.
  const double ceiling_seconds =
      ceilings.pinned_h2d_seconds > 0 ? ceilings.pinned_h2d_seconds : h2d_seconds;
  const double h2d_gbps = bytes / ceiling_seconds / 1e9;
  Table table({"op", "MiB", "ms", "GB/s", "server GB/s", "vs ceiling"}, 1);
  auto add = [&](const char* op, double seconds, const std::string& server_gbps) {
    const double gbps = bytes / seconds / 1e9;
    table.AddRow({op, Fixed(mib, 1), Fixed(seconds * 1e3, 3), Fixed(gbps, 3), server_gbps,
                  Fixed(gbps / h2d_gbps, 3)});
  };
  if (ceilings.pinned_h2d_seconds > 0) add("pinned h2d (ceiling)", ceilings.pinned_h2d_seconds, "");
  add("h2d copy", h2d_seconds, "");
  add("d2h copy", d2h_seconds, "");
  for (const Row& row : rows) add(row.op.c_str(), row.seconds, row.server_gbps);
  // Bytes moved: the array up and the result down; GB/s counts one way, as the others.
  add("workflow shm: up, x*2+1, down", workflow_shm, "");
  add("workflow gRPC: up, x*2+1, down", workflow_grpc, "");
  table.Print(absl::StrCat(
      "transfers: in-process server over loopback, median of ", options.repeat,
      ", ratio to the pinned host-to-device copy (CUDA) or Backend::CopyFromHost (CPU)"));
  return absl::OkStatus();
}

absl::Status RunBuffers(const Options& options, double copy_seconds, const Server& server) {
  const uint64_t n = static_cast<uint64_t>(options.n());
  const uint64_t bytes = n * sizeof(double);
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-buffers"));
  // Wall time of CreateBuffer until the client's default stream, which runs the fill, is
  // done; the buffer is deleted untimed.
  auto time_creates = [&](bool fill) -> absl::StatusOr<double> {
    v1::CreateBufferRequest request;
    request.set_dtype(v1::DTYPE_FLOAT64);
    request.add_shape(n);
    if (fill) request.mutable_fill()->set_float_value(1.5);
    std::vector<double> walls;
    for (int r = 0; r <= options.repeat; ++r) {
      const Clock::time_point start = Clock::now();
      ASSIGN_OR_RETURN(const v1::BufferInfo buffer, client->CreateBuffer(request));
      RETURN_IF_ERROR(client->SynchronizeStream("").status());
      const double wall = SecondsSince(start);
      RETURN_IF_ERROR(client->DeleteBuffer(buffer.id()));
      if (r > 0) walls.push_back(wall);
    }
    return Median(walls);
  };
  ASSIGN_OR_RETURN(const double unfilled, time_creates(false));
  ASSIGN_OR_RETURN(const double filled, time_creates(true));

  const double copy_gbps = 2.0 * bytes / copy_seconds / 1e9;
  Table table({"op", "MiB", "ms", "GB/s", "vs copy"}, 1);
  auto add = [&](const char* op, double seconds, double bytes_moved) {
    const double gbps = bytes_moved / seconds / 1e9;
    table.AddRow({op, Fixed(bytes / double(1 << 20), 1), Fixed(seconds * 1e3, 3), Fixed(gbps, 3),
                  Fixed(gbps / copy_gbps, 3)});
  };
  add("d2d copy (ceiling)", copy_seconds, 2.0 * bytes);
  add("create unfilled + sync", unfilled, bytes);
  add("create fill + sync", filled, bytes);
  table.Print(absl::StrCat("buffers: 2^", options.log2n,
                           " float64 through the in-process server, median of ", options.repeat,
                           ", ratio to the device-to-device copy (bytes read + written)"));
  return absl::OkStatus();
}

absl::Status RunLatency(const Options& options, const Server& server) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-latency"));
  const uint64_t n = uint64_t{1} << kLatencyLog2n;
  for (const auto& [name, seed] : {std::pair{"x", 11}, std::pair{"y", 12}}) {
    v1::SubmitRequest fill =
        Random(v1::DISTRIBUTION_UNIFORM, {n}, v1::DTYPE_FLOAT32, seed, NewOutput(name));
    fill.set_wait(true);
    RETURN_IF_ERROR(Succeeded(client->Submit(fill)));
  }
  v1::CreateBufferRequest z;
  z.set_dtype(v1::DTYPE_FLOAT32);
  z.add_shape(n);
  z.set_name("z");
  RETURN_IF_ERROR(client->CreateBuffer(z).status());

  v1::SubmitRequest add = Elementwise(
      "x + y", {{"x", BufferOperand("x")}, {"y", BufferOperand("y")}}, ExistingOutput("z"));
  add.set_wait(true);
  // The two calls alternate, so that both see the same state of the machine: on a
  // shared host the no-op alone drifts by tens of percent from one second to the next.
  std::vector<double> submit, device, noop;
  for (int i = 0; i < kLatencyWarmup + options.samples; ++i) {
    Clock::time_point start = Clock::now();
    absl::StatusOr<v1::Operation> op = client->Submit(add);
    const double submit_wall = SecondsSince(start);
    RETURN_IF_ERROR(Succeeded(op));
    start = Clock::now();
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
    const double noop_wall = SecondsSince(start);
    if (!info.ok()) return info.status();
    if (i >= kLatencyWarmup) {
      submit.push_back(submit_wall);
      device.push_back(op->timing().device_seconds());
      noop.push_back(noop_wall);
    }
  }
  for (const char* name : {"x", "y", "z"}) RETURN_IF_ERROR(client->DeleteBuffer(name));

  const double noop50 = Percentile(noop, 50), noop99 = Percentile(noop, 99);
  Table table({"call", "samples", "p50 ms", "p99 ms", "p50 vs no-op", "p99 vs no-op", "device ms",
               "target", "met"},
              1);
  const double p50_ratio = Percentile(submit, 50) / noop50,
               p99_ratio = Percentile(submit, 99) / noop99;
  table.AddRow({"Submit(wait) x + y 2^20 float32", absl::StrCat(submit.size()),
                Fixed(Percentile(submit, 50) * 1e3, 3), Fixed(Percentile(submit, 99) * 1e3, 3),
                Fixed(p50_ratio, 2), Fixed(p99_ratio, 2), Fixed(Median(device) * 1e3, 3), "<= 1.5x",
                p50_ratio <= 1.5 && p99_ratio <= 1.5 ? "yes" : "NO"});
  table.AddRow({"GetServerInfo (no-op)", absl::StrCat(noop.size()), Fixed(noop50 * 1e3, 3),
                Fixed(noop99 * 1e3, 3), "1.00", "1.00", ""});
  table.Print("e2e latency: wall time per call from the client, nearest-rank percentiles");
  return absl::OkStatus();
}

namespace {

// One load client's results.
struct LoadResult {
  absl::Status status;
  std::vector<double> device_seconds;
  Clock::time_point end;
};

// Runs on its own thread: prepares x (uniform) and y (ones), counts down `ready`, waits
// for `go`, chains kLoadChain submissions of x = x + y, then checks that every element
// of x - kLoadChain lies in [0, 1] (x starts in [0, 1); float32 rounding may carry a
// value just below 1 up to 1).
void LoadClient(const Server& server, int index, uint64_t n, std::latch& ready, std::latch& go,
                LoadResult& result) {
  bool counted = false;
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Connect(server, absl::StrCat("bench-load-", index)));
    v1::SubmitRequest fill =
        Random(v1::DISTRIBUTION_UNIFORM, {n}, v1::DTYPE_FLOAT32, 100 + index, NewOutput("x"));
    fill.set_wait(true);
    RETURN_IF_ERROR(Succeeded(client->Submit(fill)));
    v1::CreateBufferRequest y;
    y.set_dtype(v1::DTYPE_FLOAT32);
    y.add_shape(n);
    y.set_name("y");
    y.mutable_fill()->set_float_value(1.0);
    RETURN_IF_ERROR(client->CreateBuffer(y).status());
    ASSIGN_OR_RETURN(bool idle, client->SynchronizeStream(""));
    if (!idle) return absl::DeadlineExceededError("the load client's stream did not go idle");
    counted = true;
    ready.count_down();
    go.wait();

    const v1::SubmitRequest add = Elementwise(
        "x + y", {{"x", BufferOperand("x")}, {"y", BufferOperand("y")}}, ExistingOutput("x"));
    std::vector<OperationFuture> futures;
    for (int i = 0; i < kLoadChain; ++i) futures.push_back(client->SubmitAsync(add));
    for (const OperationFuture& f : futures) {
      const absl::StatusOr<v1::Operation>& op = f.Get();
      RETURN_IF_ERROR(Succeeded(op));
      result.device_seconds.push_back(op->timing().device_seconds());
    }
    result.end = Clock::now();

    for (v1::ReduceKind kind : {v1::REDUCE_KIND_MIN, v1::REDUCE_KIND_MAX}) {
      v1::SubmitRequest check = Reduce(kind, "x");
      check.set_wait(true);
      absl::StatusOr<v1::Operation> op = client->Submit(check);
      RETURN_IF_ERROR(Succeeded(op));
      if (op->values_size() != 1)
        return absl::InternalError("a whole-array reduction gave no value");
      const double v = op->values(0).float_value() - kLoadChain;
      if (!(v >= 0 && v <= 1)) {
        return absl::InternalError(absl::StrCat("load client ", index, ": x - ", kLoadChain,
                                                " has an element ", v, " outside [0, 1]"));
      }
    }
    RETURN_IF_ERROR(client->DeleteBuffer("x"));
    return client->DeleteBuffer("y");
  };
  result.status = run();
  if (!counted) ready.count_down();  // never leave the others waiting for this one
}

// The median device time of z = x + y on n float32 elements with nothing else running,
// through the server like the load's operations.
absl::StatusOr<double> IsolatedAddSeconds(const Server& server, uint64_t n) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-load-alone"));
  for (const auto& [name, seed] : {std::pair{"x", 21}, std::pair{"y", 22}, std::pair{"z", 23}}) {
    v1::SubmitRequest fill =
        Random(v1::DISTRIBUTION_UNIFORM, {n}, v1::DTYPE_FLOAT32, seed, NewOutput(name));
    fill.set_wait(true);
    RETURN_IF_ERROR(Succeeded(client->Submit(fill)));
  }
  v1::SubmitRequest add = Elementwise(
      "x + y", {{"x", BufferOperand("x")}, {"y", BufferOperand("y")}}, ExistingOutput("z"));
  add.set_wait(true);
  std::vector<double> seconds;
  for (int i = 0; i < 11; ++i) {
    absl::StatusOr<v1::Operation> op = client->Submit(add);
    RETURN_IF_ERROR(Succeeded(op));
    if (i > 0) seconds.push_back(op->timing().device_seconds());
  }
  for (const char* name : {"x", "y", "z"}) RETURN_IF_ERROR(client->DeleteBuffer(name));
  return Median(std::move(seconds));
}

struct MemoryReport {
  double device_total = 0;  // 0: not known (no GPU)
  double device_used = 0;
  double buffers = 0;
  double pool_reserved = 0;
};

// Device memory while the load's buffers exist: the whole device's use (this process is
// the server; nothing else runs on the device) against the bytes the buffers hold.
absl::StatusOr<MemoryReport> ReportMemory(const Server& server) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-memory"));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  MemoryReport report;
  report.buffers = static_cast<double>(info.memory_used_bytes());
  for (const v1::DeviceInfo& d : info.devices()) report.pool_reserved += d.pool_reserved_bytes();
#if defined(GPUCOMPUTE_HAVE_CUDA)
  if (info.backend() == "cuda") {
    size_t free_bytes = 0, total_bytes = 0;
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    report.device_total = static_cast<double>(total_bytes);
    report.device_used = static_cast<double>(total_bytes - free_bytes);
  }
#endif
  return report;
}

}  // namespace

absl::Status RunLoad(const Options& options, const Server& server) {
  const uint64_t n = static_cast<uint64_t>(options.n());
  std::latch ready(kLoadClients);
  std::latch go(1);
  std::vector<LoadResult> results(kLoadClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kLoadClients; ++i) {
    threads.emplace_back(LoadClient, std::cref(server), i, n, std::ref(ready), std::ref(go),
                         std::ref(results[i]));
  }
  ready.wait();
  // What one operation costs with the device to itself, measured before the load starts.
  absl::StatusOr<double> alone = IsolatedAddSeconds(server, n);
  absl::StatusOr<MemoryReport> memory = ReportMemory(server);
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  if (!alone.ok()) return alone.status();
  if (!memory.ok()) return memory.status();

  std::vector<double> device;
  Clock::time_point end = start;
  for (const LoadResult& r : results) {
    RETURN_IF_ERROR(r.status);
    device.insert(device.end(), r.device_seconds.begin(), r.device_seconds.end());
    end = std::max(end, r.end);
  }
  const double wall = std::chrono::duration<double>(end - start).count();
  double device_sum = 0;
  for (double s : device) device_sum += s;
  const double moved = static_cast<double>(device.size()) * 3.0 * n * sizeof(float);

  const double busy = static_cast<double>(device.size()) * *alone / wall;
  Table table({"clients", "ops/client", "size", "wall s", "op alone ms", "busy", "target", "met",
               "GB/s", "sum device s", "op ms p50"},
              0);
  table.AddRow({absl::StrCat(kLoadClients), absl::StrCat(kLoadChain),
                absl::StrCat("2^", options.log2n, " f32"), Fixed(wall, 3), Fixed(*alone * 1e3, 3),
                Fixed(busy, 3), "> 0.90", busy > 0.9 ? "yes" : "NO", Fixed(moved / wall / 1e9, 2),
                Fixed(device_sum, 3), Fixed(Median(device) * 1e3, 3)});
  table.Print(
      "e2e load: busy = operations x (device time of one alone) / wall; sum device s counts "
      "overlapping "
      "operations each");

  Table mem({"device total GiB", "device used GiB", "buffers GiB", "pool reserved GiB",
             "overhead MiB", "limit MiB", "met"},
            0);
  const double gib = double(1 << 30), mib = double(1 << 20);
  const double limit = 0.05 * memory->device_total + 256 * mib;
  if (memory->device_total > 0) {
    const double overhead = memory->device_used - memory->buffers;
    mem.AddRow({Fixed(memory->device_total / gib, 2), Fixed(memory->device_used / gib, 2),
                Fixed(memory->buffers / gib, 2), Fixed(memory->pool_reserved / gib, 2),
                Fixed(overhead / mib, 1), Fixed(limit / mib, 1), overhead < limit ? "yes" : "NO"});
  } else {
    mem.AddRow({"", "", Fixed(memory->buffers / gib, 2), Fixed(memory->pool_reserved / gib, 2), "",
                "", ""});
  }
  mem.Print(
      "memory during the load: overhead = device memory in use (whole device) - buffer bytes; "
      "limit = 5% of "
      "the device + 256 MiB");
  return absl::OkStatus();
}

}  // namespace gpucompute::bench

// gpucompute-bench: how fast the kernels, the transfers and the RPC path are, each
// reported as a fraction of a ceiling measured in the same run on the same machine. A
// benchmark program that prints tables, not a test: nothing here passes or fails on time.
//
// Run (defaults shown; the defaults fit a small CPU machine in about a minute):
//   gpucompute-bench --backend=cpu --log2n=24 --dtype=both --repeat=5
//       --sections=kernels,transfers,e2e --threads=0 --gemv=2048,4096
//       --transfer-mib=0 --samples=200 --session-ops=20000 --graph-min-ops=4
// The GPU run: --backend=cuda --log2n=28 --gemv=16384,32768.
//   --log2n         arrays have N = 2^log2n elements (kernels, transfers, e2e load)
//   --dtype         float64, float32 or both (kernels section)
//   --repeat        timed repetitions after one warm-up; the median is reported
//   --threads       CPU backend worker threads, 0 = one per hardware thread
//   --gemv          square gemv sizes, comma-separated (empty: none)
//   --transfer-mib  transfer size in MiB; 0 = N float64 elements
//   --samples       RPCs timed for each e2e latency row (and each sessions latency row)
//   --session-ops   operations each sessions throughput row sends in all
//   --session-clients client counts of the sessions throughput rows, comma-separated
//   --graph-min-ops the server's --graph-min-ops (0: nothing is launched as a CUDA graph)
//   --session-handler the server's --session-handler: callback or sync
//   --lane-spin-us  the server's --lane-spin in microseconds (0: off); default: the server's
//
// Columns.
//  kernels (Backend API only, device-resident buffers, one stream; device time between
//  events recorded just before and after the op, median of --repeat):
//    op        the operation; `expr` is sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))
//              and `expr nvcc -O3` the same as a hand-written CUDA kernel (CUDA only); the
//              two take turns, three medians each, and each row shows its fastest
//    dtype     element type
//    size      N, or rows x cols for gemv (no transpose, beta = 0)
//    ms        device milliseconds
//    GB/s      (bytes read + bytes written) / time, 1e9 bytes: copy 2N, x + y 3N, expr 2N,
//              reduce N (+ the result), gemv rows*cols + rows + cols, random N (written);
//              each times the item size
//    vs copy   GB/s / the GB/s of the device-to-device copy row of the same dtype: the
//              fraction of the memory bandwidth the op reaches, 1.0 being copy speed
//    GFLOP/s   arithmetic per second, for the expression (Program::ops_per_element() per
//              element) and gemv (2 per matrix element)
//  transfers (an in-process server and a Client over loopback, --repeat timed calls):
//    op        `pinned h2d` (CUDA only) is cudaMemcpyAsync from page-locked host memory,
//              the link's ceiling; `h2d copy` is Backend::CopyFromHost of the same bytes
//              from pageable host memory (through the CUDA backend's pinned staging; the
//              ceiling on the CPU), `d2h copy` Backend::CopyToHost, `upload` and
//              `download` the client library's calls into and out of a buffer, `shm
//              upload` and `shm download` the same through SharedMemoryTransport (the
//              client's copy into or out of its segment included; the server's copy is
//              one DMA from the pinned segment on CUDA); `shm upload into` overwrites the
//              existing buffer, without a new buffer's allocation and first touch
//    MiB       bytes moved / 2^20
//    ms        device time for the copies; wall time of the whole call (from the client's
//              side, connection and response included) for upload and download
//    GB/s      bytes / ms, 1e9 bytes
//    server GB/s  the server's own TransferStats (first byte to last; for shm, its copy)
//    vs ceiling  GB/s / the pinned h2d copy's GB/s (CUDA), or the h2d copy's (CPU)
//  e2e latency (the same server; wall time of each call from the client, nearest rank):
//    call      Submit(wait=true) of x + y on 2^20 float32 resident buffers into a resident
//              output, and GetServerInfo, the cheapest RPC there is; the two alternate
//    p50 ms, p99 ms  percentiles over --samples calls (after 10 warm-ups)
//    vs no-op  the percentile divided by GetServerInfo's same percentile
//    device ms the operation's median Timing.device_seconds
//  e2e load (4 clients, each its own Client on its own thread and its own default stream,
//  each chaining 100 submissions of x = x + y on N-element float32 buffers, SubmitAsync):
//    wall s    from the first submission to the last operation's completion
//    op alone ms  the median device time of the same x + y through the same server with
//              nothing else running, measured just before the load
//    busy      400 * (op alone) / wall s: the fraction of the wall time the device would
//              need for the load's work at the speed it does it alone. Under 1: the device
//              idled (RPC, queueing, dispatch) or ran slower for the interleaving
//    GB/s      400 * 3N * 4 bytes / wall s: the throughput the clients saw
//    sum device s  the sum of the 400 operations' Timing.device_seconds; operations of
//              different streams overlap on the device and each counts its stretched time
//    op ms p50 the median device time of one operation under this load
//  sessions (--sections=sessions; every operation is x + 1 on 1024 float32 values into a
//  resident output, each client on its own default stream):
//    ops/s     operations per second from the first submission to the last answer:
//              through one session per client (--session-clients, 1 and 16 by
//              default), and, for comparison, SubmitAsync with 64 in flight (1 client),
//              the path without sessions; the ceiling is the backend alone, before the
//              server starts: the same operation between two events, completed on its
//              end event, 64 in flight on each of as many streams as clients, with no
//              executor, RPC or client
//    CPU       after the table, per throughput row: the CPU seconds its threads used,
//              by thread name (from /proc); a name whose threads each used near a whole
//              core is where that row waited
//    p50 ms    Submit(wait) and a session's submit-and-wait, each in a loop of its own
//              taking turns with GetServerInfo (the no-op); vs no-op is the ratio of the
//              p50s
//    chain     RunChain of 100 steps, each the last one's output + 1 (temporaries),
//              --samples runs after 10 warm-ups, each timed alternately with a no-op: the
//              median wall time (and p99) against twice the median sum of the steps'
//              device times plus the p50 of the no-op timed beside Submit(wait) (the
//              round trip; the no-op between chain runs, slower, is shown too). The same
//              request each time, so that from its second run the server runs it
//              prepared, as one operation: once as the server launches it (on CUDA,
//              recorded once as CUDA graphs), once with every step launched on its own;
//              then with tags that change at every run, so that the server plans and
//              queues each run step by step (on CUDA, recording runs of 32 steps as
//              graphs each time)
//  memory (while the load's 8 buffers exist; CUDA only for the device columns): the whole
//  device's memory in use (cudaMemGetInfo; the benchmark process is the server) against
//  the bytes the buffers hold, and the target: overhead under 5% of the device + 256 MiB
#include <grpc/grpc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <future>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"
#include "client/cpp/shared_memory.h"
#include "client/cpp/transfer_timing.h"
#include "common/string_view.h"
#include "common/transfer_memory.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "server/core/backend.h"
#include "server/cpu/cpu_backend.h"
#include "server/expression/expression.h"
#include "server/server.h"
#include "server/util/status_macros.h"
#if defined(GPUCOMPUTE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/bench/reference_expression.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/cuda_check.h"
#endif

namespace gpucompute::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kExpression = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";
constexpr int kLatencyLog2n = 20;
constexpr int kLatencyWarmup = 10;
constexpr int kLoadClients = 4;
constexpr int kLoadChain = 100;

// ---------------------------------------------------------------------------
// Flags

struct Options {
  std::string backend = "cpu";
  int log2n = 24;
  std::vector<DType> dtypes = {DType::kFloat64, DType::kFloat32};
  int repeat = 5;
  bool kernels = true;
  bool transfers = true;
  bool e2e = true;
  bool sessions = true;
  int threads = 0;
  std::vector<int64_t> gemv = {2048, 4096};
  uint64_t transfer_mib = 0;  // 0: 2^log2n float64 elements
  int samples = 200;
  int session_ops = 20000;
  std::vector<int> session_clients = {1, 16};
  int graph_min_ops = 4;
  SessionHandler session_handler = SessionHandler::kCallback;
  std::optional<absl::Duration> lane_spin;  // unset: the server's default

  int64_t n() const { return int64_t{1} << log2n; }
  uint64_t transfer_bytes() const {
    return transfer_mib > 0 ? transfer_mib << 20 : static_cast<uint64_t>(n()) * sizeof(double);
  }
};

// A comma-separated list of integers in [min, max] from `text` (empty: none) into `out`.
absl::Status ParseIntList(std::string_view flag, const std::string& text, int64_t min,
                          int64_t max, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < min || v > max) {
      return absl::InvalidArgumentError(absl::StrCat(ToAbsl(flag), ": '", part,
                                                     "' is not an integer in [", min, ", ",
                                                     max, "]"));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

// Reads the flags (CLI11). Returns the exit status when the program should end at once:
// 0 after --help, 2 for a malformed flag.
std::optional<int> ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app(
      "gpucompute-bench: the kernels, the transfers and the RPC path, each against a\n"
      "ceiling measured in the same run. The GPU run: --backend=cuda --log2n=28\n"
      "--gemv=16384,32768. The columns are described at the top of bench/benchmark.cc.",
      "gpucompute-bench");
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  app.add_option("--log2n", o->log2n, "arrays have N = 2^log2n elements")
      ->check(CLI::Range(10, 34))
      ->capture_default_str();
  std::string dtype = "both";
  app.add_option("--dtype", dtype, "the kernels section's element type")
      ->check(CLI::IsMember({"float64", "float32", "both"}))
      ->capture_default_str();
  app.add_option("--repeat", o->repeat, "timed repetitions after one warm-up; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  // The lists are read as text, so that an empty one ("--gemv=") means none.
  std::string sections = "kernels,transfers,e2e,sessions";
  app.add_option("--sections", sections,
                 "comma-separated, of kernels, transfers, e2e, sessions (default: all)")
      ->expected(0, 1);
  app.add_option("--threads", o->threads, "CPU backend worker threads, 0: one per hardware thread")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  std::string gemv = "2048,4096";
  app.add_option("--gemv", gemv, "square gemv sizes, comma-separated (default 2048,4096; empty: none)")
      ->expected(0, 1);
  app.add_option("--transfer-mib", o->transfer_mib, "transfer size in MiB; 0: N float64 elements")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--samples", o->samples,
                 "RPCs timed for each e2e latency row (and each sessions latency row)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--session-ops", o->session_ops,
                 "operations each sessions throughput row sends in all")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  std::string session_clients = "1,16";
  app.add_option("--session-clients", session_clients,
                 "client counts of the sessions throughput rows, comma-separated (default 1,16)")
      ->expected(0, 1);
  app.add_option("--graph-min-ops", o->graph_min_ops,
                 "the server's --graph-min-ops (0: nothing is launched as a CUDA graph)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  std::string handler = "callback";
  app.add_option("--session-handler", handler, "the server's --session-handler")
      ->check(CLI::IsMember({"callback", "sync"}))
      ->capture_default_str();
  int64_t lane_spin_us = 0;
  CLI::Option* lane_spin = app.add_option(
      "--lane-spin-us", lane_spin_us,
      "the server's --lane-spin in microseconds (0: off; default: the server's)")
      ->check(CLI::Range(0, 1000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }

  o->dtypes = dtype == "float64"   ? std::vector<DType>{DType::kFloat64}
              : dtype == "float32" ? std::vector<DType>{DType::kFloat32}
                                   : std::vector<DType>{DType::kFloat64, DType::kFloat32};
  o->kernels = o->transfers = o->e2e = o->sessions = false;
  for (absl::string_view section : absl::StrSplit(sections, ',', absl::SkipEmpty())) {
    bool* wanted = section == "kernels"     ? &o->kernels
                   : section == "transfers" ? &o->transfers
                   : section == "e2e"       ? &o->e2e
                   : section == "sessions"  ? &o->sessions
                                            : nullptr;
    if (wanted == nullptr) {
      std::fprintf(stderr, "--sections: unknown section '%s' (use kernels, transfers, e2e, sessions)\n",
                   std::string(section).c_str());
      return 2;
    }
    *wanted = true;
  }
  std::vector<int64_t> clients;
  for (absl::Status status :
       {ParseIntList("--gemv", gemv, 1, int64_t{1} << 20, &o->gemv),
        ParseIntList("--session-clients", session_clients, 1, 256, &clients)}) {
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
      return 2;
    }
  }
  o->session_clients.assign(clients.begin(), clients.end());
  o->session_handler = *ParseSessionHandler(handler);
  if (lane_spin->count() > 0) o->lane_spin = absl::Microseconds(lane_spin_us);
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Backends: the one place that knows which backends this build has. A CUDA build adds
// its factory here; the server side is chosen by name through ServerOptions::backend.

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Options& options) {
  if (options.backend == "cpu") {
    return std::make_unique<cpu::CpuBackend>(static_cast<size_t>(options.threads));
  }
#if defined(GPUCOMPUTE_HAVE_CUDA)
  if (options.backend == "cuda") {
    cuda::CudaBackendOptions cuda_options;
    cuda_options.kernel_cache_dir = "";  // the first use is a warm-up either way
    return cuda::CreateCudaBackend(cuda_options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend=", options.backend, ": use cpu or cuda"));
#else
  return absl::InvalidArgumentError(
      absl::StrCat("--backend=", options.backend, ": this build has only the cpu backend"));
#endif
}

// ---------------------------------------------------------------------------
// Tables and statistics

// Rows of strings printed with aligned columns: the first `left` columns left-aligned
// (names), the others right-aligned (numbers).
class Table {
 public:
  Table(std::vector<std::string> header, size_t left) : header_(std::move(header)), left_(left) {}

  void AddRow(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }

  void Print(const std::string& title) const {
    std::vector<size_t> width(header_.size());
    for (size_t c = 0; c < header_.size(); ++c) {
      width[c] = header_[c].size();
      for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
    }
    auto line = [&](const std::vector<std::string>& cells) {
      std::string out;
      for (size_t c = 0; c < cells.size(); ++c) {
        const std::string pad(width[c] - cells[c].size(), ' ');
        if (c > 0) out += "  ";
        out += c < left_ ? cells[c] + pad : pad + cells[c];
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      std::printf("%s\n", out.c_str());
    };
    std::printf("\n== %s\n", title.c_str());
    line(header_);
    size_t total = 0;
    for (size_t w : width) total += w;
    std::printf("%s\n", std::string(total + 2 * (width.size() - 1), '-').c_str());
    for (const auto& row : rows_) line(row);
    std::fflush(stdout);
  }

 private:
  std::vector<std::string> header_;
  size_t left_;
  std::vector<std::vector<std::string>> rows_;
};

std::string Fixed(double v, int digits) { return absl::StrFormat("%.*f", digits, v); }

// Nearest-rank percentile, p in (0, 100].
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------
// Device timing through the Backend API

// Waits for the work enqueued on `stream` so far and returns the stream's error state.
absl::Status Synchronize(Stream& stream) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  RETURN_IF_ERROR(stream.OnComplete([done](absl::Status s) mutable { done->set_value(s); }));
  return result.get();
}

// Runs `enqueue` once as a warm-up (first-use costs: page faults, kernel compilation),
// then `repeat` times between events on `stream`, and returns the median device seconds.
absl::StatusOr<double> MedianDeviceSeconds(Backend& backend, Stream& stream, int repeat,
                                           const std::function<absl::Status()>& enqueue) {
  RETURN_IF_ERROR(enqueue());
  RETURN_IF_ERROR(Synchronize(stream));
  std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>> events;
  for (int r = 0; r < repeat; ++r) {
    ASSIGN_OR_RETURN(std::shared_ptr<Event> start, stream.Record());
    RETURN_IF_ERROR(enqueue());
    ASSIGN_OR_RETURN(std::shared_ptr<Event> end, stream.Record());
    events.emplace_back(std::move(start), std::move(end));
  }
  RETURN_IF_ERROR(Synchronize(stream));
  std::vector<double> seconds;
  for (const auto& [start, end] : events) {
    ASSIGN_OR_RETURN(double s, backend.ElapsedSeconds(*start, *end));
    seconds.push_back(s);
  }
  return Median(std::move(seconds));
}

// ---------------------------------------------------------------------------
// Section: kernels

struct KernelRow {
  std::string op;
  DType dtype;
  std::string size;
  double seconds = 0;
  double bytes = 0;
  double flops = 0;  // 0: not reported
  // The target: at least `min_vs_copy` of the copy's GB/s (0: none), or, for the
  // expression, no slower than the hand-written kernel's row.
  double min_vs_copy = 0;
  bool vs_hand_written = false;
};

#if defined(GPUCOMPUTE_HAVE_CUDA)
// The median device seconds of `repeat` runs of `enqueue` on a stream of its own, after a
// warm-up, timed with CUDA events: for work that goes around the Backend API.
absl::StatusOr<double> MedianCudaSeconds(int repeat,
                                         const std::function<cudaError_t(cudaStream_t)>& enqueue) {
  cudaStream_t stream = nullptr;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> events(2 * repeat);
  for (cudaEvent_t& e : events) GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(enqueue(stream));
  for (int r = 0; r < repeat; ++r) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * r], stream));
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(enqueue(stream));
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * r + 1], stream));
  }
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    float ms = 0;
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]));
    seconds.push_back(ms / 1e3);
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  return Median(std::move(seconds));
}

// The hand-written nvcc -O3 kernel of the reference expression.
absl::StatusOr<double> HandWrittenExpressionSeconds(DType dtype, const void* x, void* out,
                                                    int64_t n, int repeat) {
  return MedianCudaSeconds(repeat, [&](cudaStream_t stream) {
    return cuda::ReferenceExpressionAsync(dtype, x, out, n, stream);
  });
}
#endif

absl::Status RunKernelsForDType(const Options& options, Backend& backend, Stream& stream,
                                DType dtype, std::vector<KernelRow>& rows) {
  const int64_t n = options.n();
  const uint64_t item = DTypeSize(dtype);
  const uint64_t bytes = static_cast<uint64_t>(n) * item;
  const std::string n_text = absl::StrCat("2^", options.log2n);
  auto time = [&](const std::function<absl::Status()>& enqueue) {
    return MedianDeviceSeconds(backend, stream, options.repeat, enqueue);
  };

  ASSIGN_OR_RETURN(DeviceMemory x, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceMemory y, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceMemory out, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceMemory scalar, backend.Allocate(0, sizeof(double)));
  // x normal, so the expression sees both signs and magnitudes around 1; y uniform.
  RandomParams normal{.distribution = Distribution::kNormal, .seed = 1};
  RandomParams uniform{.distribution = Distribution::kUniform, .seed = 2};
  RETURN_IF_ERROR(backend.Random(stream, normal, dtype, x, n));
  RETURN_IF_ERROR(backend.Random(stream, uniform, dtype, y, n));
  RETURN_IF_ERROR(Synchronize(stream));

  {
    ASSIGN_OR_RETURN(double s, time([&] { return backend.Copy(stream, x, 0, out, 0, bytes); }));
    rows.push_back({"copy", dtype, n_text, s, 2.0 * bytes});
  }

  const std::map<std::string, const DeviceMemory*> arrays = {{"x", &x}, {"y", &y}};
  auto elementwise = [&](const std::string& op, const char* text, const expr::InputMap& inputs,
                         bool report_flops) -> absl::Status {
    ASSIGN_OR_RETURN(expr::Program program, expr::Compile(text, inputs));
    std::vector<const DeviceMemory*> bound;
    for (const std::string& name : program.inputs()) bound.push_back(arrays.at(name));
    ASSIGN_OR_RETURN(double s, time([&]() -> absl::Status {
                       return backend.Elementwise(stream, program, bound, out, dtype, n).status();
                     }));
    const double flops = report_flops ? static_cast<double>(program.ops_per_element()) * n : 0;
    rows.push_back({op, dtype, n_text, s, static_cast<double>(bytes) * (bound.size() + 1), flops});
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(elementwise("x + y", "x + y",
                              {{"x", expr::ArrayInput{dtype}}, {"y", expr::ArrayInput{dtype}}},
                              /*report_flops=*/false));
  rows.back().min_vs_copy = 0.95;
  for (const auto& [kind, op] :
       {std::pair{ReduceKind::kSum, "reduce sum"}, std::pair{ReduceKind::kMax, "reduce max"},
        std::pair{ReduceKind::kNorm2, "reduce norm2"}}) {
    const ReduceShape shape{.outer = 1, .extent = n, .inner = 1};
    ASSIGN_OR_RETURN(double s, time([&, kind = kind] {
                       return backend.Reduce(stream, kind, dtype, x, shape, scalar);
                     }));
    rows.push_back({op, dtype, n_text, s,
                    static_cast<double>(bytes + DTypeSize(ReduceResultDType(kind, dtype))), 0,
                    0.95});
  }

  RETURN_IF_ERROR(elementwise("expr", kExpression, {{"x", expr::ArrayInput{dtype}}},
                              /*report_flops=*/true));
#if defined(GPUCOMPUTE_HAVE_CUDA)
  if (backend.name() == "cuda") {
    // The two kernels are compared with each other, so they take turns: kTwinRounds
    // rounds of one median each, and each row keeps its fastest round. Neither then
    // gains from the order they run in.
    constexpr int kTwinRounds = 3;
    const size_t expr_row = rows.size() - 1;
    rows[expr_row].vs_hand_written = true;
    double hand_written = std::numeric_limits<double>::infinity();
    for (int round = 0; round < kTwinRounds; ++round) {
      if (round > 0) {
        RETURN_IF_ERROR(elementwise("expr", kExpression, {{"x", expr::ArrayInput{dtype}}},
                                    /*report_flops=*/true));
        rows[expr_row].seconds = std::min(rows[expr_row].seconds, rows.back().seconds);
        rows.pop_back();
      }
      ASSIGN_OR_RETURN(
          double s, HandWrittenExpressionSeconds(dtype, x.data(), out.data(), n, options.repeat));
      hand_written = std::min(hand_written, s);
    }
    rows.push_back(
        {"expr nvcc -O3", dtype, n_text, hand_written, 2.0 * bytes, rows[expr_row].flops});
  }
#endif

  // Gemv's matrix is allocated per size after the arrays above are no longer needed.
  x = DeviceMemory();
  y = DeviceMemory();
  for (int64_t m : options.gemv) {
    const uint64_t matrix_bytes = static_cast<uint64_t>(m) * static_cast<uint64_t>(m) * item;
    ASSIGN_OR_RETURN(DeviceMemory a, backend.Allocate(0, matrix_bytes));
    ASSIGN_OR_RETURN(DeviceMemory gx, backend.Allocate(0, m * item));
    ASSIGN_OR_RETURN(DeviceMemory gy, backend.Allocate(0, m * item));
    RETURN_IF_ERROR(backend.Random(stream, uniform, dtype, a, m * m));
    RETURN_IF_ERROR(backend.Random(stream, normal, dtype, gx, m));
    RETURN_IF_ERROR(Synchronize(stream));
    for (bool col_major : {false, true}) {
      for (bool transpose : {false, true}) {
        const GemvShape shape{.rows = m, .cols = m, .col_major = col_major, .transpose = transpose};
        ASSIGN_OR_RETURN(double s, time([&] {
                           return backend.Gemv(stream, dtype, shape, 1.0, a, gx, 0.0, gy);
                         }));
        rows.push_back({absl::StrCat("gemv ", col_major ? "F" : "C", transpose ? " A^T x" : " A x"),
                        dtype, absl::StrCat(m, "x", m), s,
                        static_cast<double>(matrix_bytes + 2 * m * item), 2.0 * m * m, 0.95});
      }
    }
  }

  for (const auto& [params, op, target] :
       {std::tuple{uniform, "random uniform", 0.95}, std::tuple{normal, "random normal", 0.85}}) {
    ASSIGN_OR_RETURN(double s, time([&, params = params] {
                       return backend.Random(stream, params, dtype, out, n);
                     }));
    rows.push_back({op, dtype, n_text, s, static_cast<double>(bytes), 0, target});
  }
  return absl::OkStatus();
}

absl::Status RunKernels(const Options& options, Backend& backend) {
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(0));
  std::vector<KernelRow> rows;
  for (DType dtype : options.dtypes) {
    RETURN_IF_ERROR(RunKernelsForDType(options, backend, *stream, dtype, rows));
  }
  std::map<DType, double> copy_gbps;
  for (const KernelRow& r : rows) {
    if (r.op == "copy") copy_gbps[r.dtype] = r.bytes / r.seconds / 1e9;
  }
  std::map<DType, double> hand_written_seconds;
  for (const KernelRow& r : rows) {
    if (r.op == "expr nvcc -O3") hand_written_seconds[r.dtype] = r.seconds;
  }
  Table table({"op", "dtype", "size", "ms", "GB/s", "vs copy", "GFLOP/s", "target", "met"}, 3);
  for (const KernelRow& r : rows) {
    const double gbps = r.bytes / r.seconds / 1e9;
    const double vs_copy = gbps / copy_gbps[r.dtype];
    std::string target, met;
    if (r.min_vs_copy > 0) {
      target = absl::StrCat(">= ", Fixed(r.min_vs_copy, 2), " copy");
      met = vs_copy >= r.min_vs_copy ? "yes" : "NO";
    } else if (r.vs_hand_written && hand_written_seconds.count(r.dtype) > 0) {
      const double ratio = hand_written_seconds[r.dtype] / r.seconds;
      target = absl::StrCat(">= nvcc (", Fixed(ratio, 3), "x)");
      met = ratio >= 1.0 ? "yes" : "NO";
    }
    table.AddRow({r.op, DTypeName(r.dtype), r.size, Fixed(r.seconds * 1e3, 3), Fixed(gbps, 2),
                  Fixed(vs_copy, 3), r.flops > 0 ? Fixed(r.flops / r.seconds / 1e9, 2) : "", target,
                  met});
  }
  table.Print(absl::StrCat("kernels: device time, median of ", options.repeat,
                           ", ratio to the device-to-device copy"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Sections on the server: transfers and e2e

// `transfer_streams` as ClientOptions has it: 0 lets the library choose.
absl::StatusOr<std::unique_ptr<Client>> Connect(const Server& server, const std::string& name,
                                                int transfer_streams = 0) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", server.port());
  options.client_name = name;
  options.transfer_streams = transfer_streams;
  options.timeout = absl::Seconds(600);  // a hung server ends the run instead of hanging it
  return Client::Connect(options);
}

// The operation's own failure, as a status.
absl::Status Succeeded(const absl::StatusOr<v1::Operation>& op) {
  if (!op.ok()) return op.status();
  if (op->state() != v1::Operation::STATE_SUCCEEDED) {
    return absl::Status(static_cast<absl::StatusCode>(op->error_code()),
                        absl::StrCat("operation ", op->id(), " failed: ", op->error_message()));
  }
  return absl::OkStatus();
}

// The transfer ceilings: the backend's own host-to-device and device-to-host copies of
// the transfer size, from and to pageable host memory, as the server's transfers are.
struct CopyCeilings {
  double h2d_seconds = 0;
  double d2h_seconds = 0;
  double pinned_h2d_seconds = 0;  // CUDA: a DMA copy from page-locked memory; 0 elsewhere
};

#if defined(GPUCOMPUTE_HAVE_CUDA)
// The link's ceiling: cudaMemcpyAsync of `bytes` from page-locked host memory to the
// device.
absl::StatusOr<double> PinnedHostToDeviceSeconds(uint64_t bytes, int repeat) {
  void* host = nullptr;
  void* device = nullptr;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  std::memset(host, 1, bytes);
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaMalloc(&device, bytes));
  absl::StatusOr<double> seconds = MedianCudaSeconds(repeat, [&](cudaStream_t stream) {
    return cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream);
  });
  cudaFree(device);
  cudaFreeHost(host);
  return seconds;
}
#endif

absl::StatusOr<CopyCeilings> MeasureCopyCeilings(const Options& options, Backend& backend) {
  const uint64_t bytes = options.transfer_bytes();
  const std::vector<char> source = TransferSource(bytes);
  std::vector<char> sink(bytes, 1);
  CopyCeilings c;
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(0));
  ASSIGN_OR_RETURN(DeviceMemory device, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(c.h2d_seconds, MedianDeviceSeconds(backend, *stream, options.repeat, [&] {
                     return backend.CopyFromHost(*stream, source.data(), device, 0, bytes);
                   }));
  ASSIGN_OR_RETURN(c.d2h_seconds, MedianDeviceSeconds(backend, *stream, options.repeat, [&] {
                     return backend.CopyToHost(*stream, device, 0, sink.data(), bytes);
                   }));
#if defined(GPUCOMPUTE_HAVE_CUDA)
  if (backend.name() == "cuda") {
    ASSIGN_OR_RETURN(c.pinned_h2d_seconds, PinnedHostToDeviceSeconds(bytes, options.repeat));
  }
#endif
  return c;
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

// ---------------------------------------------------------------------------
// Section: sessions

constexpr uint64_t kSmallN = 1024;
constexpr int kAsyncWindow = 64;
constexpr int kChainSteps = 100;

// x (ones) and y, float32[kSmallN], on the client's default stream, for SmallAdd.
absl::Status PrepareSmall(Client& client) {
  for (const char* name : {"x", "y"}) {
    v1::CreateBufferRequest request;
    request.set_dtype(v1::DTYPE_FLOAT32);
    request.add_shape(kSmallN);
    request.set_name(name);
    request.mutable_fill()->set_float_value(1.0);
    RETURN_IF_ERROR(client.CreateBuffer(request).status());
  }
  ASSIGN_OR_RETURN(bool idle, client.SynchronizeStream(""));
  if (!idle) return absl::DeadlineExceededError("the stream did not go idle");
  return absl::OkStatus();
}

absl::Status DeleteSmall(Client& client) {
  RETURN_IF_ERROR(client.DeleteBuffer("x"));
  return client.DeleteBuffer("y");
}

// y = x + 1: the small operation of this section.
v1::SubmitRequest SmallAdd() {
  return Elementwise("x + 1", {{"x", BufferOperand("x")}}, ExistingOutput("y"));
}

// The ceiling of the sessions rows: what the backend alone does with the same operation,
// with no executor, RPC or client. Each of `streams` threads enqueues `each` x + 1
// operations on a stream of its own, each between two events and completed on its end
// event, as the executor does, with at most kSessionCeilingWindow in flight.
constexpr int kSessionCeilingWindow = 64;

absl::StatusOr<double> BackendOpsPerSecond(Backend& backend, int streams, int each) {
  ASSIGN_OR_RETURN(expr::Program program,
                   expr::Compile("x + 1", {{"x", expr::ArrayInput{DType::kFloat32}}}));
  RETURN_IF_ERROR(backend.PrepareElementwise(program, DType::kFloat32).status());
  std::latch ready(streams + 1);
  std::latch go(1);
  std::vector<absl::Status> statuses(streams);
  std::vector<std::thread> threads;
  for (int t = 0; t < streams; ++t) {
    threads.emplace_back([&, t] {
      statuses[t] = [&]() -> absl::Status {
        absl::StatusOr<std::unique_ptr<Stream>> stream = backend.CreateStream(0);
        absl::StatusOr<DeviceMemory> x = backend.Allocate(0, kSmallN * 4);
        absl::StatusOr<DeviceMemory> y = backend.Allocate(0, kSmallN * 4);
        ready.count_down();
        go.wait();
        RETURN_IF_ERROR(stream.status());
        RETURN_IF_ERROR(x.status());
        RETURN_IF_ERROR(y.status());
        const DeviceMemory* inputs[] = {&*x};
        absl::Mutex mu;
        int done = 0;
        absl::Status failed;
        for (int k = 0; k < each; ++k) {
          {
            absl::MutexLock lock(&mu);
            auto room = [&] { return done > k - kSessionCeilingWindow; };
            mu.Await(absl::Condition(&room));
          }
          ASSIGN_OR_RETURN(std::shared_ptr<Event> start, (*stream)->Record());
          RETURN_IF_ERROR(
              backend.Elementwise(**stream, program, inputs, *y, DType::kFloat32, kSmallN)
                  .status());
          ASSIGN_OR_RETURN(std::shared_ptr<Event> end, (*stream)->Record());
          RETURN_IF_ERROR((*stream)->OnEvent(end, [&, start, end](absl::Status s) {
            (void)backend.ElapsedSeconds(*start, *end);
            absl::MutexLock lock(&mu);
            if (!s.ok()) failed = s;
            ++done;
          }));
        }
        absl::MutexLock lock(&mu);
        auto all_done = [&] { return done == each; };
        mu.Await(absl::Condition(&all_done));
        return failed;
      }();
    });
  }
  ready.arrive_and_wait();
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double wall = SecondsSince(start);
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  return streams * each / wall;
}

// CPU seconds of this process's threads, for a breakdown of where a row's time went:
// per thread id, its name and utime + stime (/proc/self/task); and the whole process's.
struct ThreadCpu {
  std::map<int, std::pair<std::string, double>> threads;
  double process = 0;
};

double TicksToSeconds(const std::string& stat, int utime_field) {
  // Fields after the name, which is in parentheses and may hold blanks.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  // utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
  const size_t at = static_cast<size_t>(utime_field - 3);
  double utime = 0, stime = 0;
  if (fields.size() <= at + 1 || !absl::SimpleAtod(fields[at], &utime) ||
      !absl::SimpleAtod(fields[at + 1], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

ThreadCpu SampleThreadCpu() {
  ThreadCpu cpu;
  cpu.process = TicksToSeconds(ReadSmallFile("/proc/self/stat"), 14);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    const std::string dir = entry.path().string();
    cpu.threads[tid] = {ReadSmallFile(dir + "/comm"),
                        TicksToSeconds(ReadSmallFile(dir + "/stat"), 14)};
  }
  return cpu;
}

// "name xN: S s (F of a core each)" for each thread name alive at the end, busiest
// first, then the rest of the process (threads that ended meanwhile: a row's clients).
std::string ThreadCpuSummary(const ThreadCpu& before, const ThreadCpu& after, double wall) {
  std::map<std::string, std::pair<int, double>> by_name;
  double named = 0;
  for (const auto& [tid, thread] : after.threads) {
    auto it = before.threads.find(tid);
    const double used = thread.second - (it == before.threads.end() ? 0 : it->second.second);
    auto& [count, seconds] = by_name[thread.first];
    ++count;
    seconds += used;
    named += used;
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> sorted(by_name.begin(),
                                                                     by_name.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::vector<std::string> parts;
  for (const auto& [name, usage] : sorted) {
    if (usage.second < 0.01 * wall) continue;
    parts.push_back(absl::StrFormat("%s x%d %.2f s (%.2f each)", name, usage.first, usage.second,
                                    usage.second / usage.first / wall));
  }
  parts.push_back(absl::StrFormat("threads that ended %.2f s",
                                  std::max(0.0, after.process - before.process - named)));
  return absl::StrCat(absl::StrFormat("wall %.2f s; CPU: ", wall), absl::StrJoin(parts, ", "));
}

// Operations per second through one session per client, `clients` clients on threads of
// their own sending `total` operations in all, from the first submission to the last
// answer.
absl::StatusOr<double> SessionOpsPerSecond(const Server& server, int clients, int total,
                                           std::string* thread_cpu) {
  std::vector<std::unique_ptr<Client>> connected;
  for (int i = 0; i < clients; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Connect(server, absl::StrCat("bench-session-", i)));
    RETURN_IF_ERROR(PrepareSmall(*client));
    connected.push_back(std::move(client));
  }
  const int each = std::max(1, total / clients);
  std::vector<std::unique_ptr<Session>> sessions;
  for (const auto& client : connected) {
    ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(*client));
    sessions.push_back(std::move(session));
  }
  std::latch go(1);
  std::vector<absl::Status> statuses(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      go.wait();
      std::vector<OperationFuture> futures;
      futures.reserve(each);
      for (int k = 0; k < each; ++k) futures.push_back(sessions[i]->Submit(SmallAdd()).result);
      statuses[i] = sessions[i]->Close();
      for (const OperationFuture& f : futures) {
        if (statuses[i].ok()) statuses[i] = Succeeded(f.Get());
      }
    });
  }
  const ThreadCpu cpu_before = SampleThreadCpu();
  const Clock::time_point start = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double wall = SecondsSince(start);
  *thread_cpu = ThreadCpuSummary(cpu_before, SampleThreadCpu(), wall);
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  for (const auto& client : connected) RETURN_IF_ERROR(DeleteSmall(*client));
  return clients * each / wall;
}

// Operations per second of one client's SubmitAsync with kAsyncWindow in flight.
absl::StatusOr<double> AsyncOpsPerSecond(const Server& server, int total) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-async"));
  RETURN_IF_ERROR(PrepareSmall(*client));
  std::deque<OperationFuture> window;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < total; ++i) {
    if (window.size() == kAsyncWindow) {
      RETURN_IF_ERROR(Succeeded(window.front().Get()));
      window.pop_front();
    }
    window.push_back(client->SubmitAsync(SmallAdd()));
  }
  for (const OperationFuture& f : window) RETURN_IF_ERROR(Succeeded(f.Get()));
  const double wall = SecondsSince(start);
  RETURN_IF_ERROR(DeleteSmall(*client));
  return total / wall;
}

// The wall time of one GetServerInfo, the no-op.
absl::StatusOr<double> TimeNoop(Client& client) {
  const Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(client.GetServerInfo().status());
  return SecondsSince(start);
}

struct SmallLatencies {
  // Submit(wait) and the no-op timed just before each; a session's submit-and-wait and
  // the no-op timed just before each.
  std::vector<double> submit, submit_noop, session, session_noop, device;
};

// Submit(wait) taking turns with GetServerInfo, then a session's submit-and-wait taking
// turns with GetServerInfo: each against no-ops timed beside it, in a loop of its own. A
// session's streams are still busy for a while after its answer, which slows a no-op
// timed right after it, so the two are not mixed.
absl::StatusOr<SmallLatencies> MeasureSmallLatencies(const Options& options, Client& client) {
  v1::SubmitRequest waiting = SmallAdd();
  waiting.set_wait(true);
  SmallLatencies l;
  for (int i = 0; i < kLatencyWarmup + options.samples; ++i) {
    ASSIGN_OR_RETURN(const double before, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::Operation> op = client.Submit(waiting);
    const double wall = SecondsSince(start);
    RETURN_IF_ERROR(Succeeded(op));
    if (i < kLatencyWarmup) continue;
    l.submit_noop.push_back(before);
    l.submit.push_back(wall);
    l.device.push_back(op->timing().device_seconds());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(client));
  for (int i = 0; i < kLatencyWarmup + options.samples; ++i) {
    ASSIGN_OR_RETURN(const double before, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    const absl::StatusOr<v1::Operation> answered = session->Submit(SmallAdd()).result.Get();
    const double wall = SecondsSince(start);
    RETURN_IF_ERROR(Succeeded(answered));
    if (i < kLatencyWarmup) continue;
    l.session_noop.push_back(before);
    l.session.push_back(wall);
  }
  RETURN_IF_ERROR(session->Close());
  return l;
}

struct ChainTimes {
  double wall = 0;    // median
  double wall99 = 0;  // p99
  double device = 0;  // median of the sums of the steps' device times
  double noop = 0;    // median of the no-ops timed alternately with the runs
};

// A chain of kChainSteps: kChainSteps - 1 increments, each of the last one's output,
// then the max of the last, checked. Its tags carry `run` when not empty.
Chain SmallChain(bool separate_launches, const std::string& run) {
  Chain chain;
  chain.SeparateLaunches(separate_launches);
  auto tag = [&](int k) { return run.empty() ? std::string() : absl::StrCat(run, "-", k); };
  std::string last = chain.Add(Elementwise("x + 1", {{"x", BufferOperand("x")}}), tag(0));
  for (int k = 1; k < kChainSteps - 1; ++k) {
    last = chain.Add(Elementwise("s + 1", {{"s", BufferOperand(TagRef(last))}}), tag(k));
  }
  chain.Add(Reduce(v1::REDUCE_KIND_MAX, TagRef(last)), tag(kChainSteps - 1));
  return chain;
}

// The chain run options.samples times after warm-ups, each run timed alternately with
// the no-op: the same request each time (prepared from its second run, a warm-up), or
// with `fresh` one the server has not seen (planned at every run).
absl::StatusOr<ChainTimes> MeasureChain(const Options& options, Client& client,
                                        bool separate_launches, bool fresh) {
  const Chain same = SmallChain(separate_launches, "");
  std::vector<double> walls, devices, noops;
  for (int r = 0; r < kLatencyWarmup + options.samples; ++r) {
    const Chain chain = fresh ? SmallChain(separate_launches, absl::StrCat("r", r)) : same;
    ASSIGN_OR_RETURN(const double noop, TimeNoop(client));
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(v1::ChainResponse response, chain.Run(client));
    const double wall = SecondsSince(start);
    double device = 0;
    for (const v1::ChainStepResult& step : response.steps()) {
      RETURN_IF_ERROR(Succeeded(step.operation()));
      device += step.operation().timing().device_seconds();
    }
    const v1::Operation& max = response.steps(kChainSteps - 1).operation();
    if (max.values_size() != 1 || max.values(0).float_value() != kChainSteps) {
      return absl::InternalError("the chain's last step did not give its reference value");
    }
    if (r < kLatencyWarmup) continue;
    walls.push_back(wall);
    devices.push_back(device);
    noops.push_back(noop);
  }
  return ChainTimes{Median(walls), Percentile(walls, 99), Median(devices), Median(noops)};
}

// The backend alone on as many streams as each sessions row has clients
// (BackendOpsPerSecond), in the order of --session-clients.
using SessionCeilings = std::vector<double>;

absl::StatusOr<SessionCeilings> MeasureSessionCeilings(const Options& options, Backend& backend) {
  SessionCeilings c;
  for (int streams : options.session_clients) {
    ASSIGN_OR_RETURN(double ops, BackendOpsPerSecond(backend, streams,
                                                     std::max(1, options.session_ops / streams)));
    c.push_back(ops);
  }
  return c;
}

// The target of a sessions throughput row, where the project sets one.
std::optional<double> SessionTarget(int clients) {
  if (clients == 1) return 50000;
  if (clients == 16) return 150000;
  return std::nullopt;
}

absl::Status RunSessions(const Options& options, const SessionCeilings& ceilings,
                         const Server& server) {
  const int total = options.session_ops;
  std::vector<double> throughput;
  std::vector<std::string> thread_cpu;
  for (int clients : options.session_clients) {
    ASSIGN_OR_RETURN(double ops, SessionOpsPerSecond(server, clients, total,
                                                     &thread_cpu.emplace_back()));
    throughput.push_back(ops);
  }
  ASSIGN_OR_RETURN(double async, AsyncOpsPerSecond(server, std::min(total, 5000)));

  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, "bench-session-latency"));
  RETURN_IF_ERROR(PrepareSmall(*client));
  ASSIGN_OR_RETURN(SmallLatencies l, MeasureSmallLatencies(options, *client));
  ASSIGN_OR_RETURN(ChainTimes chain, MeasureChain(options, *client, false, false));
  ASSIGN_OR_RETURN(ChainTimes separate, MeasureChain(options, *client, true, false));
  ASSIGN_OR_RETURN(ChainTimes planned, MeasureChain(options, *client, false, true));
  RETURN_IF_ERROR(DeleteSmall(*client));

  const double noop50 = Percentile(l.submit_noop, 50);
  const double submit_ratio = Percentile(l.submit, 50) / noop50;
  const double session_noop50 = Percentile(l.session_noop, 50);
  const double session_ratio = Percentile(l.session, 50) / session_noop50;
  // The round trip is the no-op timed beside Submit(wait): one timed right after a
  // chain's answer is slower (the server is still finishing the chain), which would
  // loosen the bound by as much.
  auto bound = [&](const ChainTimes& c) { return 2 * c.device + noop50; };
  Table table({"measure", "value", "p99 ms", "vs", "target", "met"}, 1);
  auto met = [](bool ok) { return std::string(ok ? "yes" : "NO"); };
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    const int clients = options.session_clients[i];
    table.AddRow({absl::StrCat("backend alone, ", clients, clients == 1 ? " stream" : " streams",
                               " (ops/s)"),
                  Fixed(ceilings[i], 0), "", "ceiling", "", ""});
  }
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    const int clients = options.session_clients[i];
    const std::optional<double> target = SessionTarget(clients);
    table.AddRow({absl::StrCat(clients == 1 ? "session, " : "sessions, ", clients,
                               clients == 1 ? " client" : " clients", " (ops/s)"),
                  Fixed(throughput[i], 0), "",
                  absl::StrCat(Fixed(throughput[i] / ceilings[i], 2), " of the backend alone"),
                  target ? absl::StrCat(">= ", Fixed(*target, 0)) : "",
                  target ? met(throughput[i] >= *target) : ""});
  }
  // Against one session, where a row has one client.
  std::string async_vs;
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    if (options.session_clients[i] == 1)
      async_vs = absl::StrCat(Fixed(throughput[i] / async, 1), "x slower than session");
  }
  table.AddRow({absl::StrCat("SubmitAsync, 1 client, ", kAsyncWindow, " in flight (ops/s)"),
                Fixed(async, 0), "", async_vs, "", ""});
  table.AddRow({"Submit(wait) p50 ms", Fixed(Percentile(l.submit, 50) * 1e3, 3),
                Fixed(Percentile(l.submit, 99) * 1e3, 3),
                absl::StrCat(Fixed(submit_ratio, 2), "x no-op"), "<= 1.2x",
                met(submit_ratio <= 1.2)});
  table.AddRow({"session submit+wait p50 ms", Fixed(Percentile(l.session, 50) * 1e3, 3),
                Fixed(Percentile(l.session, 99) * 1e3, 3),
                absl::StrCat(Fixed(session_ratio, 2), "x its no-op (",
                             Fixed(session_noop50 * 1e3, 3), " ms)"),
                "<= 1.2x", met(session_ratio <= 1.2)});
  table.AddRow({"GetServerInfo (no-op) p50 ms", Fixed(noop50 * 1e3, 3),
                Fixed(Percentile(l.submit_noop, 99) * 1e3, 3), "beside Submit(wait)", "", ""});
  table.AddRow(
      {"device time of one x + 1, median ms", Fixed(Median(l.device) * 1e3, 4), "", "", "", ""});
  auto chain_row = [&](std::string name, const ChainTimes& c, std::string vs) {
    table.AddRow({std::move(name), Fixed(c.wall * 1e3, 3), Fixed(c.wall99 * 1e3, 3),
                  absl::StrCat("device sum ", Fixed(c.device * 1e3, 3), " ms; no-op ",
                               Fixed(c.noop * 1e3, 3), " ms between runs", vs),
                  absl::StrCat("<= 2x device + no-op = ", Fixed(bound(c) * 1e3, 3)),
                  met(c.wall <= bound(c))});
  };
  chain_row(absl::StrCat("chain of ", kChainSteps, " steps, wall ms"), chain, "");
  chain_row("same chain, each step launched alone, ms", separate,
            absl::StrCat("; ", Fixed(separate.wall / chain.wall, 2), "x the chain above"));
  chain_row("same chain, planned at every run, ms", planned,
            absl::StrCat("; ", Fixed(planned.wall / chain.wall, 2), "x the chain above"));
  table.Print(absl::StrCat("sessions: x + 1 on ", kSmallN, " float32 values; ", total,
                           " operations per throughput row, ", options.samples,
                           " alternating samples per latency row; the server's --lane-spin: ",
                           options.lane_spin ? absl::FormatDuration(*options.lane_spin)
                                             : "its default"));
  // Where each throughput row's CPU went, by thread name: a thread class near one core
  // each is the row's bottleneck.
  for (size_t i = 0; i < options.session_clients.size(); ++i) {
    std::printf("%d client(s): %s\n", options.session_clients[i], thread_cpu[i].c_str());
  }
  return absl::OkStatus();
}

absl::Status Run(const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(options));
  const DeviceDescription& device = backend->devices().at(0);
  // Host threads the backend uses (--threads=0: one per hardware thread), and the
  // device's compute units (worker threads on the CPU, multiprocessors on a GPU).
  const unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads)
                                               : std::thread::hardware_concurrency();
  const std::string date =
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
  std::printf(
      "gpucompute-bench  backend=%s  device=\"%s\"  threads=%u  compute_units=%d  date=%s\n",
      std::string(backend->name()).c_str(), device.name.c_str(), threads, device.compute_units,
      date.c_str());
  std::vector<std::string> dtypes;
  for (DType d : options.dtypes) dtypes.push_back(DTypeName(d));
  std::printf("log2n=%d (N=%lld)  dtype=%s  repeat=%d  gemv=%s  transfer=%.1f MiB  samples=%d\n",
              options.log2n, static_cast<long long>(options.n()),
              absl::StrJoin(dtypes, ",").c_str(), options.repeat,
              absl::StrJoin(options.gemv, ",").c_str(), options.transfer_bytes() / double(1 << 20),
              options.samples);
  std::fflush(stdout);

  if (options.kernels) RETURN_IF_ERROR(RunKernels(options, *backend));
  if (!options.transfers && !options.e2e && !options.sessions) return absl::OkStatus();
  CopyCeilings ceilings;
  if (options.transfers) {
    ASSIGN_OR_RETURN(ceilings, MeasureCopyCeilings(options, *backend));
  }
  SessionCeilings session_ceilings;
  if (options.sessions) {
    ASSIGN_OR_RETURN(session_ceilings, MeasureSessionCeilings(options, *backend));
  }
  // The server gets the device to itself: this backend's memory goes back first.
  backend.reset();

  ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.backend = options.backend;
  server_options.cpu_threads = options.threads;
  server_options.allow_shared_memory = true;  // the shm rows; client and server share a host
  server_options.graph_min_ops = static_cast<size_t>(options.graph_min_ops);
  server_options.session_handler = options.session_handler;
  server_options.lane_spin = options.lane_spin;
  ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(server_options));
  if (options.transfers) RETURN_IF_ERROR(RunTransfers(options, ceilings, *server));
  if (options.e2e) {
    RETURN_IF_ERROR(RunLatency(options, *server));
    RETURN_IF_ERROR(RunLoad(options, *server));
  }
  if (options.sessions) RETURN_IF_ERROR(RunSessions(options, session_ceilings, *server));
  return absl::OkStatus();
}

}  // namespace
}  // namespace gpucompute::bench

int main(int argc, char** argv) {
  gpucompute::RetainTransferMemory();
  // As the server does (server/main.cc).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gpucompute::bench::Options options;
  if (std::optional<int> exit_code = gpucompute::bench::ParseOptions(argc, argv, &options)) {
    return *exit_code;
  }
  // One gRPC reference held for the whole run and never released: when the last gRPC
  // object goes, grpc_shutdown() joins gRPC's executor threads, which can stall for seconds
  // (see tests/support/test_server.h); the process is ending anyway.
  grpc_init();
  const absl::Status status = gpucompute::bench::Run(options);
  if (!status.ok()) {
    std::fprintf(stderr, "gpucompute-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

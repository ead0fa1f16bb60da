// gpucompute-bench: how fast the kernels, the transfers and the RPC path are, each
// reported as a fraction of a ceiling measured in the same run on the same machine. A
// benchmark program that prints tables, not a test: nothing here passes or fails on time.
//
// Run (defaults shown; the defaults fit a small CPU machine in about a minute):
//   gpucompute-bench --backend=cpu --log2n=24 --dtype=both --repeat=5
//       --sections=kernels,transfers,buffers,e2e --threads=0 --gemv=2048,4096
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
//  buffers (the same server, one client, --repeat timed calls after one warm-up, median):
//    op        `create` is CreateBuffer of 2^log2n float64 (unfilled: the server zeroes
//              it; fill: every element 1.5) followed by SynchronizeStream of the client's
//              default stream, where the fill runs, timed from the client: the cost of a
//              new buffer that is ready to read; `d2d copy` is Backend::Copy of the same
//              bytes between two device buffers, before the server starts
//    MiB       the buffer's bytes / 2^20
//    ms        wall time of create + synchronize; device time for the copy
//    GB/s      bytes written / ms, 1e9 bytes: the buffer's bytes for a create; the bytes
//              read plus those written (twice the buffer's) for the copy, the device's
//              memory bandwidth in practice
//    vs copy   GB/s / the copy's GB/s: 1.0 would be a fill at memory bandwidth with no
//              call around it
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
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/benchmark.h"
#include "client/cpp/client.h"
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

namespace {

constexpr const char* kExpression = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";

// ---------------------------------------------------------------------------
// Flags

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
  std::string sections = "kernels,arrays,transfers,buffers,e2e,sessions";
  app.add_option("--sections", sections,
                 "comma-separated, of kernels, arrays, transfers, buffers, e2e, sessions "
                 "(default: all)")
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
  o->kernels = o->arrays = o->transfers = o->buffers = o->e2e = o->sessions = false;
  for (absl::string_view section : absl::StrSplit(sections, ',', absl::SkipEmpty())) {
    bool* wanted = section == "kernels"     ? &o->kernels
                   : section == "arrays"    ? &o->arrays
                   : section == "transfers" ? &o->transfers
                   : section == "buffers"   ? &o->buffers
                   : section == "e2e"       ? &o->e2e
                   : section == "sessions"  ? &o->sessions
                                            : nullptr;
    if (wanted == nullptr) {
      std::fprintf(stderr,
                   "--sections: unknown section '%s' (use kernels, arrays, transfers, buffers, "
                   "e2e, sessions)\n",
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

  // Normals with the newest transform, v3, which holds the target, and with v2 (the
  // clients' default) and v1 (what requests that name none get), kept for their bits.
  RandomParams normal_v3 = normal;
  normal_v3.normal_transform = NormalTransform::kInverseCdfV3;
  RandomParams normal_v2 = normal;
  normal_v2.normal_transform = NormalTransform::kBoxMullerV2;
  for (const auto& [params, op, target] :
       {std::tuple{uniform, "random uniform", 0.95}, std::tuple{normal_v3, "random normal", 0.85},
        std::tuple{normal_v2, "random normal v2", 0.0},
        std::tuple{normal, "random normal v1", 0.0}}) {
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
// Sections on the server: transfers, buffers and e2e

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

// The buffers section's ceiling: Backend::Copy of 2^log2n float64 from one device buffer
// to another, in device seconds.
absl::StatusOr<double> DeviceCopySeconds(const Options& options, Backend& backend) {
  const uint64_t bytes = static_cast<uint64_t>(options.n()) * sizeof(double);
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(0));
  ASSIGN_OR_RETURN(DeviceMemory src, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceMemory dst, backend.Allocate(0, bytes));
  return MedianDeviceSeconds(backend, *stream, options.repeat,
                             [&] { return backend.Copy(*stream, src, 0, dst, 0, bytes); });
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
  if (options.arrays) RETURN_IF_ERROR(RunArrays(options, *backend));
  if (!options.transfers && !options.buffers && !options.e2e && !options.sessions) {
    return absl::OkStatus();
  }
  CopyCeilings ceilings;
  if (options.transfers) {
    ASSIGN_OR_RETURN(ceilings, MeasureCopyCeilings(options, *backend));
  }
  double copy_seconds = 0;
  if (options.buffers) {
    ASSIGN_OR_RETURN(copy_seconds, DeviceCopySeconds(options, *backend));
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
  server_options.lane_spin = options.lane_spin;
  ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(server_options));
  if (options.transfers) RETURN_IF_ERROR(RunTransfers(options, ceilings, *server));
  if (options.buffers) RETURN_IF_ERROR(RunBuffers(options, copy_seconds, *server));
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

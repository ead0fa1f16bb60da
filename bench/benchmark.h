// What the sections of gpucompute-bench share: the options its flags set, the table it
// prints, the statistics, the in-process server's clients, and each section's entry
// point. The kernels section and the program are in benchmark.cc (whose opening
// comment describes every column), the transfers and e2e sections in
// server_sections.cc, the sessions section in sessions.cc.
#ifndef GPUCOMPUTE_BENCH_BENCHMARK_H_
#define GPUCOMPUTE_BENCH_BENCHMARK_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/server.h"

namespace gpucompute::bench {

using Clock = std::chrono::steady_clock;

inline constexpr int kLatencyWarmup = 10;

struct Options {
  std::string backend = "cpu";
  int log2n = 24;
  std::vector<DType> dtypes = {DType::kFloat64, DType::kFloat32};
  int repeat = 5;
  bool kernels = true;
  bool arrays = true;
  bool transfers = true;
  bool buffers = true;
  bool e2e = true;
  bool sessions = true;
  int threads = 0;
  std::vector<int64_t> gemv = {2048, 4096};
  uint64_t transfer_mib = 0;  // 0: 2^log2n float64 elements
  int samples = 200;
  int session_ops = 20000;
  std::vector<int> session_clients = {1, 16};
  int graph_min_ops = 4;
  std::optional<absl::Duration> lane_spin;  // unset: the server's default

  int64_t n() const { return int64_t{1} << log2n; }
  uint64_t transfer_bytes() const {
    return transfer_mib > 0 ? transfer_mib << 20 : static_cast<uint64_t>(n()) * sizeof(double);
  }
};

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

inline std::string Fixed(double v, int digits) { return absl::StrFormat("%.*f", digits, v); }

// Nearest-rank percentile, p in (0, 100].
inline double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------
// Device timing through the Backend API (benchmark.cc)

// Waits for the work enqueued on `stream` so far and returns the stream's error state.
absl::Status Synchronize(Stream& stream);
// Runs `enqueue` once as a warm-up (first-use costs: page faults, kernel compilation),
// then `repeat` times between events on `stream`, and returns the median device seconds.
absl::StatusOr<double> MedianDeviceSeconds(Backend& backend, Stream& stream, int repeat,
                                           const std::function<absl::Status()>& enqueue);

// The arrays section (arrays.cc): NumPy's array semantics on the device.
absl::Status RunArrays(const Options& options, Backend& backend);

// ---------------------------------------------------------------------------
// The transfers, buffers and e2e sections (server_sections.cc)

// A client of the benchmark's in-process server. `transfer_streams` as ClientOptions
// has it: 0 lets the library choose.
absl::StatusOr<std::unique_ptr<Client>> Connect(const Server& server, const std::string& name,
                                                int transfer_streams = 0);
// The operation's own failure, as a status.
absl::Status Succeeded(const absl::StatusOr<v1::Operation>& op);

// The transfer ceilings: the backend's own host-to-device and device-to-host copies of
// the transfer size, from and to pageable host memory, as the server's transfers are.
struct CopyCeilings {
  double h2d_seconds = 0;
  double d2h_seconds = 0;
  double pinned_h2d_seconds = 0;  // CUDA: a DMA copy from page-locked memory; 0 elsewhere
};

absl::Status RunTransfers(const Options& options, const CopyCeilings& ceilings,
                          const Server& server);
// CreateBuffer of 2^log2n float64 without and with fill, each until its stream is done,
// against the device-to-device copy of `copy_seconds`.
absl::Status RunBuffers(const Options& options, double copy_seconds, const Server& server);
absl::Status RunLatency(const Options& options, const Server& server);
absl::Status RunLoad(const Options& options, const Server& server);

// ---------------------------------------------------------------------------
// The sessions section (sessions.cc)

// The backend alone on as many streams as each sessions row has clients
// (BackendOpsPerSecond), in the order of --session-clients.
using SessionCeilings = std::vector<double>;

absl::StatusOr<SessionCeilings> MeasureSessionCeilings(const Options& options, Backend& backend);
absl::Status RunSessions(const Options& options, const SessionCeilings& ceilings,
                         const Server& server);

}  // namespace gpucompute::bench

#endif  // GPUCOMPUTE_BENCH_BENCHMARK_H_

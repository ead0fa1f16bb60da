// The arrays section of gpucompute-bench (--sections=arrays): NumPy's array semantics on
// the device (broadcasting, strided views, reductions over axes, fused map-reduce,
// matmul), through the Backend API, device time. Each family of rows lives in a file of
// its own and appends its rows; arrays.cc measures the device-to-device copy once and
// prints them all as one table.
#ifndef GPUCOMPUTE_BENCH_ARRAYS_H_
#define GPUCOMPUTE_BENCH_ARRAYS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/benchmark.h"
#include "server/core/backend.h"

namespace gpucompute::bench {

struct ArraysRow {
  std::string op;
  std::string dtype;
  std::string size;
  double seconds = 0;  // device time, median of --repeat
  double bytes = 0;    // the bytes the row's GB/s counts
  double flops = 0;    // 0: not reported
  // The ratio is GB/s over the copy's GB/s of the same dtype (`ceiling` "copy") unless
  // ceiling_seconds is set: then it is ceiling_seconds / seconds, against the work named
  // by `ceiling` (e.g. "OpenBLAS", or "contiguous" for the same operation on contiguous
  // data), timed in the same run. Any other `ceiling` without ceiling_seconds names the
  // program that measures it (CuPy's, in bench_cupy.py), and the table shows no ratio.
  std::string ceiling = "copy";
  double ceiling_seconds = 0;
  double target = 0;  // the least ratio asked for; 0: none
};

// A family of rows; each allocates what it needs on `stream`'s device and frees it.
using ArraysFamily = absl::Status (*)(const Options& options, Backend& backend, Stream& stream,
                                      std::vector<ArraysRow>& rows);

// The families (each in bench/arrays_<family>.cc).
absl::Status AppendElementwiseRows(const Options& options, Backend& backend, Stream& stream,
                                   std::vector<ArraysRow>& rows);
absl::Status AppendReduceRows(const Options& options, Backend& backend, Stream& stream,
                              std::vector<ArraysRow>& rows);
absl::Status AppendMatmulRows(const Options& options, Backend& backend, Stream& stream,
                              std::vector<ArraysRow>& rows);

}  // namespace gpucompute::bench

#endif  // GPUCOMPUTE_BENCH_ARRAYS_H_

// The arrays section's table (bench/arrays.h).
#include "bench/arrays.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/util/status_macros.h"

namespace gpucompute::bench {

namespace {

// The families, in the order their rows print.
const std::vector<ArraysFamily>& Families() {
  static const auto* families = new std::vector<ArraysFamily>{
      &AppendElementwiseRows,
      &AppendReduceRows,
      &AppendMatmulRows,
  };
  return *families;
}

// The device-to-device copy of 2^log2n elements of `dtype`: the section's ceiling.
absl::StatusOr<double> CopyGbps(const Options& options, Backend& backend, Stream& stream,
                                DType dtype) {
  const uint64_t bytes = static_cast<uint64_t>(options.n()) * DTypeSize(dtype);
  ASSIGN_OR_RETURN(DeviceMemory src, backend.Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceMemory dst, backend.Allocate(0, bytes));
  RETURN_IF_ERROR(backend.Fill(stream, src, dtype, 0, options.n()));
  ASSIGN_OR_RETURN(double s, MedianDeviceSeconds(backend, stream, options.repeat, [&] {
                     return backend.Copy(stream, src, 0, dst, 0, bytes);
                   }));
  return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

}  // namespace

absl::Status RunArrays(const Options& options, Backend& backend) {
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend.CreateStream(0));
  std::map<std::string, double> copy_gbps;
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    ASSIGN_OR_RETURN(copy_gbps[DTypeName(dtype)], CopyGbps(options, backend, *stream, dtype));
  }
  std::vector<ArraysRow> rows;
  for (ArraysFamily family : Families()) RETURN_IF_ERROR(family(options, backend, *stream, rows));

  Table table({"op", "dtype", "size", "ms", "GB/s", "GFLOP/s", "ratio", "vs", "target", "met"}, 3);
  for (const ArraysRow& r : rows) {
    const double gbps = r.bytes / r.seconds / 1e9;
    const bool vs_copy = r.ceiling_seconds <= 0;
    const double ratio = vs_copy ? gbps / copy_gbps[r.dtype] : r.ceiling_seconds / r.seconds;
    // A ceiling another program measures (CuPy's) leaves the ratio to that program.
    const bool measured_here = !vs_copy || r.ceiling == "copy";
    std::string target, met;
    if (r.target > 0) {
      target = absl::StrCat(">= ", Fixed(r.target, 2));
      met = ratio >= r.target ? "yes" : "NO";
    }
    table.AddRow({r.op, r.dtype, r.size, Fixed(r.seconds * 1e3, 3),
                  r.bytes > 0 ? Fixed(gbps, 2) : "",
                  r.flops > 0 ? Fixed(r.flops / r.seconds / 1e9, 1) : "",
                  measured_here ? Fixed(ratio, 3) : "",
                  r.ceiling, target, met});
  }
  table.Print(absl::StrCat("arrays: device time, median of ", options.repeat,
                           "; ratio to the copy of the same dtype (",
                           Fixed(copy_gbps["float64"], 1), " GB/s float64, ",
                           Fixed(copy_gbps["float32"], 1),
                           " GB/s float32) or to the work in `vs`, timed in the same run"));
  return absl::OkStatus();
}

}  // namespace gpucompute::bench

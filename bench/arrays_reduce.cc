// The arrays section's reduction rows (bench/arrays.h): a fused sum(x*y), sums over the
// last, first and middle axis of a 3-D array, and var over the last axis, each through
// the Backend call the planner makes for it (server/service/plan_reduce.cc): Reduce over
// a ReduceShape where the axes map onto one, ReduceStrided otherwise.
//
// Sizes: sum(x*y) reads 2^log2n float32 elements of x and of y (2^28 on a GPU). The 3-D
// array is (2^(log2n - 18), 1024, 256) float32, 2^log2n elements: (1024, 1024, 256) at
// --log2n=28, (64, 1024, 256) at the CPU's default 24.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/arrays.h"
#include "server/arrays/strided_layout.h"
#include "server/expression/expression.h"
#include "server/util/status_macros.h"

namespace gpucompute::bench {

absl::Status AppendReduceRows(const Options& options, Backend& backend, Stream& stream,
                              std::vector<ArraysRow>& rows) {
  const int64_t n = options.n();
  // The 3-D array (d0, 1024, 256) in C order, in x's memory.
  const int64_t d0 = std::max<int64_t>(1, n >> 18);
  const int64_t d1 = 1024, d2 = 256;
  const int64_t elements = std::max(n, d0 * d1 * d2);
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
  ASSIGN_OR_RETURN(DeviceMemory x, backend.Allocate(0, elements * sizeof(float)));
  ASSIGN_OR_RETURN(DeviceMemory y, backend.Allocate(0, bytes));
  RandomParams uniform;
  uniform.seed = 11;
  RETURN_IF_ERROR(backend.Random(stream, uniform, DType::kFloat32, x, elements));
  uniform.seed = 12;
  RETURN_IF_ERROR(backend.Random(stream, uniform, DType::kFloat32, y, n));
  ASSIGN_OR_RETURN(DeviceMemory out,
                   backend.Allocate(0, std::max(d0 * d1, d1 * d2) * sizeof(double)));
  const std::string size = absl::StrCat("2^", options.log2n);
  const auto time = [&](const std::function<absl::Status()>& enqueue) {
    return MedianDeviceSeconds(backend, stream, options.repeat, enqueue);
  };

  // sum(x*y): one pass over x and y, no temporary.
  ASSIGN_OR_RETURN(expr::Program product,
                   expr::Compile("x*y", {{"x", expr::ArrayInput{DType::kFloat32}},
                                         {"y", expr::ArrayInput{DType::kFloat32}}}));
  StridedReduce dot;
  dot.kind = ReduceKind::kSum;
  dot.dtype = DType::kFloat32;
  dot.program = &product;
  dot.shape = {n};
  dot.axes = {0};
  dot.inputs = {{&x, DenseLayout({static_cast<uint64_t>(n)}, false)},
                {&y, DenseLayout({static_cast<uint64_t>(n)}, false)}};
  ASSIGN_OR_RETURN(double dot_seconds, time([&]() -> absl::Status {
                     return backend.ReduceStrided(stream, dot, out).status();
                   }));
  rows.push_back({"sum(x*y), fused", "float32", size, dot_seconds, 2.0 * static_cast<double>(bytes),
                  2.0 * static_cast<double>(n), "copy", 0, 0.95});

  const std::string cube = absl::StrCat("(", d0, ", ", d1, ", ", d2, ")");
  const double cube_bytes = static_cast<double>(d0 * d1 * d2) * sizeof(float);
  struct AxisRow {
    const char* op;
    ReduceShape shape;
  };
  for (const AxisRow& r : {AxisRow{"sum axis -1", {d0 * d1, d2, 1}},
                           AxisRow{"sum axis 0", {1, d0, d1 * d2}},
                           AxisRow{"sum axis 1", {d0, d1, d2}}}) {
    ASSIGN_OR_RETURN(double s, time([&] {
                       return backend.Reduce(stream, ReduceKind::kSum, DType::kFloat32, x, r.shape,
                                             out);
                     }));
    rows.push_back({r.op, "float32", cube, s, cube_bytes, cube_bytes / sizeof(float), "copy", 0,
                    0.90});
  }

  // var over the last axis: a strided reduction of (count, mean, M2) triples.
  StridedReduce var;
  var.kind = ReduceKind::kVar;
  var.dtype = DType::kFloat32;
  var.shape = {d0, d1, d2};
  var.axes = {2};
  var.inputs = {{&x, DenseLayout({static_cast<uint64_t>(d0), static_cast<uint64_t>(d1),
                                  static_cast<uint64_t>(d2)},
                                 false)}};
  ASSIGN_OR_RETURN(double var_seconds, time([&]() -> absl::Status {
                     return backend.ReduceStrided(stream, var, out).status();
                   }));
  rows.push_back({"var axis -1", "float32", cube, var_seconds, cube_bytes,
                  3.0 * cube_bytes / sizeof(float)});
  return absl::OkStatus();
}

}  // namespace gpucompute::bench

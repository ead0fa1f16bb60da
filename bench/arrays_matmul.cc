// The arrays section's matmul rows (bench/arrays.h): C = A @ B of n x n C-ordered
// matrices through Backend::Matmul, float64, float32 and, on CUDA, float32 with TF32.
// n is 8192 on CUDA at --log2n=28 (the GPU run) and 1024 on the CPU at the default
// --log2n=24, each scaling as 2^(log2n / 2). On the CPU the ceiling is OpenBLAS called directly on the same matrices
// in the same run, with as many threads as the backend's pool has; on CUDA it is
// cupy.matmul, which bench/bench_cupy.py (arrays_matmul) prints for the same sizes.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/arrays.h"
#include "server/util/status_macros.h"

namespace gpucompute::bench {
namespace {

// Seconds of `repeat` direct OpenBLAS calls (median, after a warm-up), on the host
// memory the CPU backend's arrays are.
double OpenBlasSeconds(DType dtype, int64_t n, int threads, const DeviceMemory& a,
                       const DeviceMemory& b, DeviceMemory& c, int repeat) {
  const int blas_n = static_cast<int>(n);
  auto call = [&] {
    if (dtype == DType::kFloat64) {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_n, blas_n, blas_n, 1.0,
                  static_cast<const double*>(a.data()), blas_n,
                  static_cast<const double*>(b.data()), blas_n, 0.0,
                  static_cast<double*>(c.data()), blas_n);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_n, blas_n, blas_n, 1.0f,
                  static_cast<const float*>(a.data()), blas_n, static_cast<const float*>(b.data()),
                  blas_n, 0.0f, static_cast<float*>(c.data()), blas_n);
    }
  };
  // The backend runs OpenBLAS one thread per call (server/cpu/matmul.cc); called
  // directly it gets the pool's threads, and gives them back after.
  openblas_set_num_threads(threads);
  call();
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    const Clock::time_point start = Clock::now();
    call();
    seconds.push_back(SecondsSince(start));
  }
  openblas_set_num_threads(1);
  return Percentile(std::move(seconds), 50);
}

}  // namespace

absl::Status AppendMatmulRows(const Options& options, Backend& backend, Stream& stream,
                              std::vector<ArraysRow>& rows) {
  const bool cuda = backend.name() == "cuda";
  const int64_t n = int64_t{1} << (options.log2n / 2 + (cuda ? -1 : -2));
  struct Variant {
    DType dtype;
    bool tf32;
  };
  for (const Variant v : {Variant{DType::kFloat64, false}, Variant{DType::kFloat32, false},
                          Variant{DType::kFloat32, true}}) {
    if (v.tf32 && !cuda) continue;  // the CPU backend has no TF32
    const uint64_t bytes = static_cast<uint64_t>(n * n) * DTypeSize(v.dtype);
    ASSIGN_OR_RETURN(DeviceMemory a, backend.Allocate(0, bytes));
    ASSIGN_OR_RETURN(DeviceMemory b, backend.Allocate(0, bytes));
    ASSIGN_OR_RETURN(DeviceMemory c, backend.Allocate(0, bytes));
    RETURN_IF_ERROR(backend.Random(stream, RandomParams{.seed = 1}, v.dtype, a, n * n));
    RETURN_IF_ERROR(backend.Random(stream, RandomParams{.seed = 2}, v.dtype, b, n * n));
    MatmulShape shape;
    shape.m = shape.n = shape.k = n;
    shape.a = shape.b = shape.c = MatrixLayout{0, n, 1, 0};
    shape.allow_tf32 = v.tf32;
    ASSIGN_OR_RETURN(double seconds,
                     MedianDeviceSeconds(backend, stream, options.repeat, [&]() -> absl::Status {
                       return backend.Matmul(stream, v.dtype, shape, 1.0, a, b, 0.0, c).status();
                     }));
    ArraysRow row;
    row.op = v.tf32 ? "matmul A @ B, TF32" : "matmul A @ B";
    row.dtype = DTypeName(v.dtype);
    row.size = absl::StrCat(n, "x", n);
    row.seconds = seconds;
    row.bytes = 3.0 * static_cast<double>(bytes);
    row.flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    // On CUDA the ceiling is cupy.matmul (the same cuBLAS), which bench_cupy.py times.
    if (cuda) row.ceiling = "bench_cupy.py";
    if (!cuda) {
      RETURN_IF_ERROR(Synchronize(stream));
      row.ceiling = "OpenBLAS";
      row.ceiling_seconds = OpenBlasSeconds(v.dtype, n, backend.devices()[0].compute_units, a, b,
                                            c, options.repeat);
      row.target = 0.9;
    }
    rows.push_back(std::move(row));
  }
  return absl::OkStatus();
}

}  // namespace gpucompute::bench

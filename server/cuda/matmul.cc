// CudaBackend::Matmul: cuBLAS's cublasGemmEx for one matrix and
// cublasGemmStridedBatchedEx for a batch (a batch stride of 0 reads one matrix for every
// matrix of the batch). Host code: cuBLAS launches its own kernels.
//
// cuBLAS is column-major. Each operand is handed over as BLAS sees its layout
// (ToBlasMatrix): as itself or as its transpose, with its leading dimension. A C stored
// row-major is computed as C^T = B^T A^T, the usual swap, so no operand is ever copied.
//
// Precision: float64 computes in float64 (CUBLAS_COMPUTE_64F) and float32 in float32
// (CUBLAS_COMPUTE_32F), with the handle in its default math mode, so no tensor-core
// shortcut rounds float32 inputs; CUBLAS_COMPUTE_32F_FAST_TF32 only when the request set
// allow_tf32.
//
// Reproducibility: cuBLAS gives bitwise the same results run to run for one toolkit
// version on GPUs of the same architecture and SM count, provided its choice of kernel
// does not depend on other streams' use of its workspace. Each call therefore brings its
// own workspace, of a fixed size, taken from the device's pool in stream order and given
// back after the call: the choice depends on the shape, the layouts and the dtype alone.
// Not guaranteed: the same bits on another GPU model, SM count or cuBLAS version, or the
// same bits with and without allow_tf32.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda::detail {
namespace {

// What cuBLAS recommends on Hopper; larger than any other architecture needs.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// One operand of the column-major product: where it starts, how BLAS reads it, and the
// distance between the matrices of a batch.
struct BlasOperand {
  const void* data;
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;
};

cublasOperation_t Op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

absl::StatusOr<LaunchInfo> CudaBackend::Matmul(Stream& stream, DType dtype,
                                               const MatmulShape& s, double alpha,
                                               const DeviceMemory& a, const DeviceMemory& b,
                                               double beta, DeviceMemory& c) {
  RETURN_IF_ERROR(CheckHealthy());
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul takes float32 or float64, not ", DTypeName(dtype)));
  }
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (s.batch == 0 || s.m == 0 || s.n == 0) return LaunchInfo{};
  Device& d = *devices_[stream.device()];
  cudaStream_t cuda_stream = AsCuda(stream).get();
  const bool f64 = dtype == DType::kFloat64;
  const int64_t element = static_cast<int64_t>(DTypeSize(dtype));

  BlasMatrix ma = ToBlasMatrix(s.m, s.k, s.a.row_stride, s.a.col_stride);
  BlasMatrix mb = ToBlasMatrix(s.k, s.n, s.b.row_stride, s.b.col_stride);
  const BlasMatrix mc = ToBlasMatrix(s.m, s.n, s.c.row_stride, s.c.col_stride);
  if (s.k == 0) {
    // Nothing of A or B is read, but cuBLAS still checks their leading dimensions.
    ma = {false, std::max<int64_t>(s.m, 1)};
    mb = {false, 1};
  }
  const char* pa = Bytes(a) + s.a.offset * element;
  const char* pb = Bytes(b) + s.b.offset * element;
  char* pc = Bytes(c) + s.c.offset * element;
  BlasOperand x{pa, Op(ma.transposed), ma.ld, s.a.batch_stride};
  BlasOperand y{pb, Op(mb.transposed), mb.ld, s.b.batch_stride};
  int64_t rows = s.m, cols = s.n;
  if (mc.transposed) {
    // C^T = B^T A^T: an operand stored as itself is the one cuBLAS transposes.
    x = {pb, Op(!mb.transposed), mb.ld, s.b.batch_stride};
    y = {pa, Op(!ma.transposed), ma.ld, s.a.batch_stride};
    std::swap(rows, cols);
  }
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F
          : (s.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  // Host scalars of the compute type's scalar type.
  const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
  const void* alpha_ptr = f64 ? static_cast<const void*>(&alpha) : &alpha32;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta) : &beta32;

  void* workspace = nullptr;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMallocFromPoolAsync(&workspace, kWorkspaceBytes, d.pool, cuda_stream));
  cublasStatus_t result = CUBLAS_STATUS_SUCCESS;
  const char* call = "";
  {
    absl::MutexLock lock(&d.cublas_mu);
    if (d.cublas == nullptr) {
      call = "cublasCreate";
      result = cublasCreate(&d.cublas);
      if (result == CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetPointerMode";
        result = cublasSetPointerMode(d.cublas, CUBLAS_POINTER_MODE_HOST);
      }
    }
    if (result == CUBLAS_STATUS_SUCCESS) {
      call = "cublasSetStream";
      result = cublasSetStream(d.cublas, cuda_stream);
    }
    if (result == CUBLAS_STATUS_SUCCESS) {
      call = "cublasSetWorkspace";
      result = cublasSetWorkspace(d.cublas, workspace, kWorkspaceBytes);
    }
    if (result == CUBLAS_STATUS_SUCCESS && s.batch == 1) {
      call = "cublasGemmEx_64";
      result = cublasGemmEx_64(d.cublas, x.op, y.op, rows, cols, s.k, alpha_ptr, x.data, type,
                               x.ld, y.data, type, y.ld, beta_ptr, pc, type, mc.ld, compute,
                               CUBLAS_GEMM_DEFAULT);
    } else if (result == CUBLAS_STATUS_SUCCESS) {
      call = "cublasGemmStridedBatchedEx_64";
      result = cublasGemmStridedBatchedEx_64(
          d.cublas, x.op, y.op, rows, cols, s.k, alpha_ptr, x.data, type, x.ld, x.batch_stride,
          y.data, type, y.ld, y.batch_stride, beta_ptr, pc, type, mc.ld, s.c.batch_stride,
          s.batch, compute, CUBLAS_GEMM_DEFAULT);
    }
    // Back to cuBLAS's own workspace, so that no later call on the handle uses this one
    // once it is freed.
    if (d.cublas != nullptr) cublasSetStream(d.cublas, cuda_stream);
  }
  // Freed in stream order, after the kernels that use it, whatever happened.
  const cudaError_t freed = cudaFreeAsync(workspace, cuda_stream);
  if (result != CUBLAS_STATUS_SUCCESS) {
    absl::Status status = CudaStatus(result, call, __FILE__, __LINE__);
    // A failed launch may leave a sticky error, which cuBLAS reports as a status only.
    Check(cudaPeekAtLastError(), "matmul launch", __FILE__, __LINE__).IgnoreError();
    return status;
  }
  RETURN_IF_ERROR(Check(freed, "cudaFreeAsync", __FILE__, __LINE__));
  return LaunchInfo{};
}

}  // namespace gpucompute::cuda::detail

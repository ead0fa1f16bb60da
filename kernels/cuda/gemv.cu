// GemvAsync: the entry point and its dispatch. The kernels are cuBLAS's (gemv, and scal
// for an empty sum); the dispatch maps the stored layout onto cuBLAS's column-major view
// and picks the precision. A and x may be views: A with its leading dimension (lda), x
// at any nonzero increment (incx), as BLAS takes them.
//
// Determinism: cuBLAS gemv with host scalars uses no atomics, so results are the same
// run to run on one device.
#include <cublas_v2.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

GemvStatus CublasResult(cublasStatus_t status, const char* call) {
  GemvStatus result;
  result.cublas = status;
  result.call = call;
  return result;
}

// y = alpha * op(A) x + beta * y through cuBLAS, in T (float or double).
template <typename T>
GemvStatus GemvDispatch(cublasHandle_t cublas, const GemvShape& shape, double alpha,
                        const void* a, const void* x, double beta, void* y,
                        cudaStream_t stream) {
  constexpr bool kDouble = sizeof(T) == sizeof(double);
  const T alpha_t = static_cast<T>(alpha);
  const T beta_t = static_cast<T>(beta);
  T* const out = static_cast<T*>(y);
  // cuBLAS is column-major. An F-layout A is A itself; a C-layout A is, read column-major,
  // the cols x rows matrix A^T, so op(A) flips between N and T.
  const int64_t m = shape.col_major ? shape.rows : shape.cols;
  const int64_t n = shape.col_major ? shape.cols : shape.rows;
  const bool transpose = shape.col_major ? shape.transpose : !shape.transpose;
  const int64_t y_len = shape.transpose ? shape.cols : shape.rows;
  const int64_t inner = shape.transpose ? shape.rows : shape.cols;
  if (inner == 0) {
    // An empty sum: y = beta * y (BLAS would leave y untouched), and y is not read when
    // beta is 0.
    if (beta == 0) {
      GemvStatus result;
      result.cuda = FillAsync(y, kDouble ? DType::kFloat64 : DType::kFloat32, 0, y_len, stream);
      result.call = "FillAsync";
      return result;
    }
    if constexpr (kDouble) {
      return CublasResult(cublasDscal_64(cublas, y_len, &beta_t, out, 1), "cublasDscal_64");
    } else {
      return CublasResult(cublasSscal_64(cublas, y_len, &beta_t, out, 1), "cublasSscal_64");
    }
  }
  const cublasOperation_t op = transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  // A view's leading dimension, or a whole buffer's.
  const int64_t lda = shape.lda != 0 ? shape.lda : (m > 1 ? m : 1);
  const T* const matrix = static_cast<const T*>(a) + shape.a_offset;
  // BLAS reads x with a negative increment from its lowest address, where the last
  // element lies.
  const int64_t incx = shape.incx;
  const T* const vector =
      static_cast<const T*>(x) + shape.x_offset + (incx < 0 ? (inner - 1) * incx : 0);
  if constexpr (kDouble) {
    return CublasResult(
        cublasDgemv_64(cublas, op, m, n, &alpha_t, matrix, lda, vector, incx, &beta_t, out, 1),
        "cublasDgemv_64");
  } else {
    return CublasResult(
        cublasSgemv_64(cublas, op, m, n, &alpha_t, matrix, lda, vector, incx, &beta_t, out, 1),
        "cublasSgemv_64");
  }
}

}  // namespace
}  // namespace detail

GemvStatus GemvAsync(cublasHandle_t cublas, DType dtype, const GemvShape& shape, double alpha,
                     const void* a, const void* x, double beta, void* y, cudaStream_t stream) {
  GemvStatus result;
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    result.cuda = cudaErrorInvalidValue;
    result.call = "GemvAsync";
    return result;
  }
  result.cublas = cublasSetStream(cublas, stream);
  if (result.cublas != CUBLAS_STATUS_SUCCESS) {
    result.call = "cublasSetStream";
    return result;
  }
  const int64_t y_len = shape.transpose ? shape.cols : shape.rows;
  if (y_len == 0) return result;
  return dtype == DType::kFloat64
             ? detail::GemvDispatch<double>(cublas, shape, alpha, a, x, beta, y, stream)
             : detail::GemvDispatch<float>(cublas, shape, alpha, a, x, beta, y, stream);
}

}  // namespace gpucompute::cuda

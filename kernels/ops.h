// Parameters of the compute operations, shared by every backend. Plain C++.
#ifndef GPUCOMPUTE_KERNELS_OPS_H_
#define GPUCOMPUTE_KERNELS_OPS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace gpucompute {

enum class ReduceKind : uint8_t {
  kSum,
  kProd,
  kMin,
  kMax,
  kMean,
  kNorm2,
  kArgmin,
  kArgmax,
  kVar,
  kStd,
  kAny,
  kAll
};

inline constexpr ReduceKind kAllReduceKinds[] = {
    ReduceKind::kSum,    ReduceKind::kProd,   ReduceKind::kMin, ReduceKind::kMax,
    ReduceKind::kMean,   ReduceKind::kNorm2,  ReduceKind::kArgmin, ReduceKind::kArgmax,
    ReduceKind::kVar,    ReduceKind::kStd,    ReduceKind::kAny, ReduceKind::kAll};

// The kinds Backend::Reduce takes over a ReduceShape; every kind goes through
// Backend::ReduceStrided.
inline constexpr ReduceKind kShapeReduceKinds[] = {
    ReduceKind::kSum,  ReduceKind::kProd,  ReduceKind::kMin,    ReduceKind::kMax,
    ReduceKind::kMean, ReduceKind::kNorm2, ReduceKind::kArgmin, ReduceKind::kArgmax};

constexpr bool IsShapeReduceKind(ReduceKind kind) {
  for (ReduceKind k : kShapeReduceKinds) {
    if (k == kind) return true;
  }
  return false;
}

constexpr const char* ReduceKindName(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kProd:
      return "prod";
    case ReduceKind::kMin:
      return "min";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMean:
      return "mean";
    case ReduceKind::kNorm2:
      return "norm2";
    case ReduceKind::kArgmin:
      return "argmin";
    case ReduceKind::kArgmax:
      return "argmax";
    case ReduceKind::kVar:
      return "var";
    case ReduceKind::kStd:
      return "std";
    case ReduceKind::kAny:
      return "any";
    case ReduceKind::kAll:
      return "all";
  }
  return "?";
}

// A reduction viewed as [outer, extent, inner] in memory order, reducing the middle axis.
// A whole-array reduction is {1, n, 1}. For a C-layout (m, n) array, axis 1 is {m, n, 1}
// and axis 0 is {1, m, n}.
struct ReduceShape {
  int64_t outer = 1;
  int64_t extent = 1;
  int64_t inner = 1;
  // Whole-array argmin/argmax of an F-layout (rows, cols) array: when non-zero, the
  // search runs in C order, as numpy.argmin's does, and reports the C-order index of the
  // first extreme (with ties, the first in memory order may come later in C order).
  // Backends handle it; the plain kernels see memory order only.
  int64_t f_order_rows = 0;
};

// NumPy's result dtypes: sum and prod of bool/int32/int64 give int64, of floats the same
// float; mean, norm2, var and std of bools and integers give float64; min and max keep the
// dtype; argmin and argmax give int64; any and all give bool.
constexpr DType ReduceResultDType(ReduceKind kind, DType in) {
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kProd:
      return IsFloat(in) ? in : DType::kInt64;
    case ReduceKind::kMean:
    case ReduceKind::kNorm2:
    case ReduceKind::kVar:
    case ReduceKind::kStd:
      return IsFloat(in) ? in : DType::kFloat64;
    case ReduceKind::kMin:
    case ReduceKind::kMax:
      return in;
    case ReduceKind::kArgmin:
    case ReduceKind::kArgmax:
      return DType::kInt64;
    case ReduceKind::kAny:
    case ReduceKind::kAll:
      return DType::kBool;
  }
  return in;
}

struct GemvShape {
  int64_t rows = 0;        // rows of A as stored (m)
  int64_t cols = 0;        // columns of A as stored (n)
  bool col_major = false;  // layout F
  bool transpose = false;  // op(A) = A^T: x has `rows` elements, y has `cols`
  // Where A and x lie in their memory (a view of a buffer), in elements. A[i, j] is at
  // a_offset + i * lda + j (row-major) or a_offset + i + j * lda (col_major); lda is at
  // least the contiguous axis's extent, 0 meaning exactly that (a whole buffer). x[k] is
  // at x_offset + k * incx, incx nonzero and maybe negative (unlike BLAS's convention,
  // x_offset is always element 0's).
  int64_t lda = 0;
  int64_t a_offset = 0;
  int64_t x_offset = 0;
  int64_t incx = 1;
};

enum class Distribution : uint8_t { kUniform, kNormal, kIntegers };

// Which transform turns Philox words into normals (kernels/philox.h defines each). A
// version, once published, keeps its bits: requests that name it (or, for v1, name none)
// get the same numbers for ever.
enum class NormalTransform : uint8_t {
  kBoxMullerV1 = 1,  // the original: libm's logf/sqrtf/cosf/sinf, equal to a few ulp
  kBoxMullerV2 = 2,  // fused polynomials: bitwise equal on every backend, cheaper on GPUs
  kInverseCdfV3 = 3,  // float32: the normal CDF inverted by table; float64: v2's values
};

// A counter-based random fill. Element i of the output is drawn from Philox4x32-10 with
// key (seed low 32 bits, seed high 32 bits) and counter (offset + i / k, 0, 0) as a
// 128-bit little-endian number, taking lane i % k of that block, where k =
// ElementsPerCounter(dist, dtype). See kernels/philox.h for the exact transforms.
struct RandomParams {
  Distribution distribution = Distribution::kUniform;
  uint64_t seed = 0;
  uint64_t offset = 0;  // first Philox counter used
  double mean = 0.0;    // normal
  double stddev = 1.0;  // normal
  int64_t low = 0;      // integers: [low, high)
  int64_t high = 0;
  NormalTransform normal_transform = NormalTransform::kBoxMullerV1;  // normal
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_KERNELS_OPS_H_

// Reading one element of a kernel's raw output (bytes as the backend wrote them) for
// comparison with a reference: a float as a double, an integer or bool exactly.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_ELEMENT_BYTES_H_
#define GPUCOMPUTE_TESTS_SUPPORT_ELEMENT_BYTES_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dtype.h"

namespace gpucompute::testing {

// Element `i` of `bytes`, of the floating dtype `dt` (float32 or float64), as a double.
inline double ElementAsDouble(const std::vector<uint8_t>& bytes, DType dt, size_t i) {
  if (dt == DType::kFloat32) {
    float f;
    std::memcpy(&f, bytes.data() + i * 4, 4);
    return f;
  }
  double d;
  std::memcpy(&d, bytes.data() + i * 8, 8);
  return d;
}

// Element `i` of `bytes`, of the integer or bool dtype `dt`, exactly.
inline int64_t ElementAsInt(const std::vector<uint8_t>& bytes, DType dt, size_t i) {
  switch (dt) {
    case DType::kBool:
      return bytes[i];
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      return v;
    }
    default: {
      int64_t v;
      std::memcpy(&v, bytes.data() + i * 8, 8);
      return v;
    }
  }
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_ELEMENT_BYTES_H_

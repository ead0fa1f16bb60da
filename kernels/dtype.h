// Element types shared by every backend. Plain C++ (no gRPC, no protobuf), so the
// CUDA kernels, the CPU backend and the service can all include it.
#ifndef GPUCOMPUTE_KERNELS_DTYPE_H_
#define GPUCOMPUTE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace gpucompute {

// Ordered from "lowest" to "highest" kind; the order is used by type promotion.
enum class DType : uint8_t {
  kBool = 0,  // one byte, 0 or 1
  kInt32 = 1,
  kInt64 = 2,
  kFloat32 = 3,
  kFloat64 = 4,
};

inline constexpr int kNumDTypes = 5;

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kBool:
      return 1;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kBool:
      return "bool";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
  }
  return "?";
}

constexpr bool IsFloat(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }
constexpr bool IsInteger(DType t) { return t == DType::kInt32 || t == DType::kInt64; }

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};

// Calls fn(T{}) with T the C++ type of `t`. Bool is stored as one byte, read as bool.
template <typename Fn>
decltype(auto) VisitDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBool:
      return fn(bool{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      break;
  }
  return fn(double{});
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_KERNELS_DTYPE_H_

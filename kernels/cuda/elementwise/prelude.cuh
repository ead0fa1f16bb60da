// The device helpers of every NVRTC-generated elementwise kernel: the fixed-width types,
// the integer arithmetic that wraps, NumPy's minimum/maximum, the saturating float to
// integer conversions and the 16-byte pack. Each mirrors one function of
// server/expression/scalar_ops.h, so that the GPU computes what the CPU backend does.
//
// NVRTC source, not included by nvcc: ElementwiseKernelSource (kernels/cuda/kernels.h)
// embeds this file at build time and puts it at the top of every generated kernel, after
// this comment (dropped, so that editing it does not change the generated source and the
// kernels cached on disk under its digest stay valid). NVRTC provides the math functions
// and uint4 without any #include; the fixed-width types are ours so that nothing depends on
// system headers.

namespace gc {
typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
static_assert(sizeof(i32) == 4 && sizeof(i64) == 8 && sizeof(uint4) == 16, "type sizes");

// Integer negation, abs, + - * wrap around modulo 2^bits: computed in the unsigned type.
__device__ __forceinline__ i32 Neg(i32 a) { return (i32)(0u - (u32)a); }
__device__ __forceinline__ i64 Neg(i64 a) { return (i64)(0ull - (u64)a); }
__device__ __forceinline__ i32 Abs(i32 a) { return a < 0 ? Neg(a) : a; }
__device__ __forceinline__ i64 Abs(i64 a) { return a < 0 ? Neg(a) : a; }
__device__ __forceinline__ i32 Add(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
__device__ __forceinline__ i64 Add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i32 Sub(i32 a, i32 b) { return (i32)((u32)a - (u32)b); }
__device__ __forceinline__ i64 Sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i32 Mul(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
__device__ __forceinline__ i64 Mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

// Integer power, wrapping; a negative exponent gives the real result truncated toward
// zero (ops::Pow).
template <typename T, typename U>
__device__ __forceinline__ T IntPow(T a, T b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b & 1) ? -1 : 1;
    return 0;
  }
  U result = 1;
  U base = (U)a;
  for (U e = (U)b; e != 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return (T)result;
}
__device__ __forceinline__ i32 Pow(i32 a, i32 b) { return IntPow<i32, u32>(a, b); }
__device__ __forceinline__ i64 Pow(i64 a, i64 b) { return IntPow<i64, u64>(a, b); }

// np.minimum / np.maximum: a NaN in either operand gives NaN (ops::Min, ops::Max).
template <typename T>
__device__ __forceinline__ T FloatMin(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T>
__device__ __forceinline__ T FloatMax(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T>
__device__ __forceinline__ T IntMin(T a, T b) { return a < b ? a : b; }
template <typename T>
__device__ __forceinline__ T IntMax(T a, T b) { return a > b ? a : b; }

// Float to integer (ops::Convert): NaN gives 0, values outside the range saturate.
// -2^(bits-1) is exact in both float types; 2^(bits-1) is the first value too large.
__device__ __forceinline__ i32 ToI32(float v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+31f) return -2147483647 - 1;
  if (v >= 0x1p+31f) return 2147483647;
  return (i32)v;
}
__device__ __forceinline__ i32 ToI32(double v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+31) return -2147483647 - 1;
  if (v >= 0x1p+31) return 2147483647;
  return (i32)v;
}
__device__ __forceinline__ i64 ToI64(float v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+63f) return -9223372036854775807ll - 1;
  if (v >= 0x1p+63f) return 9223372036854775807ll;
  return (i64)v;
}
__device__ __forceinline__ i64 ToI64(double v) {
  if (!(v == v)) return 0;
  if (v <= -0x1p+63) return -9223372036854775807ll - 1;
  if (v >= 0x1p+63) return 9223372036854775807ll;
  return (i64)v;
}

// kWords 16-byte words of an array, seen as its elements. The union is how CUDA code
// reinterprets registers; fully unrolled indexing keeps it out of local memory.
template <typename T, int kWords>
union Pack {
  uint4 q[kWords];
  T e[kWords * 16 / sizeof(T)];
};
}  // namespace gc

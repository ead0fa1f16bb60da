// The device helpers of every NVRTC-generated elementwise kernel: the fixed-width types,
// the integer arithmetic that wraps, NumPy's minimum/maximum, fmin/fmax, sign, integer
// reciprocal, floor division and remainders, shifts and float tests, the saturating float
// to integer conversions and the 16-byte pack. Each mirrors one function of
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
// np.hypot without the spurious overflow of libdevice's hypot, which gives Inf for
// hypot(1, DBL_MAX) where C and NumPy give DBL_MAX. float32 is exact in float64 and rounds
// once; float64 scales the smaller magnitude by the larger (within 2 ulp). An Inf argument
// wins over a NaN, as in C.
__device__ __forceinline__ float Hypot(float a, float b) {
  const double x = a, y = b;  // their squares are exact in float64
  const double Inf = __longlong_as_double(0x7ff0000000000000ll);
  if (fabs(x) == Inf || fabs(y) == Inf) return __int_as_float(0x7f800000);
  return (float)__dsqrt_rn(__dadd_rn(__dmul_rn(x, x), __dmul_rn(y, y)));
}
__device__ __forceinline__ double Hypot(double a, double b) {
  a = fabs(a);
  b = fabs(b);
  const double Inf = __longlong_as_double(0x7ff0000000000000ll);
  if (a == Inf || b == Inf) return Inf;
  if (a != a || b != b) return a + b;
  const double big = a > b ? a : b, small = a > b ? b : a;
  if (big == 0) return 0;
  const double r = __ddiv_rn(small, big);
  return __dmul_rn(big, __dsqrt_rn(__dadd_rn(__dmul_rn(r, r), 1.0)));
}
template <typename T>
__device__ __forceinline__ T IntMin(T a, T b) { return a < b ? a : b; }
template <typename T>
__device__ __forceinline__ T IntMax(T a, T b) { return a > b ? a : b; }

// The NaN-ignoring maximum and minimum: a NaN operand yields the other one (ops::Fmax,
// ops::Fmin).
template <typename T>
__device__ __forceinline__ T FloatFmax(T a, T b) { return (a >= b || b != b) ? a : b; }
template <typename T>
__device__ __forceinline__ T FloatFmin(T a, T b) { return (a <= b || b != b) ? a : b; }

// np.sign (ops::Sign): NaN stays NaN, sign(-0.0) is +0.0.
__device__ __forceinline__ i32 Sign(i32 a) { return (a > 0) - (a < 0); }
__device__ __forceinline__ i64 Sign(i64 a) { return (i64)((a > 0) - (a < 0)); }
template <typename T>
__device__ __forceinline__ T FloatSign(T a) {
  return a > 0 ? T(1) : a < 0 ? T(-1) : a == 0 ? T(0) : a;
}

// Integer reciprocal as NumPy's 1.0 / a converted back: 1 / 0 gives the most negative
// integer (ops::Reciprocal).
__device__ __forceinline__ i32 Reciprocal(i32 a) { return a == 0 ? -2147483647 - 1 : 1 / a; }
__device__ __forceinline__ i64 Reciprocal(i64 a) {
  return a == 0 ? -9223372036854775807ll - 1 : 1 / a;
}

// Integer //, % and fmod (ops::FloorDiv, ops::Mod, ops::Fmod): floor and the divisor's
// sign; division by 0 gives 0, INT_MIN // -1 wraps, and -1 never reaches the hardware
// remainder (INT_MIN % -1 traps on the CPU).
template <typename T>
__device__ __forceinline__ T IntFloorDiv(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return Neg(a);
  const T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T>
__device__ __forceinline__ T IntMod(T a, T b) {
  if (b == 0 || b == -1) return 0;
  const T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T>
__device__ __forceinline__ T IntFmod(T a, T b) { return (b == 0 || b == -1) ? 0 : a % b; }
__device__ __forceinline__ i32 FloorDiv(i32 a, i32 b) { return IntFloorDiv(a, b); }
__device__ __forceinline__ i64 FloorDiv(i64 a, i64 b) { return IntFloorDiv(a, b); }
__device__ __forceinline__ i32 Mod(i32 a, i32 b) { return IntMod(a, b); }
__device__ __forceinline__ i64 Mod(i64 a, i64 b) { return IntMod(a, b); }
__device__ __forceinline__ i32 Fmod(i32 a, i32 b) { return IntFmod(a, b); }
__device__ __forceinline__ i64 Fmod(i64 a, i64 b) { return IntFmod(a, b); }

// Float // and % as NumPy's npy_divmod (ops::FloatDivmod). Every step is exact or one
// IEEE-rounded operation (fmod, floor and copysign are exact), so this is bit-identical
// to the CPU.
__device__ __forceinline__ float Fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double Fmod(double a, double b) { return fmod(a, b); }
__device__ __forceinline__ float Floor(float a) { return floorf(a); }
__device__ __forceinline__ double Floor(double a) { return floor(a); }
__device__ __forceinline__ float CopySign(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double CopySign(double a, double b) { return copysign(a, b); }
__device__ __forceinline__ float Div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double Div(double a, double b) { return __ddiv_rn(a, b); }
template <typename T>
__device__ __forceinline__ T FloatDivmod(T a, T b, T* modulus) {
  T mod = Fmod(a, b);
  T div = Div(a - mod, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= T(1);
    }
  } else {
    mod = CopySign(T(0), b);
  }
  T floordiv;
  if (div != 0) {
    floordiv = Floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
  } else {
    floordiv = CopySign(T(0), Div(a, b));
  }
  *modulus = mod;
  return floordiv;
}
__device__ __forceinline__ float FloorDiv(float a, float b) {
  float mod;
  return b == 0 ? Div(a, b) : FloatDivmod(a, b, &mod);
}
__device__ __forceinline__ double FloorDiv(double a, double b) {
  double mod;
  return b == 0 ? Div(a, b) : FloatDivmod(a, b, &mod);
}
template <typename T>
__device__ __forceinline__ T FloatMod(T a, T b) {
  T mod = Fmod(a, b);
  if (b != 0) FloatDivmod(a, b, &mod);
  return mod;
}
__device__ __forceinline__ float Mod(float a, float b) { return FloatMod(a, b); }
__device__ __forceinline__ double Mod(double a, double b) { return FloatMod(a, b); }

// Shifts as NumPy's npy_lshift / npy_rshift (ops::LeftShift, ops::RightShift): an amount
// outside [0, bits) gives 0, or -1 for a right shift of a negative value.
__device__ __forceinline__ i32 LeftShift(i32 a, i32 b) { return (u32)b < 32u ? (i32)((u32)a << b) : 0; }
__device__ __forceinline__ i64 LeftShift(i64 a, i64 b) {
  return (u64)b < 64ull ? (i64)((u64)a << b) : 0;
}
__device__ __forceinline__ i32 RightShift(i32 a, i32 b) {
  return (u32)b < 32u ? a >> b : (a < 0 ? -1 : 0);
}
__device__ __forceinline__ i64 RightShift(i64 a, i64 b) {
  return (u64)b < 64ull ? a >> b : (a < 0 ? -1 : 0);
}

// The float tests, on the bits (ops::IsInf, ops::IsFinite, ops::Signbit).
__device__ __forceinline__ bool IsInf(float a) { return (__float_as_int(a) & 0x7fffffff) == 0x7f800000; }
__device__ __forceinline__ bool IsInf(double a) {
  return (__double_as_longlong(a) & 0x7fffffffffffffffll) == 0x7ff0000000000000ll;
}
__device__ __forceinline__ bool IsFinite(float a) { return (__float_as_int(a) & 0x7f800000) != 0x7f800000; }
__device__ __forceinline__ bool IsFinite(double a) {
  return (__double_as_longlong(a) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll;
}
__device__ __forceinline__ bool Signbit(float a) { return __float_as_int(a) < 0; }
__device__ __forceinline__ bool Signbit(double a) { return __double_as_longlong(a) < 0; }

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

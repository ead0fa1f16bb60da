// The per-element meaning of every IR operation, as inline functions on C++ values. The
// compiler folds scalar-only subexpressions with these and the CPU evaluator runs them in
// its loops, so the two can never disagree; a CUDA code generator should match them.
//
// Value types are bool, int32_t, int64_t, float and double (the DType's C++ type). Each
// op's kAccepts<T> says for which operand types the IR may use it (see ir.h).
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_SCALAR_OPS_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_SCALAR_OPS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "server/expression/ir.h"

namespace gpucompute::expr::ops {

template <typename T>
inline constexpr bool kIsInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool kIsFloat = std::is_floating_point_v<T>;
template <typename T>
inline constexpr bool kIsNumber = kIsInt<T> || kIsFloat<T>;
template <typename T>
inline constexpr bool kIsAny = kIsNumber<T> || std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool kIsIntOrBool = kIsInt<T> || std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool kIsBool = std::is_same_v<T, bool>;

// numpy.pi: the double nearest to pi (or, as a float, the float nearest to that).
inline constexpr double kPi = 3.141592653589793238462643383279502884;

// Integer + - * wrap around modulo 2^bits: done in the unsigned type, where overflow is
// defined, and converted back (modular since C++20).
template <typename T>
using Unsigned = std::make_unsigned_t<T>;

// static_cast semantics, except that a float outside the target integer range saturates
// and NaN gives 0. C++ leaves both undefined and NumPy's astype gives whatever the CPU
// gives (INT_MIN on x86 for NaN, inf and every value out of range); the casts int32(x)
// and int64(x) of the language use this rule on every backend.
template <typename To, typename From>
inline To Convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (kIsInt<To> && kIsFloat<From>) {
    if (!(v == v)) return 0;
    // -2^(bits-1) is exact as a float; 2^(bits-1) is the first value too large.
    constexpr From kLow = static_cast<From>(std::numeric_limits<To>::min());
    if (v <= kLow) return std::numeric_limits<To>::min();
    if (v >= -kLow) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// ---- unary ----

struct Neg {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(a));
    } else {
      return -a;
    }
  }
};

struct Abs {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a) {
    if constexpr (kIsInt<T>) {
      // abs(INT_MIN) wraps to INT_MIN, as in NumPy.
      return a < 0 ? static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(a)) : a;
    } else {
      return std::fabs(a);
    }
  }
};

// Float-only functions computed in the operand's own precision (std::sin(float) for
// float32), as NumPy does.
#define GPUCOMPUTE_FLOAT_UNARY(Name, fn)          \
  struct Name {                                   \
    template <typename T>                         \
    static constexpr bool kAccepts = kIsFloat<T>; \
    template <typename T>                         \
    static T Apply(T a) {                         \
      return std::fn(a);                          \
    }                                             \
  };
GPUCOMPUTE_FLOAT_UNARY(Sin, sin)
GPUCOMPUTE_FLOAT_UNARY(Cos, cos)
GPUCOMPUTE_FLOAT_UNARY(Tan, tan)
GPUCOMPUTE_FLOAT_UNARY(Exp, exp)
GPUCOMPUTE_FLOAT_UNARY(Log, log)
GPUCOMPUTE_FLOAT_UNARY(Log1p, log1p)
GPUCOMPUTE_FLOAT_UNARY(Expm1, expm1)
GPUCOMPUTE_FLOAT_UNARY(Sqrt, sqrt)
GPUCOMPUTE_FLOAT_UNARY(Tanh, tanh)
GPUCOMPUTE_FLOAT_UNARY(Sinh, sinh)
GPUCOMPUTE_FLOAT_UNARY(Cosh, cosh)
GPUCOMPUTE_FLOAT_UNARY(Asin, asin)
GPUCOMPUTE_FLOAT_UNARY(Acos, acos)
GPUCOMPUTE_FLOAT_UNARY(Atan, atan)
GPUCOMPUTE_FLOAT_UNARY(Floor, floor)
GPUCOMPUTE_FLOAT_UNARY(Ceil, ceil)
GPUCOMPUTE_FLOAT_UNARY(Rint, rint)  // the default rounding mode: half to even
GPUCOMPUTE_FLOAT_UNARY(Trunc, trunc)
GPUCOMPUTE_FLOAT_UNARY(Exp2, exp2)
GPUCOMPUTE_FLOAT_UNARY(Log2, log2)
GPUCOMPUTE_FLOAT_UNARY(Log10, log10)
GPUCOMPUTE_FLOAT_UNARY(Cbrt, cbrt)
GPUCOMPUTE_FLOAT_UNARY(Asinh, asinh)
GPUCOMPUTE_FLOAT_UNARY(Acosh, acosh)
GPUCOMPUTE_FLOAT_UNARY(Atanh, atanh)
#undef GPUCOMPUTE_FLOAT_UNARY

// np.degrees and np.radians as NumPy's npymath computes them: one correctly rounded
// multiply by a factor that is itself rounded to T (180/pi divided in T's precision).
template <typename T>
inline constexpr T kDegreesPerRadian = T(180) / T(kPi);
template <typename T>
inline constexpr T kRadiansPerDegree = T(kPi) / T(180);

#define GPUCOMPUTE_SCALE(Name, factor)            \
  struct Name {                                   \
    template <typename T>                         \
    static constexpr bool kAccepts = kIsFloat<T>; \
    template <typename T>                         \
    static T Apply(T a) {                         \
      return a * factor<T>;                       \
    }                                             \
  };
GPUCOMPUTE_SCALE(Degrees, kDegreesPerRadian)
GPUCOMPUTE_SCALE(Radians, kRadiansPerDegree)
#undef GPUCOMPUTE_SCALE

// -1, 0 or 1; NaN stays NaN and sign(-0.0) is +0.0, as in NumPy.
struct Sign {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>((a > 0) - (a < 0));
    } else {
      return a > 0 ? T(1) : a < 0 ? T(-1) : a == 0 ? T(0) : a;
    }
  }
};

// NumPy computes an integer reciprocal as 1.0 / a converted back to the integer type: 1
// and -1 are their own reciprocals, every other value gives 0, and 1 / 0 gives what x86
// gives for converting inf, the most negative integer. We give that on every backend.
struct Reciprocal {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a) {
    if constexpr (kIsInt<T>) {
      return a == 0 ? std::numeric_limits<T>::min() : static_cast<T>(T(1) / a);
    } else {
      return T(1) / a;
    }
  }
};

// ~a on integers; on bools NumPy's invert is logical not.
struct Invert {
  template <typename T>
  static constexpr bool kAccepts = kIsIntOrBool<T>;
  template <typename T>
  static T Apply(T a) {
    if constexpr (kIsBool<T>) {
      return !a;
    } else {
      return static_cast<T>(~a);
    }
  }
};

struct LogicalNot {
  template <typename T>
  static constexpr bool kAccepts = kIsBool<T>;
  template <typename T>
  static bool Apply(T a) {
    return !a;
  }
};

// The float tests take any dtype and give bool; an integer or bool is finite, never NaN
// or infinite, and has its sign bit set exactly when it is negative.
#define GPUCOMPUTE_FLOAT_TEST(Name, fn, otherwise)  \
  struct Name {                                     \
    template <typename T>                           \
    static constexpr bool kAccepts = kIsAny<T>;     \
    template <typename T>                           \
    static bool Apply(T a) {                        \
      if constexpr (kIsFloat<T>) return std::fn(a); \
      return otherwise;                             \
    }                                               \
  };
GPUCOMPUTE_FLOAT_TEST(IsNan, isnan, false)
GPUCOMPUTE_FLOAT_TEST(IsInf, isinf, false)
GPUCOMPUTE_FLOAT_TEST(IsFinite, isfinite, true)
#undef GPUCOMPUTE_FLOAT_TEST

struct Signbit {
  template <typename T>
  static constexpr bool kAccepts = kIsAny<T>;
  template <typename T>
  static bool Apply(T a) {
    if constexpr (kIsFloat<T>) {
      return std::signbit(a);
    } else if constexpr (kIsInt<T>) {
      return a < 0;
    } else {
      return false;
    }
  }
};

// ---- binary ----

struct Add {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct Sub {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>(static_cast<Unsigned<T>>(a) - static_cast<Unsigned<T>>(b));
    } else {
      return a - b;
    }
  }
};

struct Mul {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      return static_cast<T>(static_cast<Unsigned<T>>(a) * static_cast<Unsigned<T>>(b));
    } else {
      return a * b;
    }
  }
};

// Integers wrap, as x * x does.
struct Square {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a) {
    return Mul::Apply(a, a);
  }
};

// True division; integer operands are converted to float64 by the compiler, so division
// by zero gives inf or NaN and never traps.
struct Div {
  template <typename T>
  static constexpr bool kAccepts = kIsFloat<T>;
  template <typename T>
  static T Apply(T a, T b) {
    return a / b;
  }
};

// Integer power wraps around. NumPy refuses negative integer exponents; we define the
// result as the real value truncated toward zero: 1 for base 1, 1 or -1 for base -1
// (even or odd exponent), and 0 for every other base, including 0.
struct Pow {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b & 1) ? -1 : 1;
        return 0;
      }
      using U = Unsigned<T>;
      U result = 1;
      U base = static_cast<U>(a);
      for (U e = static_cast<U>(b); e != 0; e >>= 1) {
        if (e & 1) result *= base;
        base *= base;
      }
      return static_cast<T>(result);
    } else {
      return std::pow(a, b);
    }
  }
};

// np.minimum / np.maximum: a NaN in either operand gives NaN.
struct Min {
  template <typename T>
  static constexpr bool kAccepts = kIsAny<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsFloat<T>) {
      return (a < b || a != a) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

struct Max {
  template <typename T>
  static constexpr bool kAccepts = kIsAny<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsFloat<T>) {
      return (a > b || a != a) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

struct Atan2 {
  template <typename T>
  static constexpr bool kAccepts = kIsFloat<T>;
  template <typename T>
  static T Apply(T y, T x) {
    return std::atan2(y, x);
  }
};

// NumPy's npy_divmod, which floor_divide and remainder of floats share: fmod, moved
// to the divisor's sign, and a quotient snapped to the nearest integer. Division by zero
// is handled by the callers.
template <typename T>
T FloatDivmod(T a, T b, T* modulus) {
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= T(1);
    }
  } else {
    mod = std::copysign(T(0), b);
  }
  T floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
  } else {
    floordiv = std::copysign(T(0), a / b);
  }
  *modulus = mod;
  return floordiv;
}

// a // b. Integers floor (Python's sign rule); // 0 gives 0 as in NumPy, without a
// trap, and INT_MIN // -1 wraps to INT_MIN. Floats as npy_floor_divide: // 0 is a / 0.
struct FloorDiv {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      if (b == 0) return 0;
      if (b == -1) return static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(a));
      const T q = static_cast<T>(a / b);
      return (a % b != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
    } else {
      if (b == 0) return a / b;
      T mod;
      return FloatDivmod(a, b, &mod);
    }
  }
};

// a % b (np.remainder): the sign of the divisor. Integer % 0 gives 0 as in NumPy; floats
// as npy_remainder: % 0 is fmod(a, 0), NaN.
struct Mod {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      if (b == 0 || b == -1) return 0;  // -1: INT_MIN % -1 would trap
      const T r = static_cast<T>(a % b);
      return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
    } else {
      if (b == 0) return std::fmod(a, b);
      T mod;
      FloatDivmod(a, b, &mod);
      return mod;
    }
  }
};

// C's fmod: the sign of the dividend. Integer fmod by 0 gives 0, as in NumPy.
struct Fmod {
  template <typename T>
  static constexpr bool kAccepts = kIsNumber<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsInt<T>) {
      if (b == 0 || b == -1) return 0;
      return static_cast<T>(a % b);
    } else {
      return std::fmod(a, b);
    }
  }
};

#define GPUCOMPUTE_FLOAT_BINARY(Name, fn)         \
  struct Name {                                   \
    template <typename T>                         \
    static constexpr bool kAccepts = kIsFloat<T>; \
    template <typename T>                         \
    static T Apply(T a, T b) {                    \
      return std::fn(a, b);                       \
    }                                             \
  };
GPUCOMPUTE_FLOAT_BINARY(Hypot, hypot)
GPUCOMPUTE_FLOAT_BINARY(Copysign, copysign)
#undef GPUCOMPUTE_FLOAT_BINARY

// np.fmax / np.fmin: a NaN operand yields the other one (NaN only when both are).
struct Fmax {
  template <typename T>
  static constexpr bool kAccepts = kIsAny<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsFloat<T>) {
      return (a >= b || b != b) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

struct Fmin {
  template <typename T>
  static constexpr bool kAccepts = kIsAny<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (kIsFloat<T>) {
      return (a <= b || b != b) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

#define GPUCOMPUTE_BITWISE(Name, op)                  \
  struct Name {                                       \
    template <typename T>                             \
    static constexpr bool kAccepts = kIsIntOrBool<T>; \
    template <typename T>                             \
    static T Apply(T a, T b) {                        \
      return static_cast<T>(a op b);                  \
    }                                                 \
  };
GPUCOMPUTE_BITWISE(BitAnd, &)
GPUCOMPUTE_BITWISE(BitOr, |)
GPUCOMPUTE_BITWISE(BitXor, ^)
#undef GPUCOMPUTE_BITWISE

// Shifts as NumPy's npy_lshift / npy_rshift: an amount outside [0, bits) shifts every
// bit out, giving 0 (left) or the sign (right: 0 or -1), instead of C's undefined result.
struct LeftShift {
  template <typename T>
  static constexpr bool kAccepts = kIsInt<T>;
  template <typename T>
  static T Apply(T a, T b) {
    using U = Unsigned<T>;
    if (static_cast<U>(b) >= sizeof(T) * 8) return 0;
    return static_cast<T>(static_cast<U>(a) << b);
  }
};

struct RightShift {
  template <typename T>
  static constexpr bool kAccepts = kIsInt<T>;
  template <typename T>
  static T Apply(T a, T b) {
    if (static_cast<Unsigned<T>>(b) >= sizeof(T) * 8) return a < 0 ? T(-1) : T(0);
    return static_cast<T>(a >> b);  // arithmetic (C++20)
  }
};

#define GPUCOMPUTE_LOGICAL(Name, op)             \
  struct Name {                                  \
    template <typename T>                        \
    static constexpr bool kAccepts = kIsBool<T>; \
    template <typename T>                        \
    static bool Apply(T a, T b) {                \
      return a op b;                             \
    }                                            \
  };
GPUCOMPUTE_LOGICAL(LogicalAnd, &&)
GPUCOMPUTE_LOGICAL(LogicalOr, ||)
GPUCOMPUTE_LOGICAL(LogicalXor, !=)
#undef GPUCOMPUTE_LOGICAL

#define GPUCOMPUTE_COMPARISON(Name, op)         \
  struct Name {                                 \
    template <typename T>                       \
    static constexpr bool kAccepts = kIsAny<T>; \
    template <typename T>                       \
    static bool Apply(T a, T b) {               \
      return a op b;                            \
    }                                           \
  };
GPUCOMPUTE_COMPARISON(Less, <)
GPUCOMPUTE_COMPARISON(LessEqual, <=)
GPUCOMPUTE_COMPARISON(Greater, >)
GPUCOMPUTE_COMPARISON(GreaterEqual, >=)
GPUCOMPUTE_COMPARISON(Equal, ==)
GPUCOMPUTE_COMPARISON(NotEqual, !=)
#undef GPUCOMPUTE_COMPARISON

// Calls fn(Op{}) with the functor for a unary OpKind (kNeg..kSignbit). Returns false
// (without calling fn) for any other OpKind.
template <typename Fn>
bool VisitUnaryOp(OpKind op, Fn&& fn) {
  switch (op) {
    case OpKind::kNeg:
      fn(Neg{});
      return true;
    case OpKind::kAbs:
      fn(Abs{});
      return true;
    case OpKind::kSin:
      fn(Sin{});
      return true;
    case OpKind::kCos:
      fn(Cos{});
      return true;
    case OpKind::kTan:
      fn(Tan{});
      return true;
    case OpKind::kExp:
      fn(Exp{});
      return true;
    case OpKind::kLog:
      fn(Log{});
      return true;
    case OpKind::kLog1p:
      fn(Log1p{});
      return true;
    case OpKind::kExpm1:
      fn(Expm1{});
      return true;
    case OpKind::kSqrt:
      fn(Sqrt{});
      return true;
    case OpKind::kTanh:
      fn(Tanh{});
      return true;
    case OpKind::kSinh:
      fn(Sinh{});
      return true;
    case OpKind::kCosh:
      fn(Cosh{});
      return true;
    case OpKind::kAsin:
      fn(Asin{});
      return true;
    case OpKind::kAcos:
      fn(Acos{});
      return true;
    case OpKind::kAtan:
      fn(Atan{});
      return true;
    case OpKind::kFloor:
      fn(Floor{});
      return true;
    case OpKind::kCeil:
      fn(Ceil{});
      return true;
    case OpKind::kRint:
      fn(Rint{});
      return true;
    case OpKind::kTrunc:
      fn(Trunc{});
      return true;
    case OpKind::kExp2:
      fn(Exp2{});
      return true;
    case OpKind::kLog2:
      fn(Log2{});
      return true;
    case OpKind::kLog10:
      fn(Log10{});
      return true;
    case OpKind::kCbrt:
      fn(Cbrt{});
      return true;
    case OpKind::kDegrees:
      fn(Degrees{});
      return true;
    case OpKind::kRadians:
      fn(Radians{});
      return true;
    case OpKind::kAsinh:
      fn(Asinh{});
      return true;
    case OpKind::kAcosh:
      fn(Acosh{});
      return true;
    case OpKind::kAtanh:
      fn(Atanh{});
      return true;
    case OpKind::kSign:
      fn(Sign{});
      return true;
    case OpKind::kSquare:
      fn(Square{});
      return true;
    case OpKind::kReciprocal:
      fn(Reciprocal{});
      return true;
    case OpKind::kInvert:
      fn(Invert{});
      return true;
    case OpKind::kLogicalNot:
      fn(LogicalNot{});
      return true;
    case OpKind::kIsNan:
      fn(IsNan{});
      return true;
    case OpKind::kIsInf:
      fn(IsInf{});
      return true;
    case OpKind::kIsFinite:
      fn(IsFinite{});
      return true;
    case OpKind::kSignbit:
      fn(Signbit{});
      return true;
    default:
      return false;
  }
}

// Same for the binary OpKinds kAdd..kNotEqual.
template <typename Fn>
bool VisitBinaryOp(OpKind op, Fn&& fn) {
  switch (op) {
    case OpKind::kAdd:
      fn(Add{});
      return true;
    case OpKind::kSub:
      fn(Sub{});
      return true;
    case OpKind::kMul:
      fn(Mul{});
      return true;
    case OpKind::kDiv:
      fn(Div{});
      return true;
    case OpKind::kPow:
      fn(Pow{});
      return true;
    case OpKind::kMin:
      fn(Min{});
      return true;
    case OpKind::kMax:
      fn(Max{});
      return true;
    case OpKind::kAtan2:
      fn(Atan2{});
      return true;
    case OpKind::kFloorDiv:
      fn(FloorDiv{});
      return true;
    case OpKind::kMod:
      fn(Mod{});
      return true;
    case OpKind::kFmod:
      fn(Fmod{});
      return true;
    case OpKind::kHypot:
      fn(Hypot{});
      return true;
    case OpKind::kCopysign:
      fn(Copysign{});
      return true;
    case OpKind::kFmax:
      fn(Fmax{});
      return true;
    case OpKind::kFmin:
      fn(Fmin{});
      return true;
    case OpKind::kBitAnd:
      fn(BitAnd{});
      return true;
    case OpKind::kBitOr:
      fn(BitOr{});
      return true;
    case OpKind::kBitXor:
      fn(BitXor{});
      return true;
    case OpKind::kLeftShift:
      fn(LeftShift{});
      return true;
    case OpKind::kRightShift:
      fn(RightShift{});
      return true;
    case OpKind::kLogicalAnd:
      fn(LogicalAnd{});
      return true;
    case OpKind::kLogicalOr:
      fn(LogicalOr{});
      return true;
    case OpKind::kLogicalXor:
      fn(LogicalXor{});
      return true;
    case OpKind::kLess:
      fn(Less{});
      return true;
    case OpKind::kLessEqual:
      fn(LessEqual{});
      return true;
    case OpKind::kGreater:
      fn(Greater{});
      return true;
    case OpKind::kGreaterEqual:
      fn(GreaterEqual{});
      return true;
    case OpKind::kEqual:
      fn(Equal{});
      return true;
    case OpKind::kNotEqual:
      fn(NotEqual{});
      return true;
    default:
      return false;
  }
}

}  // namespace gpucompute::expr::ops

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_SCALAR_OPS_H_

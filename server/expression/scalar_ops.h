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

// Integer + - * wrap around modulo 2^bits: done in the unsigned type, where overflow is
// defined, and converted back (modular since C++20).
template <typename T>
using Unsigned = std::make_unsigned_t<T>;

// static_cast semantics, except that a float outside the target integer range saturates
// and NaN gives 0 (C++ leaves both undefined; the service never asks for float -> int,
// but a defined answer costs nothing).
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
#undef GPUCOMPUTE_FLOAT_UNARY

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

// Calls fn(Op{}) with the functor for a unary OpKind (kNeg..kCeil). Returns false (without
// calling fn) for any other OpKind.
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

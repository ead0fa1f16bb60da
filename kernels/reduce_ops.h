// The reduction rules of every backend: for each ReduceKind, the operator (how an element
// is read, how two partial results merge, the identity, how the final accumulator becomes
// the output) and its input, accumulator and output types. Header-only and usable from
// host C++ and CUDA device code alike, like kernels/philox.h, so that the CPU backend
// (server/cpu/reduce.cc) and the CUDA kernels (kernels/cuda/reduce.cu, arg_extreme.cu)
// apply the same rules and differ only in the order in which they combine elements.
//
// Types (NumPy's; the output dtypes are ReduceResultDType in kernels/ops.h, and
// VisitReduceOp checks at compile time that the two agree):
//   sum    bool, int32, int64: accumulated in uint64, so that it wraps modulo 2^64, and
//          given as int64. float32, float64: accumulated in float64, rounded once to the
//          input type.
//   prod   integers as sum. Floats are multiplied in their own type, as NumPy does:
//          float32 products round to float32 after every multiplication.
//   mean   the float64 sum divided by the extent once (extent 0 gives 0 / 0 = NaN);
//          float inputs give their own type, integers float64.
//   norm2  sqrt of the plain float64 sum of squares, unscaled (float32 and integer
//          inputs cannot overflow; float64 squares overflow above about 1.3e154 and
//          underflow below about 1.5e-154, unlike BLAS nrm2). Output types as mean.
//   min, max        the input type; a NaN anywhere makes the result NaN.
//   argmin, argmax  int64: the position of the first NaN if there is one, else of the
//                   first extreme.
//   var, std  one pass over (count, mean, M2) triples in float64, merged by Chan, Golub and
//          LeVeque's update: a new element x is (1, x, 0) and two triples merge as
//          n = na + nb, d = mb - ma, mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n.
//          A backend may also form the triple of a block of elements it holds in fast
//          memory by two passes over the block (its mean, then the sum of squared
//          deviations from it), which is the merge of its elements in exact arithmetic.
//          Finalize divides M2 by max(n - ddof, 0) (so n - ddof <= 0 gives inf, or NaN
//          for M2 = 0, as NumPy's division does) and std takes the square root. Output
//          types as mean. Why one pass rather than NumPy's two (the mean, then the sum of
//          squared deviations): a reduction of an expression evaluates its expression once,
//          and every backend reads its input once; the merge is associative up to rounding,
//          so each backend fixes its order by the shape as it does for sums. Accuracy: the
//          merged M2 is as stable as the two-pass sum (each merge adds rounding errors
//          relative to the partial M2s, never the catastrophic cancellation of
//          sum(x^2) - n mean^2), so results agree with NumPy's float64 ones to within a
//          small multiple of (log2 n) float64 ulps of the variance for well-conditioned
//          data, and float32 results almost always round to the same float. An inf or NaN
//          element makes the variance NaN, as in NumPy (an element's M2 is x - x, NaN for
//          inf).
//   any, all  bool: whether any / every element is nonzero; NaN is nonzero. Empty: any
//          false, all true.
// Bools are stored as one byte, and any nonzero byte reads as true (1).
//
// Determinism. Every Combine is associative, exactly for integers and selections and up
// to rounding for float sums and products, and commutative up to the sign of zero and
// NaN payloads. Each backend fixes its combination order as a function of the shape alone
// (server/cpu/reduce.cc, kernels/cuda/detail/reduce_kernels.cuh), so every result is
// bitwise the same run to run, for any thread count and on any GPU. Reductions over any
// axes of strided arrays or of expressions (Backend::ReduceStrided) follow the same rule:
// the order is a function of the shape and the reduced axes alone (server/cpu/
// reduce_strided.cc, kernels/cuda/reduce_strided.cu). Across backends:
//   * integer sums and products (wrapping, exact), argmin and argmax (a total order on
//     (value, position)) are identical bit for bit on every backend;
//   * min and max select an element, identical on every backend, except that which zero
//     a tie between -0.0 and +0.0 gives follows the combination order; any and all are
//     exact;
//   * var and std: float64 merges in different orders, like float sums;
//   * float sums, means and norms accumulate in float64: backends differ by float64
//     roundings in different orders (about sqrt(n) float64 ulps), so float32 results,
//     rounded once from nearly equal values, are almost always identical;
//   * float products: float64 ones like sums. float32 ones round in float32 at every step,
//     so each backend's result is within gamma(n - 1) = (n - 1) u / (1 - (n - 1) u),
//     u = 2^-24, of the exact product, and two backends within twice that of each other.
//     Rounding can drift one way: for factors near 1, partial products that stay near 1
//     round down more often than up, so an order of many short partial products (the CUDA
//     kernels') drifts further than the CPU's long runs (2^20 factors in [0.999, 1.001]:
//     about 5e-4 low in the CUDA kernels' order, 8e-5 low on the CPU).
//     A running product that overflows to inf or underflows to 0 part way gives inf or 0
//     in one order and a finite value in another, as in NumPy.
#ifndef GPUCOMPUTE_KERNELS_REDUCE_OPS_H_
#define GPUCOMPUTE_KERNELS_REDUCE_OPS_H_

#include <math.h>
#include <stdint.h>

#include <limits>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/host_device.h"
#include "kernels/ops.h"

namespace gpucompute::reduce {

// How elements of C++ type T are stored: bools as one byte.
template <typename T>
struct StorageOf {
  using type = T;
};
template <>
struct StorageOf<bool> {
  using type = uint8_t;
};
template <typename T>
using Stored = typename StorageOf<T>::type;

template <typename T>
GPUCOMPUTE_HD T Normalize(T x) {
  return x;
}
GPUCOMPUTE_HD uint8_t Normalize(uint8_t x) { return x != 0; }

template <typename T>
GPUCOMPUTE_HD bool IsNan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x != x;
  } else {
    return false;
  }
}

// Converts an element to an accumulator type; integers go through int64 to uint64, so
// that sums and products wrap modulo 2^64 instead of overflowing.
template <typename Acc, typename In>
GPUCOMPUTE_HD Acc Widen(In x) {
  if constexpr (std::is_same_v<Acc, uint64_t>) {
    return static_cast<uint64_t>(static_cast<int64_t>(Normalize(x)));
  } else {
    return static_cast<Acc>(Normalize(x));
  }
}

// Every operator defines:
//   In, Acc, Out                       stored element, accumulator and output types
//   kUsesRow                           whether Convert reads `row` (only argmin, argmax)
//   Acc Identity()                     neutral element of Combine
//   Acc Convert(In x, int64_t row)     element x at extent position `row`
//   Acc Combine(Acc a, Acc b)          a holds the earlier elements where order matters
//   kUsesDdof                          whether Finalize takes ddof (only var, std)
//   Out Finalize(Acc a, int64_t extent) (var, std: Finalize(Acc a, int64_t extent, ddof))
// A reduction is Finalize(Convert(x_0, 0) (+) ... (+) Convert(x_{n-1}, n - 1), n), with
// (+) = Combine in some association order; Finish below calls Finalize with ddof where
// the operator takes it.

// What sum and product share: elements widened to the accumulator, which is cast to the
// output at the end.
template <typename InT, typename AccT, typename OutT>
struct WidenedOp {
  using In = InT;
  using Acc = AccT;
  using Out = OutT;
  static constexpr bool kUsesRow = false;
  static constexpr bool kUsesDdof = false;
  GPUCOMPUTE_HD static Acc Convert(In x, int64_t) { return Widen<Acc>(x); }
  GPUCOMPUTE_HD static Out Finalize(Acc a, int64_t) { return static_cast<Out>(a); }
};

template <typename InT, typename AccT, typename OutT>
struct SumOp : WidenedOp<InT, AccT, OutT> {
  GPUCOMPUTE_HD static AccT Identity() { return AccT{0}; }
  GPUCOMPUTE_HD static AccT Combine(AccT a, AccT b) { return a + b; }
};

template <typename InT, typename AccT, typename OutT>
struct ProdOp : WidenedOp<InT, AccT, OutT> {
  GPUCOMPUTE_HD static AccT Identity() { return AccT{1}; }
  GPUCOMPUTE_HD static AccT Combine(AccT a, AccT b) { return a * b; }
};

// A float64 sum divided by the extent once (extent 0 gives 0 / 0 = NaN).
template <typename InT, typename OutT>
struct MeanOp : SumOp<InT, double, OutT> {
  GPUCOMPUTE_HD static OutT Finalize(double a, int64_t extent) {
    return static_cast<OutT>(a / static_cast<double>(extent));
  }
};

// The square root of a float64 sum of squares.
template <typename InT, typename OutT>
struct Norm2Op : SumOp<InT, double, OutT> {
  GPUCOMPUTE_HD static double Convert(InT x, int64_t) {
    const double d = Widen<double>(x);
    return d * d;
  }
  GPUCOMPUTE_HD static OutT Finalize(double a, int64_t) { return static_cast<OutT>(sqrt(a)); }
};

// The worst value for max (kMax) or min: the identity of both and of argmax / argmin.
template <typename T, bool kMax>
GPUCOMPUTE_HD T ExtremeIdentity() {
  if constexpr (std::is_floating_point_v<T>) {
    return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  } else {
    return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
}

// Min (kMax false) or max. Equal values keep the left operand. Once a is NaN both
// comparisons are false and it stays NaN. A select, not a branch, so that the CPU's loops
// vectorise.
template <typename InT, bool kMax>
struct ExtremeOp {
  using In = InT;
  using Acc = InT;
  using Out = InT;
  static constexpr bool kUsesRow = false;
  static constexpr bool kUsesDdof = false;
  GPUCOMPUTE_HD static Acc Identity() { return ExtremeIdentity<In, kMax>(); }
  GPUCOMPUTE_HD static Acc Convert(In x, int64_t) { return Normalize(x); }
  GPUCOMPUTE_HD static Acc Combine(Acc a, Acc b) {
    return ((kMax ? b > a : b < a) || IsNan(b)) ? b : a;
  }
  GPUCOMPUTE_HD static Out Finalize(Acc a, int64_t) { return a; }
};

// A candidate of argmin/argmax: a value and its position.
template <typename T>
struct ArgPair {
  T value;
  int64_t row;
};

// Argmin (kMax false) or argmax. Combine keeps the preferred pair under a total order
// (NaN first, then the better value, then the smaller position), so it is associative and
// commutative and the result does not depend on the combination order at all. The
// identity's position, INT64_MAX, loses every tie with a real element.
template <typename InT, bool kMax>
struct ArgOp {
  using In = InT;
  using Acc = ArgPair<InT>;
  using Out = int64_t;
  static constexpr bool kUsesRow = true;
  static constexpr bool kUsesDdof = false;
  GPUCOMPUTE_HD static Acc Identity() {
    return {ExtremeIdentity<In, kMax>(), std::numeric_limits<int64_t>::max()};
  }
  GPUCOMPUTE_HD static Acc Convert(In x, int64_t row) { return {Normalize(x), row}; }
  GPUCOMPUTE_HD static Acc Combine(Acc a, Acc b) {
    const bool a_nan = IsNan(a.value);
    const bool b_nan = IsNan(b.value);
    bool take_b;
    if (a_nan || b_nan) {
      take_b = b_nan && (!a_nan || b.row < a.row);
    } else {
      take_b =
          (kMax ? b.value > a.value : b.value < a.value) || (b.value == a.value && b.row < a.row);
    }
    return take_b ? b : a;
  }
  // Combine(a, Convert(x, row)) when a holds an element (not the identity) from before
  // `row`: then only a strictly better value, or a first NaN, replaces it. Fewer
  // comparisons, for loops that visit positions in increasing order.
  GPUCOMPUTE_HD static Acc Append(Acc a, In x, int64_t row) {
    x = Normalize(x);
    const bool take = (kMax ? x > a.value : x < a.value) || (IsNan(x) && !IsNan(a.value));
    return take ? Acc{x, row} : a;
  }
  GPUCOMPUTE_HD static Out Finalize(Acc a, int64_t) { return a.row; }
};

// (count, mean, M2) of some elements: M2 is the sum of their squared deviations from
// their mean. Counts are float64, exact up to 2^53 elements.
struct Moments {
  double count;
  double mean;
  double m2;
};

// Variance (kStd false) or standard deviation, by merging Moments (see the file comment).
// Merging with an empty side returns the other side unchanged, so the identity adds no
// rounding.
template <typename InT, typename OutT, bool kStd>
struct VarOp {
  using In = InT;
  using Acc = Moments;
  using Out = OutT;
  static constexpr bool kUsesRow = false;
  static constexpr bool kUsesDdof = true;
  GPUCOMPUTE_HD static Acc Identity() { return {0.0, 0.0, 0.0}; }
  GPUCOMPUTE_HD static Acc Convert(In x, int64_t) {
    const double d = Widen<double>(x);
    return {1.0, d, d - d};  // 0, or NaN for inf and NaN
  }
  GPUCOMPUTE_HD static Acc Combine(Acc a, Acc b) {
    if (b.count == 0) return a;
    if (a.count == 0) return b;
    const double n = a.count + b.count;
    const double delta = b.mean - a.mean;
    const double wb = b.count / n;
    return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.count * wb};
  }
  GPUCOMPUTE_HD static Out Finalize(Acc a, int64_t, double ddof = 0.0) {
    const double divisor = a.count - ddof > 0 ? a.count - ddof : 0.0;
    const double var = a.m2 / divisor;
    return static_cast<Out>(kStd ? sqrt(var) : var);
  }
};

// Any (kAll false) or all: OR or AND of x != 0, so NaN counts as true. Accumulated as a
// byte 0 or 1, the stored form of bool.
template <typename InT, bool kAll>
struct LogicalOp {
  using In = InT;
  using Acc = uint8_t;
  using Out = uint8_t;
  static constexpr bool kUsesRow = false;
  static constexpr bool kUsesDdof = false;
  GPUCOMPUTE_HD static Acc Identity() { return kAll ? 1 : 0; }
  GPUCOMPUTE_HD static Acc Convert(In x, int64_t) { return x != In{0}; }
  GPUCOMPUTE_HD static Acc Combine(Acc a, Acc b) { return kAll ? (a & b) : (a | b); }
  GPUCOMPUTE_HD static Out Finalize(Acc a, int64_t) { return a; }
};

// Op::Finalize with ddof for the operators that take it.
template <class Op>
GPUCOMPUTE_HD typename Op::Out Finish(const typename Op::Acc& a, int64_t extent, double ddof) {
  if constexpr (Op::kUsesDdof) {
    return Op::Finalize(a, extent, ddof);
  } else {
    return Op::Finalize(a, extent);
  }
}

// ---- which operator each kind uses

template <typename T, typename IfFloat, typename Otherwise>
using FloatOr = std::conditional_t<std::is_floating_point_v<T>, IfFloat, Otherwise>;

// OpFor<kind, T>::type: the operator of `kind` for elements of C++ type T (bool,
// int32_t, int64_t, float or double).
template <ReduceKind kKind, typename T>
struct OpFor;
template <typename T>
struct OpFor<ReduceKind::kSum, T> {
  using type = SumOp<Stored<T>, FloatOr<T, double, uint64_t>, FloatOr<T, T, int64_t>>;
};
template <typename T>
struct OpFor<ReduceKind::kProd, T> {
  using type = ProdOp<Stored<T>, FloatOr<T, T, uint64_t>, FloatOr<T, T, int64_t>>;
};
template <typename T>
struct OpFor<ReduceKind::kMean, T> {
  using type = MeanOp<Stored<T>, FloatOr<T, T, double>>;
};
template <typename T>
struct OpFor<ReduceKind::kNorm2, T> {
  using type = Norm2Op<Stored<T>, FloatOr<T, T, double>>;
};
template <typename T>
struct OpFor<ReduceKind::kMin, T> {
  using type = ExtremeOp<Stored<T>, false>;
};
template <typename T>
struct OpFor<ReduceKind::kMax, T> {
  using type = ExtremeOp<Stored<T>, true>;
};
template <typename T>
struct OpFor<ReduceKind::kArgmin, T> {
  using type = ArgOp<Stored<T>, false>;
};
template <typename T>
struct OpFor<ReduceKind::kArgmax, T> {
  using type = ArgOp<Stored<T>, true>;
};

template <typename T>
struct OpFor<ReduceKind::kVar, T> {
  using type = VarOp<Stored<T>, FloatOr<T, T, double>, false>;
};
template <typename T>
struct OpFor<ReduceKind::kStd, T> {
  using type = VarOp<Stored<T>, FloatOr<T, T, double>, true>;
};
template <typename T>
struct OpFor<ReduceKind::kAny, T> {
  using type = LogicalOp<Stored<T>, false>;
};
template <typename T>
struct OpFor<ReduceKind::kAll, T> {
  using type = LogicalOp<Stored<T>, true>;
};

// The DType of a stored element type.
template <typename S>
constexpr DType StoredDType() {
  if constexpr (std::is_same_v<S, uint8_t>) {
    return DType::kBool;
  } else {
    return DTypeOf<S>::value;
  }
}

template <ReduceKind kKind, typename T, typename Fn>
decltype(auto) CallWithOp(Fn&& fn) {
  using Op = typename OpFor<kKind, T>::type;
  static_assert(StoredDType<typename Op::Out>() == ReduceResultDType(kKind, DTypeOf<T>::value),
                "an operator's output type must be the result dtype of kernels/ops.h");
  return fn(Op{});
}

// Calls fn(Op{}) with Op = OpFor<kind, T>::type and returns its result. Host code. With
// kShapeKindsOnly, only the kinds of Backend::Reduce are instantiated (kShapeReduceKinds
// in kernels/ops.h), and the caller must have checked IsShapeReduceKind(kind).
template <typename T, bool kShapeKindsOnly = false, typename Fn>
decltype(auto) VisitReduceOp(ReduceKind kind, Fn&& fn) {
  if constexpr (!kShapeKindsOnly) {
    switch (kind) {
      case ReduceKind::kVar:
        return CallWithOp<ReduceKind::kVar, T>(fn);
      case ReduceKind::kStd:
        return CallWithOp<ReduceKind::kStd, T>(fn);
      case ReduceKind::kAny:
        return CallWithOp<ReduceKind::kAny, T>(fn);
      case ReduceKind::kAll:
        return CallWithOp<ReduceKind::kAll, T>(fn);
      default:
        break;
    }
  }
  switch (kind) {
    case ReduceKind::kSum:
      return CallWithOp<ReduceKind::kSum, T>(fn);
    case ReduceKind::kProd:
      return CallWithOp<ReduceKind::kProd, T>(fn);
    case ReduceKind::kMean:
      return CallWithOp<ReduceKind::kMean, T>(fn);
    case ReduceKind::kNorm2:
      return CallWithOp<ReduceKind::kNorm2, T>(fn);
    case ReduceKind::kMin:
      return CallWithOp<ReduceKind::kMin, T>(fn);
    case ReduceKind::kMax:
      return CallWithOp<ReduceKind::kMax, T>(fn);
    case ReduceKind::kArgmin:
      return CallWithOp<ReduceKind::kArgmin, T>(fn);
    default:
      break;
  }
  return CallWithOp<ReduceKind::kArgmax, T>(fn);
}

}  // namespace gpucompute::reduce

#endif  // GPUCOMPUTE_KERNELS_REDUCE_OPS_H_

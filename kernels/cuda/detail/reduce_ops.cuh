// The reduction operators of the CUDA backend: for each ReduceKind, how an element is
// read (Convert), how two partial results merge (Combine), the identity, and how the
// final accumulator becomes the output (Finalize). They mirror server/cpu/reduce.cc
// operator by operator (accumulator types, wrapping, NaN rules), so the two backends
// differ only in the order in which a sum or product is associated.
//
// Every Combine here is associative, and commutative up to the sign of zero and NaN
// payloads, so a reduction may be split among threads in any fixed way. Sums and
// products of floats then depend on that split; kernels/cuda/detail/reduce_kernels.cuh
// fixes it as a function of the shape alone.
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_OPS_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_OPS_CUH_

#include <cstdint>
#include <limits>
#include <type_traits>

namespace gpucompute::cuda::detail {

// Bools are stored as one byte; any nonzero byte reads as true (1), as on the CPU.
template <typename T> struct StorageOf { using type = T; };
template <> struct StorageOf<bool> { using type = uint8_t; };

template <typename T> __host__ __device__ __forceinline__ T Normalize(T x) { return x; }
__host__ __device__ __forceinline__ uint8_t Normalize(uint8_t x) { return x != 0; }

template <typename T> __host__ __device__ __forceinline__ bool IsNan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x != x;
  } else {
    return false;
  }
}

// Integers go through int64 to uint64, so that sums and products wrap modulo 2^64.
template <typename Acc, typename In> __host__ __device__ __forceinline__ Acc Widen(In x) {
  if constexpr (std::is_same_v<Acc, uint64_t>) {
    return static_cast<uint64_t>(static_cast<int64_t>(Normalize(x)));
  } else {
    return static_cast<Acc>(Normalize(x));
  }
}

// The interface every op implements:
//   In, Acc, Out                            stored element, accumulator, output types
//   Acc Identity()                          neutral element of Combine
//   Acc Convert(In x, int64_t row)          element x at extent position `row`
//   Acc Combine(Acc a, Acc b)
//   Out Finalize(Acc a, int64_t extent)

template <typename InT, typename AccT, typename OutT> struct SumOp {
  using In = InT;
  using Acc = AccT;
  using Out = OutT;
  __host__ __device__ static Acc Identity() { return Acc{0}; }
  __host__ __device__ static Acc Convert(In x, int64_t) { return Widen<Acc>(x); }
  __host__ __device__ static Acc Combine(Acc a, Acc b) { return a + b; }
  __host__ __device__ static Out Finalize(Acc a, int64_t) { return static_cast<Out>(a); }
};

// Float products accumulate in float64 (float32 inputs too) and round once to the output
// type. Here the CPU differs: server/cpu/reduce.cc multiplies float32 in float32, each lane
// a long run of rows in order. The GPU's split into many short runs whose partial products
// stay near 1 made float32 accumulation biased: for factors near 1 the exact product of a
// partial above 1 and a factor below 1 falls just short of a half-ulp tie, which always
// rounds down (a 2^20-factor product of values in [0.999, 1.001] came out 5e-4 low).
// Float64 removes that (its error is about 2^-29 of float32's) and is more accurate than
// the CPU. Where the CPU's float32 running product overflows to inf or underflows to 0
// part way and the full product would not, the two backends differ (the GPU's is right).
template <typename InT, typename AccT, typename OutT> struct ProdOp {
  using In = InT;
  using Acc = AccT;
  using Out = OutT;
  __host__ __device__ static Acc Identity() { return Acc{1}; }
  __host__ __device__ static Acc Convert(In x, int64_t) { return Widen<Acc>(x); }
  __host__ __device__ static Acc Combine(Acc a, Acc b) { return a * b; }
  __host__ __device__ static Out Finalize(Acc a, int64_t) { return static_cast<Out>(a); }
};

// The float64 sum divided by the extent once (extent 0 gives 0 / 0 = NaN).
template <typename InT, typename OutT> struct MeanOp {
  using In = InT;
  using Acc = double;
  using Out = OutT;
  __host__ __device__ static Acc Identity() { return 0.0; }
  __host__ __device__ static Acc Convert(In x, int64_t) { return Widen<double>(x); }
  __host__ __device__ static Acc Combine(Acc a, Acc b) { return a + b; }
  __host__ __device__ static Out Finalize(Acc a, int64_t extent) {
    return static_cast<Out>(a / static_cast<double>(extent));
  }
};

// sqrt of the plain float64 sum of squares, unscaled, as on the CPU (float32 and integer
// inputs cannot overflow; float64 squares overflow above about 1.3e154).
template <typename InT, typename OutT> struct Norm2Op {
  using In = InT;
  using Acc = double;
  using Out = OutT;
  __host__ __device__ static Acc Identity() { return 0.0; }
  __host__ __device__ static Acc Convert(In x, int64_t) {
    const double d = Widen<double>(x);
    return d * d;
  }
  __host__ __device__ static Acc Combine(Acc a, Acc b) { return a + b; }
  __host__ __device__ static Out Finalize(Acc a, int64_t) { return static_cast<Out>(sqrt(a)); }
};

template <typename T, bool kMax> __host__ __device__ __forceinline__ T ExtremeIdentity() {
  if constexpr (std::is_floating_point_v<T>) {
    return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  } else {
    return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
}

// Min (kMax false) or max; a NaN anywhere makes the result NaN. Equal values keep the
// left operand, so which zero (-0.0 or +0.0) a tie between them yields depends on the
// combination order, as on the CPU; the order is fixed by the shape, so it is the same
// run to run.
template <typename InT, bool kMax> struct ExtremeOp {
  using In = InT;
  using Acc = InT;
  using Out = InT;
  __host__ __device__ static Acc Identity() { return ExtremeIdentity<In, kMax>(); }
  __host__ __device__ static Acc Convert(In x, int64_t) { return Normalize(x); }
  __host__ __device__ static Acc Combine(Acc a, Acc b) {
    return ((kMax ? b > a : b < a) || IsNan(b)) ? b : a;
  }
  __host__ __device__ static Out Finalize(Acc a, int64_t) { return a; }
};

// A candidate of argmin/argmax: a value and its extent position.
template <typename T> struct ArgPair {
  T value;
  int64_t row;
};

// Argmin (kMax false) or argmax: the first NaN if there is one, else the first extreme.
// Combine keeps the preferred pair under a total order (NaN first, then the better value,
// then the smaller row), so it is associative and commutative and the result does not
// depend on the combination order at all: it equals the CPU's exactly.
template <typename InT, bool kMax> struct ArgOp {
  using In = InT;
  using Acc = ArgPair<InT>;
  using Out = int64_t;
  __host__ __device__ static Acc Identity() {
    return {ExtremeIdentity<In, kMax>(), std::numeric_limits<int64_t>::max()};
  }
  __host__ __device__ static Acc Convert(In x, int64_t row) { return {Normalize(x), row}; }
  __host__ __device__ static Acc Combine(Acc a, Acc b) {
    const bool a_nan = IsNan(a.value);
    const bool b_nan = IsNan(b.value);
    bool take_b;
    if (a_nan || b_nan) {
      take_b = b_nan && (!a_nan || b.row < a.row);
    } else {
      take_b = (kMax ? b.value > a.value : b.value < a.value) ||
               (b.value == a.value && b.row < a.row);
    }
    return take_b ? b : a;
  }
  __host__ __device__ static Out Finalize(Acc a, int64_t) { return a.row; }
};

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_OPS_CUH_

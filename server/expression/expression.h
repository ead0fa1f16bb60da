// Elementwise expressions: `a*x + y`, `where(x > 0, sqrt(x), -x)`, ... over named inputs
// that are equally long arrays or scalars. Compile() parses and type-checks the text once
// into an immutable Program that any backend can evaluate (the CPU backend with
// cpu::EvaluateElementwise, a GPU backend by generating code from Program::ir()).
//
// Syntax (Python's, restricted; docs/expressions.md is the user's list):
//   comparison := bitor [('<' | '<=' | '>' | '>=' | '==' | '!=') bitor]   (chains rejected)
//   bitor      := bitxor ('|' bitxor)*
//   bitxor     := bitand ('^' bitand)*
//   bitand     := shift ('&' shift)*
//   shift      := sum (('<<' | '>>') sum)*
//   sum        := term (('+' | '-') term)*
//   term       := unary (('*' | '/' | '//' | '%') unary)*
//   unary      := ('-' | '+' | '~') unary | power
//   power      := primary ['**' unary]              (right-assoc; -x**2 == -(x**2))
//   primary    := number | 'True' | 'False' | name | name '(' args ')' | '(' comparison ')'
// Numbers: `2`, `2.5`, `1e-3`, `.5`, `3.` (an integer literal must fit in int64). Python's
// `and`, `or` and `not` are errors (an array has no single truth value), as in NumPy.
// Functions, under NumPy's names (and the short names of the first version):
//   one argument: sin cos tan arcsin/asin arccos/acos arctan/atan sinh cosh tanh arcsinh
//     arccosh arctanh exp exp2 expm1 log log2 log10 log1p sqrt cbrt square reciprocal
//     floor ceil rint trunc sign absolute/abs negative positive degrees/rad2deg
//     radians/deg2rad isnan isinf isfinite signbit logical_not invert/bitwise_not, and the
//     casts bool int32 int64 float32 float64;
//   two: add subtract multiply divide/true_divide floor_divide remainder/mod fmod
//     power/pow arctan2/atan2 hypot copysign maximum/max minimum/min fmax fmin
//     bitwise_and bitwise_or bitwise_xor left_shift right_shift logical_and logical_or
//     logical_xor less less_equal greater greater_equal equal not_equal;
//   round(x) or round(x, decimals) (decimals an integer literal or integer scalar input),
//   clip(x, lo, hi), where(c, a, b);
//   index(k) (k an integer literal): each element's coordinate along axis k of the
//     result, an int64 array (numpy.indices(shape)[k]). The result's rank is not known
//     here: k stays as written (IndexAxes) and the caller checks it against the rank.
// A name followed by '(' is a function; any other name is an input, so an input may be
// called `sin`. Limits, because the text comes from the network: at most
// kMaxExpressionLength bytes and max_depth (at most kMaxNestingDepth) levels of nesting
// (each parenthesis, function call, unary operator and ** exponent is a level); the
// parser's recursion is bounded by the latter.
//
// Types follow NumPy 2 (NEP 50) over bool < int32 < int64 < float32 < float64:
//  - array op array: np.result_type (int32+float32 and int64+float32 give float64).
//  - A scalar input or literal is a "weak" Python scalar: with an array it takes the array's
//    dtype if of the same kind (int with int32 stays int32, float with float32 stays
//    float32); an int scalar with a bool array gives int64; a float scalar with a bool or
//    int array gives float64. An integer scalar that does not fit the array's integer
//    dtype is an error (NumPy 2 raises OverflowError), also for comparisons (where NumPy 2
//    compares exactly).
//  - weak op weak stays weak and is folded at compile time, in int64 (wrapping, unlike
//    Python's unbounded ints) or float64; this applies to functions as well: sin(2) is a
//    weak float. A result that is still weak at the end is int64, float64 or bool.
//  - A cast gives a strong (typed) value, like np.float32(2.5): float32(2) + x is float64
//    for a float64 x. Float to integer truncates; NaN gives 0 and values out of range
//    saturate (ops::Convert), where NumPy's result depends on the CPU.
//  - `/` is true division: integer / integer is float64. `**` and pow on integers give an
//    integer, also for weak scalars (2**-1 is 0, not Python's 0.5): see ops::Pow.
//  - The float functions (sin..arctanh, floor, ceil, rint, trunc, exp2, log2, log10, cbrt,
//    degrees, radians) of an integer compute in float64, of float32 in float32; abs, sign,
//    square, reciprocal and unary minus of an integer stay integer (wrapping). round(x) of
//    an integer is x; round(x, d) keeps x's dtype (NumPy's algorithm, see ops and
//    docs/expressions.md).
//  - Binary functions promote like binary arithmetic; atan2, hypot and copysign of
//    integers are float64; //, % and fmod of integers stay integer (floor, and the
//    divisor's sign for %; by zero they give 0, as in NumPy, without a trap); comparisons
//    give bool. clip promotes its three arguments.
//  - Bitwise operators and shifts take integers and bools only (a float is an error, as
//    NumPy's "ufunc 'bitwise_and' not supported for the input types"); ~ of a bool is
//    logical not. Shifts by a negative amount or the width or more give 0 (or -1 for >>
//    of a negative value).
//  - isnan, isinf, isfinite and signbit take any dtype and give bool; logical_* take any
//    dtype (as x != 0, so NaN is true) and give bool.
//  - where(c, a, b): a non-bool c means c != 0; the result is promote(a, b).
//  - bool op bool for + - * / // % ** << >> and pow, atan2, hypot, fmod, copysign of two
//    bools, unary minus of a bool and any numeric one-argument function of a bool are
//    errors (NumPy rejects or computes in int8 or float16, which we do not have). min,
//    max, fmin, fmax, clip, comparisons, bitwise and logical functions, the float tests
//    and where accept bools.
// Integer + - * wrap around; integer true division by zero gives what float64 gives.
//
// Every error is INVALID_ARGUMENT. Errors found in the text say "at position P: ..." with P
// the 0-based byte offset of the problem.
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_EXPRESSION_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_EXPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "server/expression/ir.h"

namespace gpucompute::expr {

inline constexpr size_t kMaxExpressionLength = 64 * 1024;
inline constexpr int kMaxNestingDepth = 256;

// An input bound to an array of `dtype` (all arrays of one evaluation have n elements).
struct ArrayInput {
  DType dtype;
};

// An input bound to a scalar, which is weak (see above). kBool, kInt32 and kInt64 take the
// value from `i` (a bool is i != 0); kFloat32 and kFloat64 from `f`. Only the kind matters
// for typing: an int32 scalar is a Python int like any other.
struct ScalarInput {
  DType dtype;
  double f = 0;
  int64_t i = 0;
};

using InputType = std::variant<ArrayInput, ScalarInput>;
using InputMap = std::map<std::string, InputType, std::less<>>;

// A parsed, type-checked expression. Immutable and cheap to copy (copies share the
// compiled state); evaluating one Program from several threads at once is safe.
class Program {
 public:
  // The dtype of the result (NumPy's, before any conversion into an output buffer).
  DType result_dtype() const;
  // The names of all inputs, sorted (byte order). Every bound input is used by the
  // expression. Evaluation takes one pointer per name, in this order.
  const std::vector<std::string>& inputs() const;
  // The binding of inputs()[k]. Scalar values are baked into the Program.
  const std::vector<InputType>& input_types() const;
  // Arithmetic operations, comparisons, function calls and where()s that run for each
  // element, counted as written (a repeated subexpression counts each time it appears;
  // dtype conversions, casts included, and work on scalars alone, which is folded at
  // compile time, do not count; clip counts as its maximum and minimum, round(x, d) as
  // its multiply, rint and divide, or both forms and a where() when d is a scalar input).
  // For GFLOP/s reporting.
  int64_t ops_per_element() const;
  // A canonical, fully parenthesised and typed rendering of ir(), e.g.
  // `add<float32>(mul<float32>(param0<float32>, in1<float32>), in2<float32>)` for `a*x + y`
  // with a scalar `a` and float32 arrays `x`, `y`. Arrays appear as their index in inputs();
  // literals by value; constants derived from scalar inputs as numbered parameters. So
  // the text depends only on the expression and the input dtypes, never on scalar values,
  // and a backend may key compiled kernels on it (taking parameters as kernel arguments).
  const std::string& canonical() const;
  // The typed IR, for backends. See ir.h for its invariants.
  const Ir& ir() const;

 private:
  struct State;
  explicit Program(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  friend absl::StatusOr<Program> Compile(std::string_view text, const InputMap& inputs,
                                         int max_depth);
  friend Program IndexAsInputs(const Program& program);

  std::shared_ptr<const State> state_;
};

// Parses and type-checks `text` with the given input bindings, nested at most `max_depth`
// levels (kMaxNestingDepth where it is larger; the server's --max-expression-depth).
// Errors: INVALID_ARGUMENT for malformed text, unknown functions or names, wrong argument
// counts, type errors, limits, inputs that are bound but never used, and input names that
// are not identifiers.
absl::StatusOr<Program> Compile(std::string_view text, const InputMap& inputs,
                                int max_depth = kMaxNestingDepth);

// `program` with each index(k) node (IndexAxes, in that order) read from one more int64
// array input instead, after the existing ones, named "~index0", "~index1", ... (which
// sort after every identifier). For a backend that supplies the coordinates along axis k
// as an array broadcast over the other axes (IndexCoordinatesLayout), so that its kernels
// need no code of their own for index().
Program IndexAsInputs(const Program& program);

// NumPy's casting="same_kind": whether a value of `from` may be stored into a buffer of
// `to`. bool goes anywhere; an integer to any integer or float; a float to any float.
// Never float -> integer, never integer or float -> bool.
bool CanCastSameKind(DType from, DType to);

}  // namespace gpucompute::expr

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_EXPRESSION_H_

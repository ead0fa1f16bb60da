// Elementwise expressions: `a*x + y`, `where(x > 0, sqrt(x), -x)`, ... over named inputs
// that are equally long arrays or scalars. Compile() parses and type-checks the text once
// into an immutable Program that any backend can evaluate (the CPU backend with
// cpu::EvaluateElementwise, a GPU backend by generating code from Program::ir()).
//
// Syntax (Python's, restricted):
//   comparison := sum [('<' | '<=' | '>' | '>=' | '==' | '!=') sum]   (chains rejected)
//   sum        := term (('+' | '-') term)*
//   term       := unary (('*' | '/') unary)*
//   unary      := ('-' | '+') unary | power
//   power      := primary ['**' unary]              (right-assoc; -x**2 == -(x**2))
//   primary    := number | 'True' | 'False' | name | name '(' args ')' | '(' comparison ')'
// Numbers: `2`, `2.5`, `1e-3`, `.5`, `3.` (an integer literal must fit in int64).
// Functions: sin cos tan exp log log1p expm1 sqrt abs tanh sinh cosh asin acos atan floor
// ceil (one argument), atan2(y, x), pow(a, b), min(a, b), max(a, b), where(c, a, b).
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
//  - `/` is true division: integer / integer is float64. `**` and pow on integers give an
//    integer, also for weak scalars (2**-1 is 0, not Python's 0.5): see ops::Pow.
//  - sin..ceil (floor and ceil included) of an integer compute in float64, of float32 in
//    float32; abs and unary minus of an integer stay integer (wrapping).
//  - min, max, atan2 and comparisons promote like binary arithmetic (atan2 of integers is
//    float64); comparisons give bool.
//  - where(c, a, b): a non-bool c means c != 0; the result is promote(a, b).
//  - bool op bool for + - * / ** and pow, atan2 of two bools, unary minus of a bool and
//    any one-argument function of a bool are errors (NumPy rejects or silently means
//    logical or/and; neither is what a caller of `x + y` wants). min, max, comparisons and
//    where accept bools.
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
  // dtype conversions and work on scalars alone, which is folded at compile time, do not
  // count). For GFLOP/s reporting.
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

  std::shared_ptr<const State> state_;
};

// Parses and type-checks `text` with the given input bindings, nested at most `max_depth`
// levels (kMaxNestingDepth where it is larger; the server's --max-expression-depth).
// Errors: INVALID_ARGUMENT for malformed text, unknown functions or names, wrong argument
// counts, type errors, limits, inputs that are bound but never used, and input names that
// are not identifiers.
absl::StatusOr<Program> Compile(std::string_view text, const InputMap& inputs,
                                int max_depth = kMaxNestingDepth);

// NumPy's casting="same_kind": whether a value of `from` may be stored into a buffer of
// `to`. bool goes anywhere; an integer to any integer or float; a float to any float.
// Never float -> integer, never integer or float -> bool.
bool CanCastSameKind(DType from, DType to);

}  // namespace gpucompute::expr

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_EXPRESSION_H_

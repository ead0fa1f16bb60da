#include "server/expression/expression.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "server/expression/functions.h"
#include "server/expression/lexer.h"
#include "server/expression/promotion.h"
#include "server/util/status_macros.h"

namespace gpucompute::expr {

struct Program::State {
  Ir ir;
  std::vector<std::string> inputs;
  std::vector<InputType> input_types;
  int64_t ops_per_element = 0;
  std::string canonical;
};

DType Program::result_dtype() const { return state_->ir.nodes[state_->ir.root].dtype; }
const std::vector<std::string>& Program::inputs() const { return state_->inputs; }
const std::vector<InputType>& Program::input_types() const { return state_->input_types; }
int64_t Program::ops_per_element() const { return state_->ops_per_element; }
const std::string& Program::canonical() const { return state_->canonical; }
const Ir& Program::ir() const { return state_->ir; }

bool CanCastSameKind(DType from, DType to) {
  if (from == to || from == DType::kBool) return true;
  if (to == DType::kBool) return false;
  if (IsInteger(from)) return true;  // to a wider or narrower int, or to a float
  return IsFloat(to);                // float -> float only
}

using internal::Append;
using internal::Cat;
using internal::ConvertConstant;
using internal::ErrorAt;
using internal::FoldBinary;
using internal::FoldUnary;
using internal::FindFunction;
using internal::Form;
using internal::FormatConstant;
using internal::FunctionInfo;
using internal::IsIdentifier;
using internal::Lexer;
using internal::Promote;
using internal::Promoted;
using internal::Quote;
using internal::Tok;
using internal::Token;
using internal::Value;

namespace {

// Python's `and`, `or` and `not` ask for one truth value, which an array does not have
// (NumPy raises); the elementwise forms are functions and, on bools, operators.
absl::Status KeywordError(std::string_view word, int32_t pos) {
  const char* instead = word == "and"   ? "logical_and(a, b), or a & b on bools"
                        : word == "or"  ? "logical_or(a, b), or a | b on bools"
                        : word == "not" ? "logical_not(x), or ~x on bools"
                                        : nullptr;
  if (instead == nullptr) return absl::OkStatus();
  return ErrorAt(pos, Cat(Quote(word),
                          " is not supported (an array has no single truth value); use ", instead));
}

// The binary operators by precedence, loosest first, as in Python: | ^ & (<< >>) (+ -)
// (* / // %). Comparisons bind looser still; unary - + ~ and ** tighter.
struct BinaryOperator {
  Tok tok;
  int8_t precedence;
  OpKind op;
  std::string_view what;
};

constexpr BinaryOperator kBinaryOperators[] = {
    {Tok::kBar, 1, OpKind::kBitOr, "operator '|'"},
    {Tok::kCaret, 2, OpKind::kBitXor, "operator '^'"},
    {Tok::kAmpersand, 3, OpKind::kBitAnd, "operator '&'"},
    {Tok::kShiftLeft, 4, OpKind::kLeftShift, "operator '<<'"},
    {Tok::kShiftRight, 4, OpKind::kRightShift, "operator '>>'"},
    {Tok::kPlus, 5, OpKind::kAdd, "operator '+'"},
    {Tok::kMinus, 5, OpKind::kSub, "operator '-'"},
    {Tok::kStar, 6, OpKind::kMul, "operator '*'"},
    {Tok::kSlash, 6, OpKind::kDiv, "operator '/'"},
    {Tok::kSlashSlash, 6, OpKind::kFloorDiv, "operator '//'"},
    {Tok::kPercent, 6, OpKind::kMod, "operator '%'"},
};

const BinaryOperator* FindBinaryOperator(Tok tok) {
  for (const BinaryOperator& o : kBinaryOperators) {
    if (o.tok == tok) return &o;
  }
  return nullptr;
}

// numpy.round's 10**n (power_of_ten in NumPy's multiarray/calculation.c): exact up to
// 1e8, then repeated multiplication by 10, which rounds as NumPy's does.
double PowerOfTen(uint64_t n) {
  constexpr double kExact[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8};
  if (n < 9) return kExact[n];
  double r = 1e9;
  for (; n > 9 && r != std::numeric_limits<double>::infinity(); --n) r *= 10.0;
  return r;
}

// Identical nodes are merged, so a subexpression written twice is computed once.
struct NodeKey {
  OpKind op;
  DType dtype;
  std::array<int32_t, 3> args;
  int32_t input;
  int64_t i;
  uint64_t f_bits;
  bool operator==(const NodeKey&) const = default;
};

struct NodeKeyHash {
  size_t operator()(const NodeKey& k) const {
    uint64_t h =
        static_cast<uint64_t>(k.op) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(k.dtype);
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 29); };
    for (int32_t a : k.args) mix(static_cast<uint32_t>(a));
    mix(static_cast<uint32_t>(k.input));
    mix(static_cast<uint64_t>(k.i));
    mix(k.f_bits);
    return static_cast<size_t>(h);
  }
};

// What Compile() puts into a Program.
struct Compiled {
  Ir ir;
  std::vector<std::string> inputs;
  std::vector<InputType> input_types;
  int64_t ops_per_element = 0;
  std::string canonical;
};

// ---------------------------------------------------------------------------------------
// The compiler: a recursive-descent parser that type-checks, folds and emits IR nodes as it
// goes, so nothing ever recurses over the (possibly very deep) result. Its own recursion
// is bounded by its max_depth, at most kMaxNestingDepth.

class Compiler {
 public:
  Compiler(std::string_view text, const InputMap& inputs, int max_depth)
      : text_(text),
        inputs_(inputs),
        max_depth_(std::min(max_depth, kMaxNestingDepth)),
        lexer_(text) {}

  absl::StatusOr<Compiled> Run();
  // Program::canonical() of `ir`.
  static std::string Render(const Ir& ir);

 private:
  [[gnu::noinline, gnu::cold]] absl::Status Unexpected(std::string_view expected) const;
  const Token& tok() const { return lexer_.token(); }
  std::string_view TokenText() const { return lexer_.text(); }
  std::string DescribeToken() const;

  absl::Status Advance() { return lexer_.Advance(); }
  absl::Status EnterLevel(int32_t pos);

  absl::StatusOr<Value> ParseComparison();
  absl::StatusOr<Value> ParseBinary(int min_precedence);
  absl::StatusOr<Value> ParseUnary();
  absl::StatusOr<Value> ParsePower();
  absl::StatusOr<Value> ParsePrimary();
  absl::StatusOr<Value> ParseNumber();
  absl::StatusOr<Value> ParseName();
  absl::StatusOr<Value> ParseCall(const FunctionInfo& f, int32_t name_pos);

  absl::StatusOr<Value> Unary(OpKind op, const Value& a, int32_t pos, std::string_view what);
  absl::StatusOr<Value> Binary(OpKind op, const Value& a, const Value& b, int32_t pos,
                               std::string_view what);
  absl::StatusOr<Value> Where(const Value& c, const Value& a, const Value& b, int32_t pos);
  absl::StatusOr<Value> Round(const Value& x, const Value& decimals, int32_t pos);
  absl::StatusOr<Value> Cast(const Value& x, DType dtype, int32_t pos);
  // `v` converted to `dtype`, staying weak if it is (for round's integer path).
  Value CastWeakOrStrong(const Value& v, DType dtype);

  // The IR node holding `v` converted to `dtype`.
  absl::StatusOr<int32_t> Materialize(const Value& v, DType dtype);
  int32_t AddNode(OpKind op, DType dtype, std::initializer_list<int32_t> args, int32_t input = -1,
                  const ConstantValue& value = {}, bool parameter = false);
  Value Strong(int32_t node, int32_t pos) const {
    Value v;
    v.dtype = nodes_[node].dtype;
    v.node = node;
    v.pos = pos;
    return v;
  }

  Ir Finish(int32_t root) const;

  std::string_view text_;
  const InputMap& inputs_;
  const int max_depth_;
  std::vector<std::string> names_;  // inputs_'s keys, in order
  std::vector<InputType> types_;
  std::vector<bool> used_;

  Lexer lexer_;
  int depth_ = 0;

  std::vector<Node> nodes_;
  std::unordered_map<NodeKey, int32_t, NodeKeyHash> dedup_;
  int64_t ops_ = 0;
};

// Leaves one nesting level when it goes out of scope.
class LevelGuard {
 public:
  explicit LevelGuard(int* depth) : depth_(depth) {}
  ~LevelGuard() { --*depth_; }
  LevelGuard(const LevelGuard&) = delete;
  LevelGuard& operator=(const LevelGuard&) = delete;

 private:
  int* depth_;
};

std::string Compiler::DescribeToken() const {
  if (tok().kind == Tok::kEnd) return "the end of the expression";
  return Quote(TokenText());
}

absl::Status Compiler::Unexpected(std::string_view expected) const {
  if (tok().kind == Tok::kName) RETURN_IF_ERROR(KeywordError(TokenText(), tok().pos));
  return ErrorAt(tok().pos, Cat("expected ", expected, ", found ", DescribeToken()));
}

absl::Status Compiler::EnterLevel(int32_t pos) {
  if (++depth_ > max_depth_) {
    return ErrorAt(pos, Cat("the expression is nested more than ", max_depth_,
                            " levels deep, the most --max-expression-depth allows "
                            "(parentheses, calls, unary operators and ** exponents each add "
                            "a level)"));
  }
  return absl::OkStatus();
}

int32_t Compiler::AddNode(OpKind op, DType dtype, std::initializer_list<int32_t> args,
                          int32_t input, const ConstantValue& value, bool parameter) {
  Node node;
  node.op = op;
  node.dtype = dtype;
  node.num_args = static_cast<uint8_t>(args.size());
  std::copy(args.begin(), args.end(), node.args.begin());
  node.input = input;
  node.value = value;
  // Parameters are never merged: which of them are equal depends on scalar values, and
  // the IR's shape must not.
  node.parameter = parameter ? 0 : -1;
  const int32_t index = static_cast<int32_t>(nodes_.size());
  if (!parameter) {
    const NodeKey key{op, dtype, node.args, input, value.i, std::bit_cast<uint64_t>(value.f)};
    const auto [it, inserted] = dedup_.try_emplace(key, index);
    if (!inserted) return it->second;
  }
  nodes_.push_back(node);
  return index;
}

absl::StatusOr<int32_t> Compiler::Materialize(const Value& v, DType dtype) {
  if (!v.weak) {
    return v.dtype == dtype ? v.node : AddNode(OpKind::kCast, dtype, {v.node});
  }
  if (dtype == DType::kInt32 && v.dtype != DType::kBool &&
      (v.constant.i < std::numeric_limits<int32_t>::min() ||
       v.constant.i > std::numeric_limits<int32_t>::max())) {
    return ErrorAt(v.pos, Cat("the integer ", v.constant.i,
                              " does not fit in int32, the dtype of the array it is "
                              "combined with (as in NumPy 2)"));
  }
  return AddNode(OpKind::kConstant, dtype, {}, -1, ConvertConstant(v.constant, v.dtype, dtype),
                 v.parameter);
}

// How a Python scalar or an array dtype reads in a message.
std::string_view TypeName(const Value& v) {
  if (!v.weak) return DTypeName(v.dtype);
  return v.dtype == DType::kBool ? "bool" : v.dtype == DType::kInt64 ? "int" : "float";
}

// Whether a one-argument op keeps an integer operand's dtype; the others compute in float64.
bool KeepsIntegers(OpKind op) {
  switch (op) {
    case OpKind::kNeg:
    case OpKind::kAbs:
    case OpKind::kSign:
    case OpKind::kSquare:
    case OpKind::kReciprocal:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<Value> Compiler::Unary(OpKind op, const Value& a, int32_t pos,
                                      std::string_view what) {
  DType dtype = a.dtype;  // the operand's dtype, in which the op computes
  if (op == OpKind::kLogicalNot) {
    dtype = DType::kBool;
  } else if (op == OpKind::kInvert) {
    if (IsFloat(a.dtype)) {
      return ErrorAt(pos, Cat("ufunc 'invert' not supported for the input type (", TypeName(a),
                              "); ", what, " takes integers or bools"));
    }
  } else if (!IsFloatTest(op)) {
    if (a.dtype == DType::kBool) {
      if (op == OpKind::kNeg) {
        return ErrorAt(pos,
                       "unary '-' cannot be applied to a bool; use where(b, -1, 0) or a "
                       "comparison instead");
      }
      return ErrorAt(pos, Cat(what,
                              " cannot take a bool argument; convert it with "
                              "where(b, 1.0, 0.0) first"));
    }
    if (!KeepsIntegers(op) && !IsFloat(a.dtype)) dtype = DType::kFloat64;
  }
  const DType result = IsFloatTest(op) ? DType::kBool : dtype;
  if (a.weak) {
    Value r = a;
    r.constant = FoldUnary(op, dtype, ConvertConstant(a.constant, a.dtype, dtype));
    r.dtype = result;
    return r;
  }
  ASSIGN_OR_RETURN(int32_t arg, Materialize(a, dtype));
  ++ops_;
  return Strong(AddNode(op, result, {arg}), a.pos);
}

absl::StatusOr<Value> Compiler::Binary(OpKind op, const Value& a, const Value& b, int32_t pos,
                                       std::string_view what) {
  const Promoted promoted = Promote(a, b);
  DType dtype = promoted.dtype;
  const bool both_bool = a.dtype == DType::kBool && b.dtype == DType::kBool;
  switch (op) {
    case OpKind::kAdd:
    case OpKind::kSub:
    case OpKind::kMul:
    case OpKind::kDiv:
    case OpKind::kPow:
    case OpKind::kAtan2:
    case OpKind::kFloorDiv:
    case OpKind::kMod:
    case OpKind::kFmod:
    case OpKind::kHypot:
    case OpKind::kCopysign:
    case OpKind::kLeftShift:
    case OpKind::kRightShift:
      if (both_bool) {
        return ErrorAt(pos, Cat(what,
                                " cannot combine two bool operands; convert one "
                                "to a number first, e.g. where(b, 1, 0)"));
      }
      if ((op == OpKind::kDiv || op == OpKind::kAtan2 || op == OpKind::kHypot ||
           op == OpKind::kCopysign) &&
          !IsFloat(dtype)) {
        dtype = DType::kFloat64;
      }
      break;
    case OpKind::kLogicalAnd:
    case OpKind::kLogicalOr:
    case OpKind::kLogicalXor:
      dtype = DType::kBool;  // any operand, as its truth value (x != 0)
      break;
    default:  // min, max, fmin, fmax, bitwise and comparisons are defined for every dtype
      break;
  }
  if (IsFloat(dtype) && op >= OpKind::kBitAnd && op <= OpKind::kRightShift) {
    return ErrorAt(
        pos, Cat("ufunc ", Quote(OpName(op)), " not supported for the input types (", TypeName(a),
                 ", ", TypeName(b), "); ", what, " takes integers or bools"));
  }
  const DType result = IsComparison(op) ? DType::kBool : dtype;
  if (promoted.weak) {
    Value r;
    r.weak = true;
    r.parameter = a.parameter || b.parameter;
    r.dtype = result;
    r.constant = FoldBinary(op, dtype, ConvertConstant(a.constant, a.dtype, dtype),
                            ConvertConstant(b.constant, b.dtype, dtype));
    r.pos = a.pos;
    return r;
  }
  ASSIGN_OR_RETURN(int32_t x, Materialize(a, dtype));
  if (op == OpKind::kPow && b.weak && !b.parameter &&
      (b.dtype == DType::kFloat64 ? b.constant.f == 2.0 : b.constant.i == 2)) {
    // x**2 as x*x, like NumPy's fast path for a scalar exponent: exact where pow() may be
    // off by a rounding, and much faster.
    ++ops_;
    return Strong(AddNode(OpKind::kMul, result, {x, x}), a.pos);
  }
  ASSIGN_OR_RETURN(int32_t y, Materialize(b, dtype));
  ++ops_;
  return Strong(AddNode(op, result, {x, y}), a.pos);
}

absl::StatusOr<Value> Compiler::Where(const Value& c, const Value& a, const Value& b, int32_t pos) {
  Value cond = c;
  if (c.dtype != DType::kBool) {
    Value zero;
    zero.weak = true;
    zero.dtype = DType::kInt64;
    zero.pos = c.pos;
    ASSIGN_OR_RETURN(Value ne, Binary(OpKind::kNotEqual, c, zero, pos, "where"));
    cond = ne;
  }
  const Promoted promoted = Promote(a, b);
  // A condition fixed by the text picks its branch now. One derived from a scalar input
  // stays a runtime choice when a branch is an array, so that the IR's shape (and
  // canonical()) does not depend on scalar values.
  if (cond.weak && (!cond.parameter || promoted.weak)) {
    const Value& chosen = cond.constant.i != 0 ? a : b;
    if (promoted.weak) {
      Value r = chosen;
      r.constant = ConvertConstant(chosen.constant, chosen.dtype, promoted.dtype);
      r.dtype = promoted.dtype;
      r.parameter = cond.parameter || a.parameter || b.parameter;
      return r;
    }
    ASSIGN_OR_RETURN(int32_t node, Materialize(chosen, promoted.dtype));
    return Strong(node, chosen.pos);
  }
  ASSIGN_OR_RETURN(int32_t nc, Materialize(cond, DType::kBool));
  ASSIGN_OR_RETURN(int32_t na, Materialize(a, promoted.dtype));
  ASSIGN_OR_RETURN(int32_t nb, Materialize(b, promoted.dtype));
  ++ops_;
  return Strong(AddNode(OpKind::kWhere, promoted.dtype, {nc, na, nb}), c.pos);
}

OpKind ComparisonOp(Tok t) {
  switch (t) {
    case Tok::kLess:
      return OpKind::kLess;
    case Tok::kLessEqual:
      return OpKind::kLessEqual;
    case Tok::kGreater:
      return OpKind::kGreater;
    case Tok::kGreaterEqual:
      return OpKind::kGreaterEqual;
    case Tok::kEqualEqual:
      return OpKind::kEqual;
    default:
      return OpKind::kNotEqual;
  }
}

bool IsComparisonToken(Tok t) { return t >= Tok::kLess && t <= Tok::kNotEqual; }

// Comparisons do not chain: Python's a < b < c means (a < b) and (b < c), and silently
// computing (a < b) < c instead would be a trap.
absl::StatusOr<Value> Compiler::ParseComparison() {
  absl::StatusOr<Value> left = ParseBinary(1);
  if (!left.ok() || !IsComparisonToken(tok().kind)) return left;
  const OpKind op = ComparisonOp(tok().kind);
  const int32_t pos = tok().pos;
  const std::string what = Cat("operator ", Quote(TokenText()));
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> right = ParseBinary(1);
  if (!right.ok()) return right;
  if (IsComparisonToken(tok().kind)) {
    return ErrorAt(tok().pos,
                   "comparisons cannot be chained (a < b < c); add parentheses, e.g. "
                   "(a < b) == (b < c)");
  }
  return Binary(op, *left, *right, pos, what);
}

// Precedence climbing: the operators of kBinaryOperators that bind at least as tightly as
// `min_precedence`, left-associative. Recursion adds one frame per precedence level at
// most, and none per operand of a chain.
absl::StatusOr<Value> Compiler::ParseBinary(int min_precedence) {
  absl::StatusOr<Value> left = ParseUnary();
  for (;;) {
    if (!left.ok()) return left;
    const BinaryOperator* o = FindBinaryOperator(tok().kind);
    if (o == nullptr || o->precedence < min_precedence) return left;
    const int32_t pos = tok().pos;
    RETURN_IF_ERROR(Advance());
    absl::StatusOr<Value> right = ParseBinary(o->precedence + 1);
    if (!right.ok()) return right;
    left = Binary(o->op, *left, *right, pos, o->what);
  }
}

absl::StatusOr<Value> Compiler::ParseUnary() {
  const Tok kind = tok().kind;
  if (kind != Tok::kMinus && kind != Tok::kPlus && kind != Tok::kTilde) return ParsePower();
  const int32_t pos = tok().pos;
  RETURN_IF_ERROR(EnterLevel(pos));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> operand = ParseUnary();
  if (!operand.ok() || kind == Tok::kPlus) return operand;
  absl::StatusOr<Value> r = kind == Tok::kMinus
                                ? Unary(OpKind::kNeg, *operand, pos, "unary '-'")
                                : Unary(OpKind::kInvert, *operand, pos, "operator '~'");
  if (r.ok()) r->pos = pos;
  return r;
}

absl::StatusOr<Value> Compiler::ParsePower() {
  absl::StatusOr<Value> base = ParsePrimary();
  if (!base.ok() || tok().kind != Tok::kStarStar) return base;
  const int32_t pos = tok().pos;
  RETURN_IF_ERROR(EnterLevel(pos));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> exponent = ParseUnary();  // right-assoc, and allows 2**-1
  if (!exponent.ok()) return exponent;
  return Binary(OpKind::kPow, *base, *exponent, pos, "operator '**'");
}

absl::StatusOr<Value> Compiler::ParsePrimary() {
  switch (tok().kind) {
    case Tok::kNumber:
      return ParseNumber();
    case Tok::kName:
      return ParseName();
    case Tok::kLParen: {
      const int32_t open = tok().pos;
      RETURN_IF_ERROR(EnterLevel(open));
      LevelGuard guard(&depth_);
      RETURN_IF_ERROR(Advance());
      absl::StatusOr<Value> inner = ParseComparison();
      if (!inner.ok()) return inner;
      if (tok().kind != Tok::kRParen) {
        return Unexpected(Cat("')' to close '(' at position ", open));
      }
      RETURN_IF_ERROR(Advance());
      inner->pos = open;
      return inner;
    }
    default:
      return Unexpected("a number, a name or '('");
  }
}

absl::StatusOr<Value> Compiler::ParseNumber() {
  Value v;
  v.weak = true;
  v.dtype = lexer_.number_is_float() ? DType::kFloat64 : DType::kInt64;
  v.constant = lexer_.number();
  v.pos = tok().pos;
  RETURN_IF_ERROR(Advance());
  return v;
}

absl::StatusOr<Value> Compiler::ParseName() {
  const std::string_view name = TokenText();
  const int32_t pos = tok().pos;
  RETURN_IF_ERROR(Advance());
  if (tok().kind == Tok::kLParen) {
    const FunctionInfo* f = FindFunction(name);
    if (f == nullptr) return ErrorAt(pos, Cat("unknown function ", Quote(name)));
    return ParseCall(*f, pos);
  }
  if (name == "True" || name == "False") {
    Value v;
    v.weak = true;
    v.dtype = DType::kBool;
    v.constant.i = name == "True";
    v.pos = pos;
    return v;
  }
  const auto it = std::lower_bound(names_.begin(), names_.end(), name,
                                   [](const std::string& a, std::string_view b) { return a < b; });
  if (it == names_.end() || *it != name) {
    RETURN_IF_ERROR(KeywordError(name, pos));
    if (FindFunction(name) != nullptr) {
      return ErrorAt(
          pos, Cat("function ", Quote(name), " must be called with its arguments in parentheses"));
    }
    return ErrorAt(pos, Cat(Quote(name), " is not bound to an input"));
  }
  const auto k = static_cast<int32_t>(it - names_.begin());
  used_[k] = true;
  if (const auto* array = std::get_if<ArrayInput>(&types_[k])) {
    return Strong(AddNode(OpKind::kInput, array->dtype, {}, k), pos);
  }
  const auto& scalar = std::get<ScalarInput>(types_[k]);
  Value v;
  v.weak = true;
  v.parameter = true;
  v.pos = pos;
  if (scalar.dtype == DType::kBool) {
    v.dtype = DType::kBool;
    v.constant.i = scalar.i != 0;
  } else if (IsInteger(scalar.dtype)) {
    v.dtype = DType::kInt64;
    v.constant.i = scalar.i;
  } else {
    v.dtype = DType::kFloat64;
    v.constant.f = scalar.f;
  }
  return v;
}

absl::StatusOr<Value> Compiler::ParseCall(const FunctionInfo& f, int32_t name_pos) {
  const int32_t open = tok().pos;
  RETURN_IF_ERROR(EnterLevel(open));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  std::vector<Value> args;
  if (tok().kind == Tok::kRParen) {
    RETURN_IF_ERROR(Advance());
  } else {
    for (;;) {
      absl::StatusOr<Value> arg = ParseComparison();
      if (!arg.ok()) return arg;
      args.push_back(*arg);
      const Tok t = tok().kind;
      if (t != Tok::kComma && t != Tok::kRParen) {
        return Unexpected(Cat("',' or ')' to close '(' at position ", open));
      }
      RETURN_IF_ERROR(Advance());
      if (t == Tok::kRParen) break;
    }
  }
  const std::string what = Cat("function ", Quote(f.name));
  const auto count = static_cast<int>(args.size());
  if (count < f.min_args || count > f.max_args) {
    const std::string takes =
        f.min_args == f.max_args ? Cat(f.min_args) : Cat(f.min_args, " or ", f.max_args);
    return ErrorAt(name_pos, Cat(what, " takes ", takes,
                                 f.max_args == 1 ? " argument" : " arguments", ", got ", count));
  }
  absl::StatusOr<Value> r;
  switch (f.form) {
    case Form::kWhere:
      r = Where(args[0], args[1], args[2], name_pos);
      break;
    case Form::kClip: {
      // NumPy 2's clip: minimum(maximum(x, lo), hi), so a NaN anywhere propagates.
      absl::StatusOr<Value> low = Binary(OpKind::kMax, args[0], args[1], name_pos, what);
      if (!low.ok()) return low;
      r = Binary(OpKind::kMin, *low, args[2], name_pos, what);
      break;
    }
    case Form::kRound:
      if (count == 2) {
        r = Round(args[0], args[1], name_pos);
      } else if (IsInteger(args[0].dtype)) {
        r = args[0];  // NumPy's round of an integer is the integer
      } else {
        r = Unary(OpKind::kRint, args[0], name_pos, what);
      }
      break;
    case Form::kPositive:
      // A bool gets the error of every numeric function.
      if (args[0].dtype == DType::kBool) return Unary(OpKind::kAbs, args[0], name_pos, what);
      r = args[0];
      break;
    case Form::kCast:
      r = Cast(args[0], f.cast, name_pos);
      break;
    case Form::kIndex:
      // The axis is part of the program (its canonical text), as NumPy's axis arguments
      // are Python ints; a scalar input's value is not.
      if (!args[0].weak || args[0].dtype != DType::kInt64 || args[0].parameter) {
        return ErrorAt(args[0].pos, "the axis of index() must be an integer literal");
      }
      r = Strong(AddNode(OpKind::kIndex, DType::kInt64, {}, -1,
                         {.i = args[0].constant.i, .f = 0}),
                 name_pos);
      break;
    case Form::kOp:
      r = count == 2 ? Binary(f.op, args[0], args[1], name_pos, what)
                     : Unary(f.op, args[0], name_pos, what);
      break;
  }
  if (r.ok()) r->pos = name_pos;
  return r;
}

// numpy.round(x, decimals) as NumPy computes it: rint(x * 10**d) / 10**d, or for d < 0
// rint(x / 10**-d) * 10**-d, in x's float dtype with 10**d rounded to it. An integer x
// is itself for d >= 0; for d < 0 it goes through float64 and back, as in NumPy. A
// decimals from a scalar input gives both forms and a where() on its sign, so that the
// IR does not depend on its value.
absl::StatusOr<Value> Compiler::Round(const Value& x, const Value& decimals, int32_t pos) {
  if (!decimals.weak || decimals.dtype != DType::kInt64) {
    return ErrorAt(decimals.pos,
                   "the decimals of round() must be an integer literal or an integer scalar "
                   "input");
  }
  if (x.dtype == DType::kBool) return Unary(OpKind::kRint, x, pos, "function 'round'");
  const int64_t d = decimals.constant.i;
  const uint64_t magnitude = d < 0 ? uint64_t{0} - static_cast<uint64_t>(d) : d;
  Value scale;
  scale.weak = true;
  scale.parameter = decimals.parameter;
  scale.dtype = DType::kFloat64;
  scale.constant.f = PowerOfTen(magnitude);
  scale.pos = decimals.pos;
  const bool integer = IsInteger(x.dtype);
  auto rounded = [&](bool non_negative) -> absl::StatusOr<Value> {
    if (integer && non_negative) return x;
    Value v = x;
    if (integer) v = CastWeakOrStrong(x, DType::kFloat64);
    const OpKind first = non_negative ? OpKind::kMul : OpKind::kDiv;
    const OpKind second = non_negative ? OpKind::kDiv : OpKind::kMul;
    ASSIGN_OR_RETURN(Value y, Binary(first, v, scale, pos, "function 'round'"));
    ASSIGN_OR_RETURN(y, Unary(OpKind::kRint, y, pos, "function 'round'"));
    ASSIGN_OR_RETURN(y, Binary(second, y, scale, pos, "function 'round'"));
    return integer ? CastWeakOrStrong(y, x.dtype) : y;
  };
  if (!decimals.parameter) return rounded(d >= 0);
  ASSIGN_OR_RETURN(Value up, rounded(true));
  ASSIGN_OR_RETURN(Value down, rounded(false));
  Value non_negative = decimals;
  non_negative.dtype = DType::kBool;
  non_negative.constant.i = d >= 0;
  return Where(non_negative, up, down, pos);
}

Value Compiler::CastWeakOrStrong(const Value& v, DType dtype) {
  if (v.dtype == dtype) return v;
  Value r = v;
  r.dtype = dtype;
  if (v.weak) {
    r.constant = ConvertConstant(v.constant, v.dtype, dtype);
  } else {
    r.node = AddNode(OpKind::kCast, dtype, {v.node});
  }
  return r;
}

// bool(x), int32(x), ...: NumPy's astype, where float to integer follows ops::Convert.
// The result is a typed value, like np.float32(2.5): a Python scalar becomes a constant
// of that dtype, no longer weak.
absl::StatusOr<Value> Compiler::Cast(const Value& x, DType dtype, int32_t pos) {
  if (x.weak && dtype == DType::kInt32 && x.dtype == DType::kInt64 &&
      (x.constant.i < std::numeric_limits<int32_t>::min() ||
       x.constant.i > std::numeric_limits<int32_t>::max())) {
    return ErrorAt(pos, Cat("the integer ", x.constant.i, " does not fit in int32"));
  }
  ASSIGN_OR_RETURN(int32_t node, Materialize(x, dtype));
  return Strong(node, pos);
}

// Keeps the nodes reachable from `root` (folding leaves some behind) and numbers the
// parameters.
Ir Compiler::Finish(int32_t root) const {
  std::vector<char> live(nodes_.size(), 0);
  live[root] = 1;
  for (int32_t i = root; i >= 0; --i) {
    if (!live[i]) continue;
    for (int a = 0; a < nodes_[i].num_args; ++a) live[nodes_[i].args[a]] = 1;
  }
  std::vector<int32_t> renumber(nodes_.size(), -1);
  Ir ir;
  int32_t parameters = 0;
  for (int32_t i = 0; i <= root; ++i) {
    if (!live[i]) continue;
    Node node = nodes_[i];
    for (int a = 0; a < node.num_args; ++a) node.args[a] = renumber[node.args[a]];
    if (node.parameter >= 0) node.parameter = parameters++;
    renumber[i] = static_cast<int32_t>(ir.nodes.size());
    ir.nodes.push_back(node);
  }
  ir.root = renumber[root];
  return ir;
}

// Renders the tree with an explicit stack: a left-leaning chain like x+x+...+x can be
// tens of thousands of nodes deep.
std::string Compiler::Render(const Ir& ir) {
  std::string out;
  struct Frame {
    int32_t node;
    int next_arg;  // -1 until the head is written
  };
  std::vector<Frame> stack = {{ir.root, -1}};
  while (!stack.empty()) {
    Frame& frame = stack.back();
    const Node& node = ir.nodes[frame.node];
    const std::string_view dtype = DTypeName(node.dtype);
    if (frame.next_arg < 0) {
      if (node.op == OpKind::kInput) {
        Append(out, "in", node.input, "<", dtype, ">");
        stack.pop_back();
        continue;
      }
      if (node.op == OpKind::kIndex) {
        Append(out, "index<", dtype, ">(", node.value.i, ")");
        stack.pop_back();
        continue;
      }
      if (node.op == OpKind::kConstant) {
        if (node.parameter >= 0) {
          Append(out, "param", node.parameter, "<", dtype, ">");
        } else {
          Append(out, FormatConstant(node.dtype, node.value), "<", dtype, ">");
        }
        stack.pop_back();
        continue;
      }
      Append(out, OpName(node.op), "<", dtype, ">(");
      frame.next_arg = 0;
    }
    if (frame.next_arg < node.num_args) {
      if (frame.next_arg > 0) out += ", ";
      const int32_t child = node.args[frame.next_arg++];
      stack.push_back({child, -1});  // invalidates `frame`
    } else {
      out += ')';
      stack.pop_back();
    }
  }
  return out;
}

absl::StatusOr<Compiled> Compiler::Run() {
  if (text_.size() > kMaxExpressionLength) {
    return ErrorAt(kMaxExpressionLength, Cat("the expression is ", text_.size(),
                                             " bytes long; the limit is ", kMaxExpressionLength));
  }
  for (const auto& [name, type] : inputs_) {
    if (!IsIdentifier(name) || name == "True" || name == "False") {
      return absl::InvalidArgumentError(
          Cat("input name ", Quote(name),
              " is not a valid identifier ([A-Za-z_][A-Za-z0-9_]*, not True or False)"));
    }
    names_.push_back(name);
    types_.push_back(type);
  }
  used_.assign(names_.size(), false);

  RETURN_IF_ERROR(Advance());
  if (tok().kind == Tok::kEnd) return ErrorAt(tok().pos, "the expression is empty");
  ASSIGN_OR_RETURN(Value value, ParseComparison());
  if (tok().kind == Tok::kRParen) return ErrorAt(tok().pos, "')' has no matching '('");
  if (tok().kind != Tok::kEnd) {
    if (tok().kind == Tok::kName) RETURN_IF_ERROR(KeywordError(TokenText(), tok().pos));
    return ErrorAt(tok().pos, Cat("unexpected ", DescribeToken(), " after a complete expression"));
  }
  for (size_t k = 0; k < names_.size(); ++k) {
    if (!used_[k]) {
      return absl::InvalidArgumentError(
          Cat("input ", Quote(names_[k]), " is bound but not used by the expression"));
    }
  }
  // A result that is still a Python-like scalar takes its default dtype, which is
  // already value.dtype (bool, int64 or float64).
  ASSIGN_OR_RETURN(int32_t root, Materialize(value, value.dtype));

  Compiled compiled;
  compiled.ir = Finish(root);
  compiled.inputs = std::move(names_);
  compiled.input_types = std::move(types_);
  compiled.ops_per_element = ops_;
  compiled.canonical = Render(compiled.ir);
  return compiled;
}

}  // namespace

Program IndexAsInputs(const Program& program) {
  auto state = std::make_shared<Program::State>(*program.state_);
  for (Node& node : state->ir.nodes) {
    if (node.op != OpKind::kIndex) continue;
    const auto k = static_cast<int32_t>(state->inputs.size());
    state->inputs.push_back(Cat("~index", k - static_cast<int32_t>(program.inputs().size())));
    state->input_types.push_back(ArrayInput{DType::kInt64});
    node.op = OpKind::kInput;
    node.input = k;
    node.value = {};
  }
  state->canonical = Compiler::Render(state->ir);
  return Program(std::move(state));
}

absl::StatusOr<Program> Compile(std::string_view text, const InputMap& inputs, int max_depth) {
  ASSIGN_OR_RETURN(Compiled compiled, Compiler(text, inputs, max_depth).Run());
  auto state = std::make_shared<Program::State>();
  state->ir = std::move(compiled.ir);
  state->inputs = std::move(compiled.inputs);
  state->input_types = std::move(compiled.input_types);
  state->ops_per_element = compiled.ops_per_element;
  state->canonical = std::move(compiled.canonical);
  return Program(std::move(state));
}

}  // namespace gpucompute::expr

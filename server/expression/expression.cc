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

using internal::ConvertConstant;
using internal::FoldBinary;
using internal::FoldUnary;
using internal::FormatConstant;
using internal::Promote;
using internal::Promoted;
using internal::Value;

namespace {

// String building for the compiler's messages, over std::string_view: the compiler is
// plain C++ (common/string_view.h says why), and Abseil meets it only in the Status.
inline void AppendOne(std::string& out, std::string_view s) { out.append(s); }
inline void AppendOne(std::string& out, const char* s) { out.append(s); }
inline void AppendOne(std::string& out, const std::string& s) { out.append(s); }
template <typename T>
requires std::is_integral_v<T>
void AppendOne(std::string& out, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

template <typename... Args>
void Append(std::string& out, const Args&... args) {
  (AppendOne(out, args), ...);
}

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  Append(out, args...);
  return out;
}

absl::Status InvalidArgument(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// ---------------------------------------------------------------------------------------
// Tokens

enum class Tok : uint8_t {
  kEnd,
  kNumber,
  kName,
  kPlus,
  kMinus,
  kStar,
  kSlash,
  kStarStar,
  kLParen,
  kRParen,
  kComma,
  kLess,
  kLessEqual,
  kGreater,
  kGreaterEqual,
  kEqualEqual,
  kNotEqual,
};

struct Token {
  Tok kind = Tok::kEnd;
  int32_t pos = 0;
  int32_t len = 0;
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !IsNameStart(s[0])) return false;
  return std::all_of(s.begin(), s.end(), IsNameChar);
}

// Text from the network may be long or binary; messages quote at most this much of it.
std::string Quote(std::string_view s) {
  constexpr size_t kMaxQuoted = 40;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxQuoted; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > kMaxQuoted) out += "...";
  out += "'";
  return out;
}

struct FunctionInfo {
  std::string_view name;
  OpKind op;
  int arity;
};

constexpr FunctionInfo kFunctions[] = {
    {"sin", OpKind::kSin, 1},     {"cos", OpKind::kCos, 1},   {"tan", OpKind::kTan, 1},
    {"exp", OpKind::kExp, 1},     {"log", OpKind::kLog, 1},   {"log1p", OpKind::kLog1p, 1},
    {"expm1", OpKind::kExpm1, 1}, {"sqrt", OpKind::kSqrt, 1}, {"abs", OpKind::kAbs, 1},
    {"tanh", OpKind::kTanh, 1},   {"sinh", OpKind::kSinh, 1}, {"cosh", OpKind::kCosh, 1},
    {"asin", OpKind::kAsin, 1},   {"acos", OpKind::kAcos, 1}, {"atan", OpKind::kAtan, 1},
    {"floor", OpKind::kFloor, 1}, {"ceil", OpKind::kCeil, 1}, {"atan2", OpKind::kAtan2, 2},
    {"pow", OpKind::kPow, 2},     {"min", OpKind::kMin, 2},   {"max", OpKind::kMax, 2},
    {"where", OpKind::kWhere, 3},
};

const FunctionInfo* FindFunction(std::string_view name) {
  for (const FunctionInfo& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
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
      : text_(text), inputs_(inputs), max_depth_(std::min(max_depth, kMaxNestingDepth)) {}

  absl::StatusOr<Compiled> Run();

 private:
  // Errors are built out of line, so the recursive functions keep small stack frames.
  [[gnu::noinline, gnu::cold]] static absl::Status ErrorAt(size_t pos, std::string_view message) {
    return InvalidArgument(Cat("at position ", pos, ": ", message));
  }
  [[gnu::noinline, gnu::cold]] absl::Status Unexpected(std::string_view expected) const;
  [[gnu::noinline, gnu::cold]] absl::Status LexError(size_t pos) const;
  std::string_view TokenText() const { return text_.substr(tok_.pos, tok_.len); }
  std::string DescribeToken() const;

  absl::Status Advance();
  absl::Status LexNumber(size_t pos);
  absl::Status EnterLevel(int32_t pos);

  absl::StatusOr<Value> ParseComparison();
  absl::StatusOr<Value> ParseSum();
  absl::StatusOr<Value> ParseTerm();
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
  static std::string Render(const Ir& ir);

  std::string_view text_;
  const InputMap& inputs_;
  const int max_depth_;
  std::vector<std::string> names_;  // inputs_'s keys, in order
  std::vector<InputType> types_;
  std::vector<bool> used_;

  Token tok_;
  size_t next_pos_ = 0;  // where the token after tok_ starts looking
  ConstantValue number_;
  bool number_is_float_ = false;
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
  if (tok_.kind == Tok::kEnd) return "the end of the expression";
  return Quote(TokenText());
}

absl::Status Compiler::Unexpected(std::string_view expected) const {
  return ErrorAt(tok_.pos, Cat("expected ", expected, ", found ", DescribeToken()));
}

absl::Status Compiler::LexError(size_t pos) const {
  const char c = text_[pos];
  const char next = pos + 1 < text_.size() ? text_[pos + 1] : '\0';
  if (c == '=') return ErrorAt(pos, "'=' is not an operator; use '==' to compare");
  if (c == '!') return ErrorAt(pos, "unexpected character '!'; use '!=' for 'not equal'");
  if (c == '^') return ErrorAt(pos, "unexpected character '^'; use '**' for powers");
  if (c == '/' && next == '/') return ErrorAt(pos, "'//' (floor division) is not supported");
  if (c == '%') return ErrorAt(pos, "'%' (remainder) is not supported");
  if (c == '&' || c == '|' || c == '~') {
    return ErrorAt(pos, Cat("unexpected character ", Quote(text_.substr(pos, 1)),
                            "; logical and bitwise operators are not supported "
                            "(use comparisons and where())"));
  }
  return ErrorAt(pos, Cat("unexpected character ", Quote(text_.substr(pos, 1))));
}

absl::Status Compiler::Advance() {
  size_t p = next_pos_;
  while (p < text_.size() && IsSpace(text_[p])) ++p;
  tok_.pos = static_cast<int32_t>(p);
  tok_.len = 1;
  if (p == text_.size()) {
    tok_.kind = Tok::kEnd;
    tok_.len = 0;
    next_pos_ = p;
    return absl::OkStatus();
  }
  const char c = text_[p];
  const char next = p + 1 < text_.size() ? text_[p + 1] : '\0';
  if (IsDigit(c) || (c == '.' && IsDigit(next))) return LexNumber(p);
  if (IsNameStart(c)) {
    size_t q = p + 1;
    while (q < text_.size() && IsNameChar(text_[q])) ++q;
    tok_.kind = Tok::kName;
    tok_.len = static_cast<int32_t>(q - p);
    next_pos_ = q;
    return absl::OkStatus();
  }
  switch (c) {
    case '+':
      tok_.kind = Tok::kPlus;
      break;
    case '-':
      tok_.kind = Tok::kMinus;
      break;
    case '*':
      tok_.kind = next == '*' ? Tok::kStarStar : Tok::kStar;
      tok_.len = next == '*' ? 2 : 1;
      break;
    case '/':
      if (next == '/') return LexError(p);
      tok_.kind = Tok::kSlash;
      break;
    case '(':
      tok_.kind = Tok::kLParen;
      break;
    case ')':
      tok_.kind = Tok::kRParen;
      break;
    case ',':
      tok_.kind = Tok::kComma;
      break;
    case '<':
      tok_.kind = next == '=' ? Tok::kLessEqual : Tok::kLess;
      tok_.len = next == '=' ? 2 : 1;
      break;
    case '>':
      tok_.kind = next == '=' ? Tok::kGreaterEqual : Tok::kGreater;
      tok_.len = next == '=' ? 2 : 1;
      break;
    case '=':
      if (next != '=') return LexError(p);
      tok_.kind = Tok::kEqualEqual;
      tok_.len = 2;
      break;
    case '!':
      if (next != '=') return LexError(p);
      tok_.kind = Tok::kNotEqual;
      tok_.len = 2;
      break;
    default:
      return LexError(p);
  }
  next_pos_ = p + tok_.len;
  return absl::OkStatus();
}

// digits ['.' digits] [('e' | 'E') ['+' | '-'] digits], or '.' digits [exponent].
absl::Status Compiler::LexNumber(size_t pos) {
  size_t q = pos;
  bool is_float = false;
  while (q < text_.size() && IsDigit(text_[q])) ++q;
  if (q < text_.size() && text_[q] == '.') {
    is_float = true;
    ++q;
    while (q < text_.size() && IsDigit(text_[q])) ++q;
  }
  int64_t exponent = 0;
  size_t mantissa_end = q;
  if (q < text_.size() && (text_[q] == 'e' || text_[q] == 'E')) {
    is_float = true;
    size_t e = q + 1;
    bool negative = false;
    if (e < text_.size() && (text_[e] == '+' || text_[e] == '-')) negative = text_[e++] == '-';
    if (e >= text_.size() || !IsDigit(text_[e])) {
      return ErrorAt(pos, Cat("malformed number ", Quote(text_.substr(pos, e - pos)),
                              ": the exponent has no digits"));
    }
    q = e;
    while (q < text_.size() && IsDigit(text_[q])) {
      exponent = std::min<int64_t>(exponent * 10 + (text_[q] - '0'), 1 << 20);
      ++q;
    }
    if (negative) exponent = -exponent;
  }
  if (q < text_.size() && (IsNameChar(text_[q]) || text_[q] == '.')) {
    size_t end = q;
    while (end < text_.size() && (IsNameChar(text_[end]) || text_[end] == '.')) ++end;
    return ErrorAt(pos, Cat("invalid number literal ", Quote(text_.substr(pos, end - pos))));
  }
  const char* first = text_.data() + pos;
  const char* last = text_.data() + q;
  number_is_float_ = is_float;
  number_ = {};
  if (is_float) {
    const auto r = std::from_chars(first, last, number_.f);
    if (r.ec == std::errc::result_out_of_range) {
      // Python reads such literals as inf or 0.0. from_chars does not say which, so
      // estimate the decimal magnitude: digits before the point (or minus the zeros right
      // after it) plus the exponent.
      int64_t magnitude = 0;
      size_t i = pos;
      while (i < mantissa_end && (text_[i] == '0')) ++i;
      if (i < mantissa_end && IsDigit(text_[i])) {
        while (i < mantissa_end && IsDigit(text_[i])) ++i, ++magnitude;
      } else if (i < mantissa_end && text_[i] == '.') {
        ++i;
        while (i < mantissa_end && text_[i] == '0') ++i, --magnitude;
      }
      number_.f = magnitude + exponent > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    } else if (r.ec != std::errc() || r.ptr != last) {
      return ErrorAt(pos, Cat("invalid number literal ", Quote(text_.substr(pos, q - pos))));
    }
  } else {
    const auto r = std::from_chars(first, last, number_.i);
    if (r.ec == std::errc::result_out_of_range) {
      return ErrorAt(pos, Cat("integer literal ", Quote(text_.substr(pos, q - pos)),
                              " does not fit in int64"));
    }
    if (r.ec != std::errc() || r.ptr != last) {
      return ErrorAt(pos, Cat("invalid number literal ", Quote(text_.substr(pos, q - pos))));
    }
  }
  tok_.kind = Tok::kNumber;
  tok_.len = static_cast<int32_t>(q - pos);
  next_pos_ = q;
  return absl::OkStatus();
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

absl::StatusOr<Value> Compiler::Unary(OpKind op, const Value& a, int32_t pos,
                                      std::string_view what) {
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
  const DType dtype =
      (op == OpKind::kNeg || op == OpKind::kAbs || IsFloat(a.dtype)) ? a.dtype : DType::kFloat64;
  if (a.weak) {
    Value r = a;
    r.constant = FoldUnary(op, dtype, ConvertConstant(a.constant, a.dtype, dtype));
    r.dtype = dtype;
    return r;
  }
  ASSIGN_OR_RETURN(int32_t arg, Materialize(a, dtype));
  ++ops_;
  return Strong(AddNode(op, dtype, {arg}), a.pos);
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
      if (both_bool) {
        return ErrorAt(pos, Cat(what,
                                " cannot combine two bool operands; convert one "
                                "to a number first, e.g. where(b, 1, 0)"));
      }
      if ((op == OpKind::kDiv || op == OpKind::kAtan2) && !IsFloat(dtype)) dtype = DType::kFloat64;
      break;
    default:  // min, max and comparisons are defined for every dtype
      break;
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
  absl::StatusOr<Value> left = ParseSum();
  if (!left.ok() || !IsComparisonToken(tok_.kind)) return left;
  const OpKind op = ComparisonOp(tok_.kind);
  const int32_t pos = tok_.pos;
  const std::string what = Cat("operator ", Quote(TokenText()));
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> right = ParseSum();
  if (!right.ok()) return right;
  if (IsComparisonToken(tok_.kind)) {
    return ErrorAt(tok_.pos,
                   "comparisons cannot be chained (a < b < c); add parentheses, e.g. "
                   "(a < b) == (b < c)");
  }
  return Binary(op, *left, *right, pos, what);
}

absl::StatusOr<Value> Compiler::ParseSum() {
  absl::StatusOr<Value> left = ParseTerm();
  while (left.ok() && (tok_.kind == Tok::kPlus || tok_.kind == Tok::kMinus)) {
    const bool plus = tok_.kind == Tok::kPlus;
    const int32_t pos = tok_.pos;
    RETURN_IF_ERROR(Advance());
    absl::StatusOr<Value> right = ParseTerm();
    if (!right.ok()) return right;
    left = Binary(plus ? OpKind::kAdd : OpKind::kSub, *left, *right, pos,
                  plus ? "operator '+'" : "operator '-'");
  }
  return left;
}

absl::StatusOr<Value> Compiler::ParseTerm() {
  absl::StatusOr<Value> left = ParseUnary();
  while (left.ok() && (tok_.kind == Tok::kStar || tok_.kind == Tok::kSlash)) {
    const bool mul = tok_.kind == Tok::kStar;
    const int32_t pos = tok_.pos;
    RETURN_IF_ERROR(Advance());
    absl::StatusOr<Value> right = ParseUnary();
    if (!right.ok()) return right;
    left = Binary(mul ? OpKind::kMul : OpKind::kDiv, *left, *right, pos,
                  mul ? "operator '*'" : "operator '/'");
  }
  return left;
}

absl::StatusOr<Value> Compiler::ParseUnary() {
  if (tok_.kind != Tok::kMinus && tok_.kind != Tok::kPlus) return ParsePower();
  const bool minus = tok_.kind == Tok::kMinus;
  const int32_t pos = tok_.pos;
  RETURN_IF_ERROR(EnterLevel(pos));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> operand = ParseUnary();
  if (!operand.ok() || !minus) return operand;
  absl::StatusOr<Value> r = Unary(OpKind::kNeg, *operand, pos, "unary '-'");
  if (r.ok()) r->pos = pos;
  return r;
}

absl::StatusOr<Value> Compiler::ParsePower() {
  absl::StatusOr<Value> base = ParsePrimary();
  if (!base.ok() || tok_.kind != Tok::kStarStar) return base;
  const int32_t pos = tok_.pos;
  RETURN_IF_ERROR(EnterLevel(pos));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  absl::StatusOr<Value> exponent = ParseUnary();  // right-assoc, and allows 2**-1
  if (!exponent.ok()) return exponent;
  return Binary(OpKind::kPow, *base, *exponent, pos, "operator '**'");
}

absl::StatusOr<Value> Compiler::ParsePrimary() {
  switch (tok_.kind) {
    case Tok::kNumber:
      return ParseNumber();
    case Tok::kName:
      return ParseName();
    case Tok::kLParen: {
      const int32_t open = tok_.pos;
      RETURN_IF_ERROR(EnterLevel(open));
      LevelGuard guard(&depth_);
      RETURN_IF_ERROR(Advance());
      absl::StatusOr<Value> inner = ParseComparison();
      if (!inner.ok()) return inner;
      if (tok_.kind != Tok::kRParen) {
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
  v.dtype = number_is_float_ ? DType::kFloat64 : DType::kInt64;
  v.constant = number_;
  v.pos = tok_.pos;
  RETURN_IF_ERROR(Advance());
  return v;
}

absl::StatusOr<Value> Compiler::ParseName() {
  const std::string_view name = TokenText();
  const int32_t pos = tok_.pos;
  RETURN_IF_ERROR(Advance());
  if (tok_.kind == Tok::kLParen) {
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
  const int32_t open = tok_.pos;
  RETURN_IF_ERROR(EnterLevel(open));
  LevelGuard guard(&depth_);
  RETURN_IF_ERROR(Advance());
  std::vector<Value> args;
  if (tok_.kind == Tok::kRParen) {
    RETURN_IF_ERROR(Advance());
  } else {
    for (;;) {
      absl::StatusOr<Value> arg = ParseComparison();
      if (!arg.ok()) return arg;
      args.push_back(*arg);
      const Tok t = tok_.kind;
      if (t != Tok::kComma && t != Tok::kRParen) {
        return Unexpected(Cat("',' or ')' to close '(' at position ", open));
      }
      RETURN_IF_ERROR(Advance());
      if (t == Tok::kRParen) break;
    }
  }
  const std::string what = Cat("function ", Quote(f.name));
  if (static_cast<int>(args.size()) != f.arity) {
    return ErrorAt(name_pos, Cat(what, " takes ", f.arity,
                                 f.arity == 1 ? " argument" : " arguments", ", got ", args.size()));
  }
  absl::StatusOr<Value> r;
  if (f.op == OpKind::kWhere) {
    r = Where(args[0], args[1], args[2], name_pos);
  } else if (f.arity == 2) {
    r = Binary(f.op, args[0], args[1], name_pos, what);
  } else {
    r = Unary(f.op, args[0], name_pos, what);
  }
  if (r.ok()) r->pos = name_pos;
  return r;
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
      return InvalidArgument(
          Cat("input name ", Quote(name),
              " is not a valid identifier ([A-Za-z_][A-Za-z0-9_]*, not True or False)"));
    }
    names_.push_back(name);
    types_.push_back(type);
  }
  used_.assign(names_.size(), false);

  RETURN_IF_ERROR(Advance());
  if (tok_.kind == Tok::kEnd) return ErrorAt(tok_.pos, "the expression is empty");
  ASSIGN_OR_RETURN(Value value, ParseComparison());
  if (tok_.kind == Tok::kRParen) return ErrorAt(tok_.pos, "')' has no matching '('");
  if (tok_.kind != Tok::kEnd) {
    return ErrorAt(tok_.pos, Cat("unexpected ", DescribeToken(), " after a complete expression"));
  }
  for (size_t k = 0; k < names_.size(); ++k) {
    if (!used_[k]) {
      return InvalidArgument(
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

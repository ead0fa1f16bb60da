// The expression language's tokens, and the string helpers of the compiler's messages.
// Internal to the compiler (expression.cc); plain C++ apart from the absl::Status it
// returns, as the compiler is.
#ifndef GPUCOMPUTE_SERVER_EXPRESSION_LEXER_H_
#define GPUCOMPUTE_SERVER_EXPRESSION_LEXER_H_

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "server/expression/ir.h"

namespace gpucompute::expr::internal {

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

// Errors found in the text, at byte offset `pos`. Built out of line, so that the parser's
// recursive functions keep small stack frames.
[[gnu::noinline, gnu::cold]] inline absl::Status ErrorAt(size_t pos, std::string_view message) {
  return absl::InvalidArgumentError(Cat("at position ", pos, ": ", message));
}

// Text from the network may be long or binary; messages quote at most this much of it.
inline std::string Quote(std::string_view s) {
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

enum class Tok : uint8_t {
  kEnd,
  kNumber,
  kName,
  kPlus,
  kMinus,
  kStar,
  kSlash,
  kSlashSlash,
  kPercent,
  kAmpersand,
  kBar,
  kCaret,
  kTilde,
  kShiftLeft,
  kShiftRight,
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

// Splits the text into tokens, one at a time.
class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  // Moves to the next token.
  absl::Status Advance();
  const Token& token() const { return tok_; }
  std::string_view text() const { return text_.substr(tok_.pos, tok_.len); }
  // The value of a kNumber token: `f` for a float literal, `i` for an integer one.
  const ConstantValue& number() const { return number_; }
  bool number_is_float() const { return number_is_float_; }

 private:
  static bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  absl::Status LexNumber(size_t pos);
  absl::Status LexError(size_t pos) const;
  // A token of one character, or of two where the next character is `second`.
  void OneOrTwo(char next, char second, Tok one, Tok two) {
    tok_.kind = next == second ? two : one;
    tok_.len = next == second ? 2 : 1;
  }

  std::string_view text_;
  Token tok_;
  size_t next_pos_ = 0;  // where the token after tok_ starts looking
  ConstantValue number_;
  bool number_is_float_ = false;
};

inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }
inline bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
inline bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

inline bool IsIdentifier(std::string_view s) {
  if (s.empty() || !IsNameStart(s[0])) return false;
  return std::all_of(s.begin(), s.end(), IsNameChar);
}

inline absl::Status Lexer::LexError(size_t pos) const {
  const char c = text_[pos];
  if (c == '=') return ErrorAt(pos, "'=' is not an operator; use '==' to compare");
  if (c == '!') return ErrorAt(pos, "unexpected character '!'; use '!=' for 'not equal'");
  return ErrorAt(pos, Cat("unexpected character ", Quote(text_.substr(pos, 1))));
}

inline absl::Status Lexer::Advance() {
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
  constexpr std::pair<char, Tok> kSingle[] = {
      {'+', Tok::kPlus},   {'-', Tok::kMinus}, {'%', Tok::kPercent}, {'&', Tok::kAmpersand},
      {'|', Tok::kBar},    {'^', Tok::kCaret}, {'~', Tok::kTilde},   {'(', Tok::kLParen},
      {')', Tok::kRParen}, {',', Tok::kComma},
  };
  switch (c) {
    case '*':
      OneOrTwo(next, '*', Tok::kStar, Tok::kStarStar);
      break;
    case '/':
      OneOrTwo(next, '/', Tok::kSlash, Tok::kSlashSlash);
      break;
    case '<':
      if (next == '<') {
        OneOrTwo(next, '<', Tok::kLess, Tok::kShiftLeft);
      } else {
        OneOrTwo(next, '=', Tok::kLess, Tok::kLessEqual);
      }
      break;
    case '>':
      if (next == '>') {
        OneOrTwo(next, '>', Tok::kGreater, Tok::kShiftRight);
      } else {
        OneOrTwo(next, '=', Tok::kGreater, Tok::kGreaterEqual);
      }
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
    default: {
      const auto* single = std::find_if(std::begin(kSingle), std::end(kSingle),
                                        [c](const auto& entry) { return entry.first == c; });
      if (single == std::end(kSingle)) return LexError(p);
      tok_.kind = single->second;
      break;
    }
  }
  next_pos_ = p + tok_.len;
  return absl::OkStatus();
}

// digits ['.' digits] [('e' | 'E') ['+' | '-'] digits], or '.' digits [exponent].
inline absl::Status Lexer::LexNumber(size_t pos) {
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

}  // namespace gpucompute::expr::internal

#endif  // GPUCOMPUTE_SERVER_EXPRESSION_LEXER_H_

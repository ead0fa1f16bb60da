// The CPU elementwise evaluator against references computed here with plain float64 (or
// exact integer) loops: every function, every dtype pair, integer wraparound, scalars,
// where, aliasing, odd sizes and large multithreaded runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/cpu/elementwise.h"
#include "server/cpu/thread_pool.h"
#include "server/expression/expression.h"
#include "tests/support/test_util.h"

namespace gpucompute::cpu {
namespace {

using expr::ArrayInput;
using expr::InputMap;
using expr::Program;
using expr::ScalarInput;

// A host array of any dtype, read and written through double or int64.
class Array {
 public:
  Array() = default;
  Array(DType dtype, int64_t n)
      : dtype_(dtype), n_(n), bytes_(static_cast<size_t>(n) * DTypeSize(dtype) + 8) {}

  DType dtype() const { return dtype_; }
  int64_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  double Get(int64_t i) const {
    return VisitDType(dtype_, [&](auto tag) -> double {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        return bytes_[i] != 0 ? 1.0 : 0.0;
      } else {
        T v;
        std::memcpy(&v, bytes_.data() + i * sizeof(T), sizeof(T));
        return static_cast<double>(v);
      }
    });
  }
  int64_t GetInt(int64_t i) const {
    if (dtype_ == DType::kInt32) return Read<int32_t>(i);
    if (dtype_ == DType::kInt64) return Read<int64_t>(i);
    return bytes_[i];  // bool: the raw byte, so a non-normalised result is caught
  }
  void Set(int64_t i, double v) {
    VisitDType(dtype_, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        bytes_[i] = v != 0;
      } else {
        const T x = static_cast<T>(v);
        std::memcpy(bytes_.data() + i * sizeof(T), &x, sizeof(T));
      }
    });
  }
  void SetInt(int64_t i, int64_t v) {
    if (dtype_ == DType::kInt32) {
      Write<int32_t>(i, static_cast<int32_t>(v));
    } else if (dtype_ == DType::kInt64) {
      Write<int64_t>(i, v);
    } else {
      Set(i, static_cast<double>(v));
    }
  }
  // Any byte: the evaluator must read a bool as byte != 0.
  void SetRawBool(int64_t i, uint8_t byte) { bytes_[i] = byte; }
  void FillGarbage() { std::fill(bytes_.begin(), bytes_.end(), 0xAB); }

 private:
  template <typename T>
  T Read(int64_t i) const {
    T v;
    std::memcpy(&v, bytes_.data() + i * sizeof(T), sizeof(T));
    return v;
  }
  template <typename T>
  void Write(int64_t i, T v) {
    std::memcpy(bytes_.data() + i * sizeof(T), &v, sizeof(T));
  }

  DType dtype_ = DType::kFloat64;
  int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

struct Env {
  int64_t n = 0;
  std::map<std::string, const Array*> arrays;
  std::map<std::string, ScalarInput> scalars;
};

Program MustCompile(std::string_view text, const Env& env) {
  InputMap inputs;
  for (const auto& [name, array] : env.arrays) inputs.emplace(name, ArrayInput{array->dtype()});
  for (const auto& [name, scalar] : env.scalars) inputs.emplace(name, scalar);
  absl::StatusOr<Program> program = expr::Compile(text, inputs);
  EXPECT_OK(program) << text;
  if (!program.ok()) return *expr::Compile("0", {});
  return *program;
}

std::vector<const void*> Pointers(const Program& program, const Env& env) {
  std::vector<const void*> pointers;
  for (const std::string& name : program.inputs()) {
    const auto it = env.arrays.find(name);
    pointers.push_back(it == env.arrays.end() ? nullptr : it->second->data());
  }
  return pointers;
}

Array Evaluate(std::string_view text, const Env& env, ThreadPool& pool,
               std::optional<DType> out_dtype = std::nullopt) {
  const Program program = MustCompile(text, env);
  Array out(out_dtype.value_or(program.result_dtype()), env.n);
  out.FillGarbage();
  EvaluateElementwise(program, Pointers(program, env), out.data(), out.dtype(), env.n, pool);
  return out;
}

// Checks out[i] against reference(i), computed in float64: exact for bool and integer
// results (bools must also be stored as 0 or 1), relative 1e-6 for float32 results and
// 1e-12 for float64. NaN must match NaN, infinities exactly.
void ExpectMatches(const Array& out, const std::function<double(int64_t)>& reference,
                   std::string_view what) {
  int failures = 0;
  for (int64_t i = 0; i < out.size(); ++i) {
    const double e = reference(i);
    const double a = out.Get(i);
    bool ok;
    if (out.dtype() == DType::kBool) {
      ok = out.GetInt(i) == (e != 0 ? 1 : 0);
    } else if (IsInteger(out.dtype())) {
      ok = out.GetInt(i) == static_cast<int64_t>(e);
    } else if (std::isnan(e)) {
      ok = std::isnan(a);
    } else if (std::isinf(e)) {
      ok = a == e;
    } else {
      const double rel = out.dtype() == DType::kFloat32 ? 1e-6 : 1e-12;
      ok = std::fabs(a - e) <= rel * std::fabs(e);
    }
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a << " (raw int " << out.GetInt(i)
                    << "), expected " << e;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

void ExpectInts(const Array& out, const std::function<int64_t(int64_t)>& reference,
                std::string_view what) {
  ASSERT_TRUE(IsInteger(out.dtype())) << what;
  int failures = 0;
  for (int64_t i = 0; i < out.size(); ++i) {
    if (out.GetInt(i) != reference(i) && ++failures <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << out.GetInt(i) << ", expected "
                    << reference(i);
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

Array Uniform(DType dtype, int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Array a(dtype, n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = dist(rng);
    a.Set(i, IsInteger(dtype) ? std::round(v) : v);
  }
  return a;
}

bool IsBoolOrInt(DType t) { return !IsFloat(t); }

// np.result_type for our five dtypes, written out as NumPy's table.
DType ResultType(DType a, DType b) {
  constexpr DType B = DType::kBool, I = DType::kInt32, L = DType::kInt64, F = DType::kFloat32,
                  D = DType::kFloat64;
  constexpr DType kTable[5][5] = {
      {B, I, L, F, D}, {I, I, L, D, D}, {L, L, L, D, D}, {F, D, D, F, D}, {D, D, D, D, D}};
  return kTable[static_cast<int>(a)][static_cast<int>(b)];
}

// The documented integer power: wrapping for exponents >= 0; for negative exponents the
// real value truncated toward zero.
int64_t IntPowReference(int64_t base, int64_t exponent, DType dtype) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return exponent % 2 == 0 ? 1 : -1;
    return 0;
  }
  uint64_t r = 1;
  for (int64_t k = 0; k < exponent; ++k) r *= static_cast<uint64_t>(base);
  return dtype == DType::kInt32 ? static_cast<int32_t>(r) : static_cast<int64_t>(r);
}

constexpr DType kAllDTypes[] = {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32,
                                DType::kFloat64};

class ElementwiseTest : public ::testing::Test {
 protected:
  ThreadPool pool_{4};
};

// ---------------------------------------------------------------------------------------
// Functions

struct UnaryCase {
  const char* name;
  double lo, hi;
  double (*reference)(double);
};

double Abs(double x) { return std::fabs(x); }

TEST_F(ElementwiseTest, EveryUnaryFunctionInEveryDtype) {
  const UnaryCase cases[] = {
      {"sin", -3, 3, [](double x) { return std::sin(x); }},
      {"cos", -1.4, 1.4, [](double x) { return std::cos(x); }},
      {"tan", -1.2, 1.2, [](double x) { return std::tan(x); }},
      {"exp", -10, 10, [](double x) { return std::exp(x); }},
      {"log", 0.01, 100, [](double x) { return std::log(x); }},
      {"log1p", -0.5, 10, [](double x) { return std::log1p(x); }},
      {"expm1", -3, 3, [](double x) { return std::expm1(x); }},
      {"sqrt", 0, 100, [](double x) { return std::sqrt(x); }},
      {"abs", -100, 100, Abs},
      {"tanh", -3, 3, [](double x) { return std::tanh(x); }},
      {"sinh", -3, 3, [](double x) { return std::sinh(x); }},
      {"cosh", -3, 3, [](double x) { return std::cosh(x); }},
      {"asin", -0.9, 0.9, [](double x) { return std::asin(x); }},
      {"acos", -0.9, 0.9, [](double x) { return std::acos(x); }},
      {"atan", -10, 10, [](double x) { return std::atan(x); }},
      {"floor", -10, 10, [](double x) { return std::floor(x); }},
      {"ceil", -10, 10, [](double x) { return std::ceil(x); }},
  };
  constexpr int64_t kN = 3001;
  for (const UnaryCase& c : cases) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      const Array x = Uniform(dtype, kN, c.lo, c.hi, 7);
      Env env{kN, {{"x", &x}}, {}};
      const std::string text = std::string(c.name) + "(x)";
      const Array out = Evaluate(text, env, pool_);
      // float32 stays float32; integers compute in float64 except abs, which stays int.
      const DType expected = std::string(c.name) == "abs" ? dtype
                             : IsFloat(dtype)             ? dtype
                                                          : DType::kFloat64;
      EXPECT_EQ(out.dtype(), expected) << text;
      ExpectMatches(
          out, [&](int64_t i) { return c.reference(x.Get(i)); },
          text + " on " + std::string(DTypeName(dtype)));
    }
  }
}

TEST_F(ElementwiseTest, Float32ArithmeticStaysInFloat32) {
  // 1 + 1e-8 is 1 in float32; computing in float64 would leave 1e-8.
  constexpr int64_t kN = 5;
  Array x(DType::kFloat32, kN);
  for (int64_t i = 0; i < kN; ++i) x.Set(i, 1.0);
  Env env{kN, {{"x", &x}}, {}};
  const Array out = Evaluate("x + 1e-8 - 1", env, pool_);
  ASSERT_EQ(out.dtype(), DType::kFloat32);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(out.Get(i), 0.0);
}

// ---------------------------------------------------------------------------------------
// Binary operations over every dtype pair

double BinaryReference(const std::string& op, double a, double b) {
  if (op == "+") return a + b;
  if (op == "-") return a - b;
  if (op == "*") return a * b;
  if (op == "/") return a / b;
  if (op == "**") return std::pow(a, b);
  if (op == "atan2") return std::atan2(a, b);
  if (op == "min") return (std::isnan(a) || std::isnan(b)) ? NAN : std::min(a, b);
  if (op == "max") return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b);
  if (op == "<") return a < b;
  if (op == "<=") return a <= b;
  if (op == ">") return a > b;
  if (op == ">=") return a >= b;
  if (op == "==") return a == b;
  return a != b;
}

TEST_F(ElementwiseTest, BinaryOperationsOnEveryDtypePair) {
  const std::vector<std::string> ops = {
      "+", "-", "*", "/", "**", "<", "<=", ">", ">=", "==", "!=", "min", "max", "atan2"};
  constexpr int64_t kN = 2053;
  for (DType da : kAllDTypes) {
    for (DType db : kAllDTypes) {
      // Values in [-8, 8] (quarters for floats) with zeros, and bools stored as 0, 1 or 2.
      Array a(da, kN), b(db, kN);
      for (int64_t i = 0; i < kN; ++i) {
        const double va = static_cast<double>(i * 7 % 17 - 8) + (IsFloat(da) ? (i % 4) * 0.25 : 0);
        const double vb = static_cast<double>(i * 5 % 13 - 6) + (IsFloat(db) ? (i % 3) * 0.25 : 0);
        if (da == DType::kBool) {
          a.SetRawBool(i, static_cast<uint8_t>(i % 3));
        } else {
          a.Set(i, va);
        }
        if (db == DType::kBool) {
          b.SetRawBool(i, static_cast<uint8_t>(i % 5 == 0 ? 0 : i % 2 + 1));
        } else {
          b.Set(i, vb);
        }
      }
      Env env{kN, {{"a", &a}, {"b", &b}}, {}};
      for (const std::string& op : ops) {
        const bool is_call = op == "min" || op == "max" || op == "atan2";
        const std::string text = is_call ? op + "(a, b)" : "a " + op + " b";
        const std::string what =
            text + " with " + std::string(DTypeName(da)) + ", " + std::string(DTypeName(db));
        const bool arithmetic =
            op == "+" || op == "-" || op == "*" || op == "/" || op == "**" || op == "atan2";
        InputMap inputs = {{"a", ArrayInput{da}}, {"b", ArrayInput{db}}};
        if (arithmetic && da == DType::kBool && db == DType::kBool) {
          const absl::StatusOr<Program> p = expr::Compile(text, inputs);
          EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << what;
          continue;
        }
        DType expected = ResultType(da, db);
        if ((op == "/" || op == "atan2") && IsBoolOrInt(expected)) expected = DType::kFloat64;
        if (op == "<" || op == "<=" || op == ">" || op == ">=" || op == "==" || op == "!=") {
          expected = DType::kBool;
        }
        const Array out = Evaluate(text, env, pool_);
        ASSERT_EQ(out.dtype(), expected) << what;
        if (op == "**" && IsInteger(expected)) {
          ExpectInts(
              out,
              [&](int64_t i) {
                return IntPowReference(static_cast<int64_t>(a.Get(i)),
                                       static_cast<int64_t>(b.Get(i)), expected);
              },
              what);
        } else {
          ExpectMatches(
              out, [&](int64_t i) { return BinaryReference(op, a.Get(i), b.Get(i)); }, what);
        }
      }
    }
  }
}

TEST_F(ElementwiseTest, MinMaxPropagateNaNAndComparisonsFollowIeee) {
  constexpr int64_t kN = 6;
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Array x(dtype, kN), y(dtype, kN);
    const double xs[kN] = {NAN, 1, NAN, -0.5, INFINITY, 2};
    const double ys[kN] = {1, NAN, NAN, -0.25, 3, -INFINITY};
    for (int64_t i = 0; i < kN; ++i) {
      x.Set(i, xs[i]);
      y.Set(i, ys[i]);
    }
    Env env{kN, {{"x", &x}, {"y", &y}}, {}};
    for (const std::string op : {"min", "max"}) {
      ExpectMatches(
          Evaluate(op + "(x, y)", env, pool_),
          [&](int64_t i) { return BinaryReference(op, xs[i], ys[i]); }, op);
    }
    for (const std::string op : {"<", "<=", ">", ">=", "==", "!="}) {
      ExpectMatches(
          Evaluate("x " + op + " y", env, pool_),
          [&](int64_t i) { return BinaryReference(op, xs[i], ys[i]); }, op);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Integers

TEST_F(ElementwiseTest, Int32ArithmeticWrapsAround) {
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> xs = {kMax, kMin, -1, 123456789, -98765, kMin, 46341};
  const std::vector<int32_t> ys = {1, -1, kMin, 1000, 77777, kMin, 46341};
  const int64_t n = static_cast<int64_t>(xs.size());
  Array x(DType::kInt32, n), y(DType::kInt32, n);
  for (int64_t i = 0; i < n; ++i) {
    x.SetInt(i, xs[i]);
    y.SetInt(i, ys[i]);
  }
  Env env{n, {{"x", &x}, {"y", &y}}, {}};
  Env ex{n, {{"x", &x}}, {}};
  // The reference computes exactly in int64 and wraps by converting (modular in C++20).
  auto wrap = [](int64_t v) -> int64_t { return static_cast<int32_t>(static_cast<uint32_t>(v)); };
  ExpectInts(
      Evaluate("x + y", env, pool_), [&](int64_t i) { return wrap(int64_t{xs[i]} + ys[i]); }, "+");
  ExpectInts(
      Evaluate("x - y", env, pool_), [&](int64_t i) { return wrap(int64_t{xs[i]} - ys[i]); }, "-");
  ExpectInts(
      Evaluate("x * y", env, pool_), [&](int64_t i) { return wrap(int64_t{xs[i]} * ys[i]); }, "*");
  ExpectInts(
      Evaluate("-x", ex, pool_), [&](int64_t i) { return wrap(-int64_t{xs[i]}); }, "neg");
  ExpectInts(
      Evaluate("abs(x)", ex, pool_), [&](int64_t i) { return wrap(std::llabs(xs[i])); }, "abs");
  ExpectInts(
      Evaluate("x * 3 + 7", ex, pool_),
      [&](int64_t i) { return wrap(wrap(int64_t{xs[i]} * 3) + 7); }, "weak");
  ExpectInts(
      Evaluate("x ** 3", ex, pool_),
      [&](int64_t i) {
        return wrap(
            static_cast<int64_t>(static_cast<uint64_t>(xs[i]) * static_cast<uint64_t>(xs[i]) *
                                 static_cast<uint64_t>(xs[i])));
      },
      "**");
  // Integer true division by zero gives float64 inf or NaN.
  ExpectMatches(
      Evaluate("x / (y - y)", env, pool_),
      [&](int64_t i) { return static_cast<double>(xs[i]) / 0.0; }, "/0");
}

TEST_F(ElementwiseTest, Int64ArithmeticWrapsAround) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> xs = {kMax, kMin, -1, 3037000500, kMin, 1234567890123};
  const std::vector<int64_t> ys = {1, -1, kMin, 3037000500, kMin, -987654321};
  const int64_t n = static_cast<int64_t>(xs.size());
  Array x(DType::kInt64, n), y(DType::kInt64, n);
  for (int64_t i = 0; i < n; ++i) {
    x.SetInt(i, xs[i]);
    y.SetInt(i, ys[i]);
  }
  Env env{n, {{"x", &x}, {"y", &y}}, {}};
  Env ex{n, {{"x", &x}}, {}};
  auto exact = [](__int128 v) -> int64_t { return static_cast<int64_t>(static_cast<uint64_t>(v)); };
  ExpectInts(
      Evaluate("x + y", env, pool_), [&](int64_t i) { return exact(__int128{xs[i]} + ys[i]); },
      "+");
  ExpectInts(
      Evaluate("x - y", env, pool_), [&](int64_t i) { return exact(__int128{xs[i]} - ys[i]); },
      "-");
  ExpectInts(
      Evaluate("x * y", env, pool_), [&](int64_t i) { return exact(__int128{xs[i]} * ys[i]); },
      "*");
  ExpectInts(
      Evaluate("-x", ex, pool_), [&](int64_t i) { return exact(-__int128{xs[i]}); }, "neg");
  ExpectInts(
      Evaluate("abs(x)", ex, pool_),
      [&](int64_t i) { return exact(xs[i] < 0 ? -__int128{xs[i]} : xs[i]); }, "abs");
  ExpectInts(
      Evaluate("max(x, y) - min(x, y)", env, pool_),
      [&](int64_t i) { return exact(__int128{std::max(xs[i], ys[i])} - std::min(xs[i], ys[i])); },
      "max-min");
}

// //, % and fmod against exact 128-bit references: floor and the divisor's sign for // and
// %, the dividend's for fmod, 0 for division by zero, and MIN // -1 wrapping.
template <typename T>
void CheckIntegerDivision(ThreadPool& pool) {
  constexpr T kMin = std::numeric_limits<T>::min();
  constexpr T kMax = std::numeric_limits<T>::max();
  const std::vector<T> values = {-7, -2, -1, 0, 1, 2, 7, kMin, kMax};
  const DType dtype = std::is_same_v<T, int32_t> ? DType::kInt32 : DType::kInt64;
  const int64_t n = static_cast<int64_t>(values.size() * values.size());
  Array x(dtype, n), y(dtype, n);
  std::vector<__int128> xs, ys;
  for (T a : values) {
    for (T b : values) {
      x.SetInt(static_cast<int64_t>(xs.size()), a);
      y.SetInt(static_cast<int64_t>(xs.size()), b);
      xs.push_back(a);
      ys.push_back(b);
    }
  }
  const auto wrap = [](__int128 v) -> int64_t {
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
  };
  const auto floor_div = [&](int64_t i) -> __int128 {
    if (ys[i] == 0) return 0;
    __int128 q = xs[i] / ys[i];
    if (q * ys[i] != xs[i] && ((xs[i] < 0) != (ys[i] < 0))) --q;
    return q;
  };
  Env env{n, {{"x", &x}, {"y", &y}}, {}};
  ExpectInts(
      Evaluate("x // y", env, pool), [&](int64_t i) { return wrap(floor_div(i)); }, "//");
  ExpectInts(
      Evaluate("x % y", env, pool),
      [&](int64_t i) { return ys[i] == 0 ? 0 : wrap(xs[i] - floor_div(i) * ys[i]); }, "%");
  ExpectInts(
      Evaluate("fmod(x, y)", env, pool),
      [&](int64_t i) { return ys[i] == 0 ? 0 : wrap(xs[i] - (xs[i] / ys[i]) * ys[i]); }, "fmod");
}

TEST_F(ElementwiseTest, IntegerDivisionFollowsNumPy) {
  CheckIntegerDivision<int32_t>(pool_);
  CheckIntegerDivision<int64_t>(pool_);
}

TEST_F(ElementwiseTest, ShiftsOutsideTheWidthShiftEverythingOut) {
  const std::vector<int64_t> amounts = {-1, 0, 1, 31, 32, 33, 63, 64, 65};
  const std::vector<int64_t> values = {5, -5, std::numeric_limits<int32_t>::min(), -1};
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    const int bits = dtype == DType::kInt32 ? 32 : 64;
    const int64_t n = static_cast<int64_t>(amounts.size() * values.size());
    Array x(dtype, n), y(dtype, n);
    std::vector<int64_t> xs, ys;
    for (int64_t v : values) {
      for (int64_t a : amounts) {
        x.SetInt(static_cast<int64_t>(xs.size()), v);
        y.SetInt(static_cast<int64_t>(xs.size()), a);
        xs.push_back(v);
        ys.push_back(a);
      }
    }
    const auto narrow = [&](uint64_t v) -> int64_t {
      return bits == 32 ? static_cast<int32_t>(static_cast<uint32_t>(v)) : static_cast<int64_t>(v);
    };
    Env env{n, {{"x", &x}, {"y", &y}}, {}};
    ExpectInts(
        Evaluate("x << y", env, pool_),
        [&](int64_t i) {
          return ys[i] < 0 || ys[i] >= bits ? 0 : narrow(static_cast<uint64_t>(xs[i]) << ys[i]);
        },
        "<<");
    ExpectInts(
        Evaluate("x >> y", env, pool_),
        [&](int64_t i) -> int64_t {
          if (ys[i] < 0 || ys[i] >= bits) return xs[i] < 0 ? -1 : 0;
          return xs[i] >> ys[i];
        },
        ">>");
  }
}

// Predicates over more than one block, so that both the full-block and the tail kernels
// write their bool results as 0 or 1.
TEST_F(ElementwiseTest, FloatTestsAndLogicalFunctionsGiveBools) {
  constexpr int64_t kN = 2500;
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.5, -2.0, 5e-324};
  Array x(DType::kFloat64, kN), i(DType::kInt32, kN);
  for (int64_t k = 0; k < kN; ++k) {
    x.Set(k, specials[k % 8]);
    i.SetInt(k, k % 3 - 1);
  }
  Env env{kN, {{"x", &x}, {"i", &i}}, {}};
  Env ex{kN, {{"x", &x}}, {}};
  Env ei{kN, {{"i", &i}}, {}};
  const auto at = [&](int64_t k) { return specials[k % 8]; };
  ExpectMatches(
      Evaluate("isnan(x)", ex, pool_), [&](int64_t k) { return std::isnan(at(k)); }, "isnan");
  ExpectMatches(
      Evaluate("isinf(x)", ex, pool_), [&](int64_t k) { return std::isinf(at(k)); }, "isinf");
  ExpectMatches(
      Evaluate("isfinite(x)", ex, pool_), [&](int64_t k) { return std::isfinite(at(k)); },
      "isfinite");
  ExpectMatches(
      Evaluate("signbit(x)", ex, pool_), [&](int64_t k) { return std::signbit(at(k)); }, "signbit");
  ExpectMatches(
      Evaluate("signbit(i) | isnan(i)", ei, pool_), [&](int64_t k) { return k % 3 == 0; },
      "signbit of ints");
  // NaN is true, as in NumPy's logical functions.
  ExpectMatches(
      Evaluate("logical_and(x, i)", env, pool_),
      [&](int64_t k) { return at(k) != 0 && k % 3 != 1; }, "logical_and");
  ExpectMatches(
      Evaluate("logical_not(x) ^ (i == 0)", env, pool_),
      [&](int64_t k) { return (at(k) == 0) != (k % 3 == 1); }, "logical_not ^");
}

// round(x, d) with d from a scalar input: the same Program shape whatever d's sign, and
// NumPy's results for each.
TEST_F(ElementwiseTest, RoundWithScalarDecimals) {
  const std::vector<double> xs = {1234.5678, -1250.0, 0.285, 2.5, -0.0, NAN, 1e300};
  const int64_t n = static_cast<int64_t>(xs.size());
  Array x(DType::kFloat64, n);
  for (int64_t k = 0; k < n; ++k) x.Set(k, xs[k]);
  for (int64_t d : {2, 0, -2}) {
    Env env{n, {{"x", &x}}, {{"d", ScalarInput{DType::kInt64, 0, d}}}};
    const double scale = std::pow(10.0, static_cast<double>(std::llabs(d)));
    ExpectMatches(
        Evaluate("round(x, d)", env, pool_),
        [&](int64_t k) {
          return d >= 0 ? std::nearbyint(xs[k] * scale) / scale
                        : std::nearbyint(xs[k] / scale) * scale;
        },
        "round(x, d)");
  }
}

TEST_F(ElementwiseTest, IntegerPowerWithNegativeExponents) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t base = -3; base <= 3; ++base) {
    for (int64_t e = -4; e <= 7; ++e) pairs.emplace_back(base, e);
  }
  pairs.emplace_back(3, 40);   // wraps in int32
  pairs.emplace_back(-7, 63);  // wraps
  const int64_t n = static_cast<int64_t>(pairs.size());
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    Array x(dtype, n), y(dtype, n);
    for (int64_t i = 0; i < n; ++i) {
      x.SetInt(i, pairs[i].first);
      y.SetInt(i, pairs[i].second);
    }
    Env env{n, {{"x", &x}, {"y", &y}}, {}};
    for (const char* text : {"x ** y", "pow(x, y)"}) {
      ExpectInts(
          Evaluate(text, env, pool_),
          [&](int64_t i) { return IntPowReference(pairs[i].first, pairs[i].second, dtype); }, text);
    }
    // A literal exponent, including the x*x rewrite of x**2.
    Env x_only{n, {{"x", &x}}, {}};
    for (int64_t e : {-1, 0, 2, 3}) {
      const std::string text = "x ** " + std::to_string(e);
      ExpectInts(
          Evaluate(text, x_only, pool_),
          [&](int64_t i) { return IntPowReference(pairs[i].first, e, dtype); }, text);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Scalars, constants and where

TEST_F(ElementwiseTest, WeakScalarsTakeTheArrayDtype) {
  constexpr int64_t kN = 4099;
  const Array x = Uniform(DType::kFloat32, kN, 0.5, 4, 1);
  const Array y = Uniform(DType::kFloat32, kN, 0.5, 4, 2);
  const Array i32 = Uniform(DType::kInt32, kN, -1000, 1000, 3);
  Env env{kN,
          {{"x", &x}, {"y", &y}, {"i", &i32}},
          {{"a", ScalarInput{DType::kFloat64, 0.1}},
           {"k", ScalarInput{DType::kInt64, 0, -3}},
           {"m", ScalarInput{DType::kInt32, 0, 5}},
           {"t", ScalarInput{DType::kBool, 0, 1}}}};
  Env saxpy = env;
  saxpy.arrays.erase("i");
  saxpy.scalars = {{"a", env.scalars["a"]}};
  Array out = Evaluate("a*x + y", saxpy, pool_);
  EXPECT_EQ(out.dtype(), DType::kFloat32);
  ExpectMatches(
      out, [&](int64_t j) { return 0.1 * x.Get(j) + y.Get(j); }, "a*x + y");

  Env ints{kN, {{"i", &i32}}, {{"k", env.scalars["k"]}, {"m", env.scalars["m"]}}};
  out = Evaluate("k * i + m", ints, pool_);
  EXPECT_EQ(out.dtype(), DType::kInt32);
  ExpectMatches(
      out, [&](int64_t j) { return -3 * i32.Get(j) + 5; }, "k * i + m");

  Env mixed{kN, {{"i", &i32}}, {{"a", env.scalars["a"]}, {"t", env.scalars["t"]}}};
  out = Evaluate("where(t, i * a, 0)", mixed, pool_);
  EXPECT_EQ(out.dtype(), DType::kFloat64);
  ExpectMatches(
      out, [&](int64_t j) { return i32.Get(j) * 0.1; }, "where(t, i * a, 0)");

  Env x_only{kN, {{"x", &x}}, {{"t", ScalarInput{DType::kBool, 0, 0}}}};
  out = Evaluate("where(t, x, -x) + t", x_only, pool_);
  EXPECT_EQ(out.dtype(), DType::kFloat32);
  ExpectMatches(
      out, [&](int64_t j) { return -x.Get(j); }, "scalar condition false");
}

TEST_F(ElementwiseTest, ConstantOnlyExpressionsFillTheOutput) {
  constexpr int64_t kN = 2500;
  Env none{kN, {}, {}};
  Array out = Evaluate("2 + 3 * 4", none, pool_);
  EXPECT_EQ(out.dtype(), DType::kInt64);
  ExpectMatches(
      out, [](int64_t) { return 14.0; }, "2 + 3 * 4");
  out = Evaluate("1 / 4", none, pool_);
  EXPECT_EQ(out.dtype(), DType::kFloat64);
  ExpectMatches(
      out, [](int64_t) { return 0.25; }, "1 / 4");
  out = Evaluate("True", none, pool_);
  ExpectMatches(
      out, [](int64_t) { return 1.0; }, "True");
  Env scalar{kN, {}, {{"s", ScalarInput{DType::kFloat64, 1.5}}}};
  out = Evaluate("sqrt(s * 6)", scalar, pool_, DType::kFloat32);
  ExpectMatches(
      out, [](int64_t) { return 3.0; }, "sqrt(s * 6) into float32");
}

TEST_F(ElementwiseTest, WhereVariants) {
  constexpr int64_t kN = 3333;
  Array b(DType::kBool, kN);
  for (int64_t i = 0; i < kN; ++i) b.SetRawBool(i, static_cast<uint8_t>(i % 3));  // 0, 1, 2
  const Array x = Uniform(DType::kFloat32, kN, -5, 5, 11);
  const Array y = Uniform(DType::kFloat64, kN, -5, 5, 12);
  const Array k = Uniform(DType::kInt32, kN, -2, 2, 13);
  Env env{kN, {{"b", &b}, {"x", &x}, {"y", &y}, {"k", &k}}, {}};
  auto only = [&](std::initializer_list<const char*> names) {
    Env e{kN, {}, {}};
    for (const char* name : names) e.arrays[name] = env.arrays[name];
    return e;
  };
  auto truth = [&](int64_t i) { return b.Get(i) != 0; };
  ExpectMatches(
      Evaluate("where(b, x, y)", only({"b", "x", "y"}), pool_),
      [&](int64_t i) { return truth(i) ? x.Get(i) : y.Get(i); }, "where(b, x, y)");
  ExpectMatches(
      Evaluate("where(k, x, 0)", only({"k", "x"}), pool_),
      [&](int64_t i) { return k.Get(i) != 0 ? x.Get(i) : 0.0; }, "int condition");
  ExpectMatches(
      Evaluate("where(y, 1, 2)", only({"y"}), pool_),
      [&](int64_t i) { return y.Get(i) != 0 ? 1.0 : 2.0; }, "float condition");
  const Array r = Evaluate("where(x > 0, 1, -1)", only({"x"}), pool_);
  EXPECT_EQ(r.dtype(), DType::kInt64);
  ExpectMatches(
      r, [&](int64_t i) { return x.Get(i) > 0 ? 1.0 : -1.0; }, "scalar branches");
  ExpectMatches(
      Evaluate("where(b, 2.5, x)", only({"b", "x"}), pool_),
      [&](int64_t i) { return truth(i) ? 2.5 : x.Get(i); }, "scalar first branch");
  ExpectMatches(
      Evaluate("where(b, x < 0, b)", only({"b", "x"}), pool_),
      [&](int64_t i) { return truth(i) ? (x.Get(i) < 0) : 0.0; }, "bool branches");
  // Bool bytes other than 0 and 1 still read as true, and results are stored as 0 or 1.
  ExpectMatches(Evaluate("b == True", only({"b"}), pool_), truth, "b == True");
  ExpectMatches(Evaluate("max(b, b)", only({"b"}), pool_), truth, "max(b, b)");
  ExpectMatches(Evaluate("b", only({"b"}), pool_), truth, "b copied");
  ExpectMatches(Evaluate("b", only({"b"}), pool_, DType::kInt32), truth, "b as int32");
  ExpectMatches(
      Evaluate("b + 1", only({"b"}), pool_), [&](int64_t i) { return truth(i) + 1.0; }, "b + 1");
}

TEST_F(ElementwiseTest, ResultIsConvertedToTheOutputDtype) {
  constexpr int64_t kN = 1500;
  const Array i = Uniform(DType::kInt32, kN, -100000, 100000, 21);
  const Array f = Uniform(DType::kFloat32, kN, -10, 10, 22);
  const Array l = Uniform(DType::kInt64, kN, -1e15, 1e15, 23);
  Env ei{kN, {{"i", &i}}, {}};
  Env ef{kN, {{"f", &f}}, {}};
  Env el{kN, {{"l", &l}}, {}};
  ExpectMatches(
      Evaluate("i * 3", ei, pool_, DType::kInt64), [&](int64_t k) { return i.Get(k) * 3; },
      "int32 into int64");
  ExpectMatches(
      Evaluate("i * 3", ei, pool_, DType::kFloat32),
      [&](int64_t k) { return static_cast<double>(static_cast<float>(i.Get(k) * 3)); },
      "int32 into float32");
  ExpectMatches(
      Evaluate("f * 2", ef, pool_, DType::kFloat64), [&](int64_t k) { return f.Get(k) * 2; },
      "float32 into float64");
  ExpectMatches(
      Evaluate("f < 0", ef, pool_, DType::kFloat32),
      [&](int64_t k) { return f.Get(k) < 0 ? 1.0 : 0.0; }, "bool into float32");
  ExpectMatches(
      Evaluate("f / 3", ef, pool_, DType::kFloat64),
      [&](int64_t k) { return static_cast<double>(static_cast<float>(f.Get(k) / 3)); },
      "float32 division into float64");
  ExpectInts(
      Evaluate("l + 1", el, pool_, DType::kInt32),
      [&](int64_t k) -> int64_t {
        return static_cast<int32_t>(static_cast<int64_t>(l.Get(k)) + 1);
      },
      "int64 narrowed to int32 (static_cast wraps)");
  ExpectMatches(
      Evaluate("sin(f) * 1.0", ef, pool_, DType::kFloat64),
      [&](int64_t k) { return static_cast<double>(std::sin(static_cast<float>(f.Get(k)))); },
      "float32 sin into float64");
}

// ---------------------------------------------------------------------------------------
// Aliasing

TEST_F(ElementwiseTest, OutputMayBeAnInput) {
  constexpr int64_t kN = 5000;
  const Array x0 = Uniform(DType::kFloat32, kN, -4, 4, 31);
  const Array y0 = Uniform(DType::kFloat32, kN, -4, 4, 32);
  struct Case {
    const char* text;
    const char* out;  // the input that is overwritten
    std::function<double(double, double)> reference;
  };
  const Case cases[] = {
      {"x + 1", "x", [](double x, double) { return static_cast<float>(x + 1); }},
      {"x * y + x", "y",
       [](double x, double y) { return static_cast<float>(static_cast<float>(x * y) + x); }},
      {"where(x > 0, x, -x)", "x", [](double x, double) { return std::fabs(x); }},
      {"x", "x", [](double x, double) { return x; }},
      {"y - x", "x", [](double x, double y) { return static_cast<float>(y - x); }},
  };
  for (const Case& c : cases) {
    Array x = x0, y = y0;
    Env env{kN, {{"x", &x}}, {}};
    if (std::string(c.text).find('y') != std::string::npos) env.arrays["y"] = &y;
    const Program program = MustCompile(c.text, env);
    Array& out = std::string(c.out) == "x" ? x : y;
    EvaluateElementwise(program, Pointers(program, env), out.data(), DType::kFloat32, kN, pool_);
    ExpectMatches(
        out, [&](int64_t i) { return c.reference(x0.Get(i), y0.Get(i)); }, c.text);
  }
  // Integers in place.
  Array k = Uniform(DType::kInt32, kN, -1000, 1000, 33);
  const Array k0 = k;
  Env env{kN, {{"k", &k}}, {}};
  const Program program = MustCompile("k * 2 - 1", env);
  EvaluateElementwise(program, Pointers(program, env), k.data(), DType::kInt32, kN, pool_);
  ExpectMatches(
      k, [&](int64_t i) { return k0.Get(i) * 2 - 1; }, "k = k * 2 - 1");
}

TEST_F(ElementwiseTest, PartiallyOverlappingOutputIsHandled) {
  constexpr int64_t kN = 4000;
  const Array x0 = Uniform(DType::kFloat64, kN, -4, 4, 41);
  // The output starts one element into x.
  Array buffer(DType::kFloat64, kN + 1);
  for (int64_t i = 0; i < kN; ++i) buffer.Set(i, x0.Get(i));
  const Program program = MustCompile("x * 2", Env{kN, {{"x", &x0}}, {}});
  const void* in[] = {buffer.data()};
  EvaluateElementwise(program, in, static_cast<double*>(buffer.data()) + 1, DType::kFloat64, kN,
                      pool_);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(buffer.Get(i + 1), x0.Get(i) * 2) << i;

  // An int32 input overwritten by its own int64 result (same start, wider elements).
  Array wide(DType::kInt64, kN);
  Array i0 = Uniform(DType::kInt32, kN, -1000, 1000, 42);
  std::memcpy(wide.data(), i0.data(), kN * sizeof(int32_t));
  const Program widen = MustCompile("i + 1", Env{kN, {{"i", &i0}}, {}});
  const void* in2[] = {wide.data()};
  EvaluateElementwise(widen, in2, wide.data(), DType::kInt64, kN, pool_);
  ExpectMatches(
      wide, [&](int64_t i) { return i0.Get(i) + 1; }, "int32 -> int64 in place");
}

// ---------------------------------------------------------------------------------------
// Sizes, threads, the reference workload

constexpr const char* kWorkload = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";

double WorkloadReference(double x) {
  return std::sqrt(
      std::fabs(std::exp(-std::sin(x * x)) / (std::sqrt(std::fabs(x)) * std::tanh(x))));
}

// x in [-2, -0.1] and [0.1, 2], where float32 rounding stays well inside 1e-6 relative.
Array WorkloadInput(DType dtype, int64_t n, uint32_t seed) {
  Array x = Uniform(dtype, n, 0.1, 2, seed);
  for (int64_t i = 0; i < n; i += 3) x.Set(i, -x.Get(i));
  return x;
}

TEST_F(ElementwiseTest, ReferenceWorkload) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const int64_t n = int64_t{1} << 20;
    const Array x = WorkloadInput(dtype, n, 51);
    Env env{n, {{"x", &x}}, {}};
    const Array out = Evaluate(kWorkload, env, pool_);
    EXPECT_EQ(out.dtype(), dtype);
    ExpectMatches(
        out, [&](int64_t i) { return WorkloadReference(x.Get(i)); },
        std::string("workload ") + std::string(DTypeName(dtype)));
  }
}

TEST_F(ElementwiseTest, SizesAroundTheBlockSize) {
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{1023}, int64_t{1024}, int64_t{1025},
        int64_t{8191}, int64_t{8192}, int64_t{8193}, int64_t{3 * 1024 + 7}, int64_t{100003}}) {
    const Array x = WorkloadInput(DType::kFloat32, n, 61);
    const Array y = Uniform(DType::kFloat32, n, 0, 3, 62);  // positive: no cancellation
    Env env{n, {{"x", &x}, {"y", &y}}, {}};
    ExpectMatches(
        Evaluate(std::string(kWorkload) + " + y", env, pool_),
        [&](int64_t i) { return WorkloadReference(x.Get(i)) + y.Get(i); },
        "n=" + std::to_string(n));
  }
  // n == 0 touches nothing: null pointers are fine.
  const Array empty(DType::kFloat64, 0);
  const Program program = MustCompile("x + 1", Env{0, {{"x", &empty}}, {}});
  const void* in[] = {nullptr};
  EvaluateElementwise(program, in, nullptr, DType::kFloat64, 0, pool_);
}

TEST_F(ElementwiseTest, ResultsDoNotDependOnThreadCount) {
  const int64_t n = (int64_t{1} << 20) + 5;
  const Array x = WorkloadInput(DType::kFloat32, n, 71);
  const Array y = Uniform(DType::kInt32, n, -50, 50, 72);
  const Array z = Uniform(DType::kFloat64, n, -50, 50, 73);
  Env env{n, {{"x", &x}, {"y", &y}}, {{"a", ScalarInput{DType::kFloat64, 0.75}}}};
  ThreadPool one(1);
  // Bitwise identical, whatever the thread count.
  const std::string text = std::string(kWorkload) + " * a + y ** 2 - where(y > 3, x, y)";
  const Array serial = Evaluate(text, env, one);
  const Array parallel = Evaluate(text, env, pool_);
  ASSERT_EQ(serial.dtype(), DType::kFloat64);
  EXPECT_EQ(std::memcmp(serial.data(), parallel.data(), n * sizeof(double)), 0);
  // And right: the same shape of expression in float64, against the reference.
  Env env64{n, {{"z", &z}, {"y", &y}}, {{"a", ScalarInput{DType::kFloat64, 0.75}}}};
  ExpectMatches(
      Evaluate("z * a + y ** 2 - where(y > 3, z, y)", env64, pool_),
      [&](int64_t i) {
        const double yi = y.Get(i);
        return (z.Get(i) * 0.75 + yi * yi) - (yi > 3 ? z.Get(i) : yi);
      },
      "mixed");
}

TEST_F(ElementwiseTest, ConcurrentEvaluationsOfOneProgram) {
  const int64_t n = 200000;
  const Array x = WorkloadInput(DType::kFloat64, n, 81);
  Env env{n, {{"x", &x}}, {}};
  const Program program = MustCompile(kWorkload, env);
  std::vector<Array> outs(4, Array(DType::kFloat64, n));
  std::vector<std::thread> threads;
  for (Array& out : outs) {
    threads.emplace_back([&] {
      EvaluateElementwise(program, Pointers(program, env), out.data(), DType::kFloat64, n, pool_);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Array& out : outs) {
    ExpectMatches(
        out, [&](int64_t i) { return WorkloadReference(x.Get(i)); }, "concurrent");
  }
}

TEST_F(ElementwiseTest, ManyLiveValuesUseShorterBlocks) {
  // sin(x*1) + (sin(x*2) + (... + sin(x*200))): every left operand waits for the whole
  // right side, so ~200 values are live at once, more than full-size blocks allow.
  constexpr int kTerms = 200;
  std::string text;
  for (int k = 1; k < kTerms; ++k) text += "sin(x*" + std::to_string(k) + ") + (";
  text += "sin(x*" + std::to_string(kTerms) + ")" + std::string(kTerms - 1, ')');
  constexpr int64_t kN = 5003;
  const Array x = Uniform(DType::kFloat64, kN, -1, 1, 91);
  Env env{kN, {{"x", &x}}, {}};
  ExpectMatches(
      Evaluate(text, env, pool_),
      [&](int64_t i) {
        double r = std::sin(x.Get(i) * kTerms);
        for (int k = kTerms - 1; k >= 1; --k) r = std::sin(x.Get(i) * k) + r;
        return r;
      },
      "200 live values");
}

}  // namespace
}  // namespace gpucompute::cpu

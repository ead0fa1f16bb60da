// The expression language's NumPy functions against NumPy itself, on every backend: each
// case of tests/testdata/ufunc_special_values.txt (NumPy's results over NaN, +-inf, +-0,
// subnormals, the largest values and the integer extremes; tests/tools/make_ufunc_golden.py
// makes it) is compiled and run through Backend::Elementwise, and each result compared
// with NumPy's under the bound of kUlpBounds below, the table docs/expressions.md repeats.
//
// Instantiated like the conformance suite (backend_conformance.h): the CPU backend, and the
// CUDA backend where the build has it (skipped where no GPU is usable).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "server/cpu/cpu_backend.h"
#include "server/expression/expression.h"
#include "tests/backend/backend_conformance.h"
#include "tests/support/test_util.h"
#if defined(GPUCOMPUTE_HAVE_CUDA)
#include "server/cuda/cuda_backend.h"
#endif

namespace gpucompute::conformance {
namespace {

// How far a float result may be from NumPy's, in units in the last place of the result's
// dtype, per function (the name before '('); functions not listed must match exactly (0).
// docs/expressions.md repeats this table. Each bound is CUDA's documented maximum error of
// the function (the CUDA C++ Programming Guide's tables) plus 4 ulp for NumPy's own (its
// SIMD implementations on x86-64 promise 4 ulp), and so covers the CPU backend's C
// library, which is within 1 ulp. Integer and bool results are always exact.
struct UlpBound {
  std::string_view function;
  int64_t float32;
  int64_t float64;
};

constexpr UlpBound kUlpBounds[] = {
    {"exp2", 6, 5},    {"log2", 5, 5},    {"log10", 6, 5},   {"cbrt", 5, 5},
    {"arcsinh", 7, 7}, {"arccosh", 8, 7}, {"arctanh", 7, 6}, {"hypot", 7, 6},
};

// Where NumPy's sign of a zero result is not defined: max and min of +0 and -0.
constexpr std::string_view kZeroSignFree[] = {"maximum", "minimum", "fmax", "fmin", "clip"};

int64_t UlpBoundOf(std::string_view function, DType dtype) {
  for (const UlpBound& b : kUlpBounds) {
    if (b.function == function) return dtype == DType::kFloat32 ? b.float32 : b.float64;
  }
  return 0;
}

struct GoldenCase {
  std::string expression;
  std::vector<DType> arguments;
  DType result = DType::kBool;
  std::vector<std::vector<uint64_t>> columns;  // one per argument
  std::vector<uint64_t> expected;
  int line = 0;

  std::string function() const { return expression.substr(0, expression.find('(')); }
};

DType ParseDType(std::string_view name) {
  for (DType t : {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64}) {
    if (name == DTypeName(t)) return t;
  }
  ADD_FAILURE() << "unknown dtype " << name;
  return DType::kBool;
}

// $GPUCOMPUTE_TESTDATA_DIR when set, so that this program copied to a GPU host finds the
// file there; else the source tree's.
std::string TestdataDir() {
  const char* dir = std::getenv("GPUCOMPUTE_TESTDATA_DIR");
  return dir != nullptr && *dir != '\0' ? dir : GPUCOMPUTE_TESTDATA_DIR;
}

std::vector<GoldenCase> LoadGolden() {
  const std::string path = absl::StrCat(TestdataDir(), "/ufunc_special_values.txt");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<GoldenCase> cases;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("case ", 0) == 0) {
      // case <expression> <dtypes> -> <result>; the expression may contain spaces.
      const size_t arrow = line.rfind(" -> ");
      const size_t dtypes = line.rfind(' ', arrow - 1);
      GoldenCase c;
      c.expression = line.substr(5, dtypes - 5);
      std::istringstream names(line.substr(dtypes + 1, arrow - dtypes - 1));
      for (std::string d; std::getline(names, d, ',');) c.arguments.push_back(ParseDType(d));
      c.result = ParseDType(line.substr(arrow + 4));
      c.columns.resize(c.arguments.size());
      c.line = number;
      cases.push_back(std::move(c));
      continue;
    }
    EXPECT_FALSE(cases.empty()) << "line " << number << " before any case";
    if (cases.empty()) continue;
    GoldenCase& c = cases.back();
    std::istringstream fields(line);
    for (size_t k = 0; k <= c.columns.size(); ++k) {
      std::string hex;
      fields >> hex;
      const uint64_t v = std::strtoull(hex.c_str(), nullptr, 16);
      (k < c.columns.size() ? c.columns[k] : c.expected).push_back(v);
    }
  }
  return cases;
}

// Float bits as integers that order like the floats, so that adjacent floats differ by
// one; +0 and -0 both map to 0.
int64_t Ordered(DType t, uint64_t bits) {
  if (t == DType::kFloat32) {
    const auto i = static_cast<int32_t>(static_cast<uint32_t>(bits));
    return i < 0 ? int64_t{std::numeric_limits<int32_t>::min()} - i : i;
  }
  const auto i = static_cast<int64_t>(bits);
  return i < 0 ? std::numeric_limits<int64_t>::min() - i : i;
}

double AsDouble(DType t, uint64_t bits) {
  if (t == DType::kFloat32) return std::bit_cast<float>(static_cast<uint32_t>(bits));
  return std::bit_cast<double>(bits);
}

// Empty when `got` is acceptable for `want`, else why not.
std::string Mismatch(const GoldenCase& c, uint64_t got, uint64_t want) {
  if (!IsFloat(c.result)) return got == want ? "" : "not equal";
  const double g = AsDouble(c.result, got);
  const double w = AsDouble(c.result, want);
  if (std::isnan(w)) return std::isnan(g) ? "" : "not NaN";
  if (std::isnan(g)) return "NaN";
  if (g == 0 && w == 0) {
    const bool free = std::find(std::begin(kZeroSignFree), std::end(kZeroSignFree), c.function()) !=
                      std::end(kZeroSignFree);
    return free || std::signbit(g) == std::signbit(w) ? "" : "zero of the wrong sign";
  }
  if (std::isinf(w) || std::isinf(g)) return g == w ? "" : "not equal";
  const int64_t distance = std::abs(Ordered(c.result, got) - Ordered(c.result, want));
  const int64_t bound = UlpBoundOf(c.function(), c.result);
  if (distance <= bound) return "";
  return absl::StrCat(distance, " ulp apart, more than ", bound);
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

template <typename T>
absl::StatusOr<DeviceMemory> UploadColumn(Backend& backend, Stream& stream,
                                          const std::vector<uint64_t>& column) {
  std::vector<T> host(column.begin(), column.end());
  return Upload<T>(backend, stream, host);
}

absl::StatusOr<DeviceMemory> UploadBits(Backend& backend, Stream& stream, DType t,
                                        const std::vector<uint64_t>& column) {
  switch (DTypeSize(t)) {
    case 1:
      return UploadColumn<uint8_t>(backend, stream, column);
    case 4:
      return UploadColumn<uint32_t>(backend, stream, column);
    default:
      return UploadColumn<uint64_t>(backend, stream, column);
  }
}

template <typename T>
absl::StatusOr<std::vector<uint64_t>> DownloadColumn(Backend& backend, Stream& stream,
                                                     const DeviceMemory& mem, size_t n) {
  absl::StatusOr<std::vector<T>> host = Download<T>(backend, stream, mem, n);
  if (!host.ok()) return host.status();
  return std::vector<uint64_t>(host->begin(), host->end());
}

absl::StatusOr<std::vector<uint64_t>> DownloadBits(Backend& backend, Stream& stream, DType t,
                                                   const DeviceMemory& mem, size_t n) {
  switch (DTypeSize(t)) {
    case 1:
      return DownloadColumn<uint8_t>(backend, stream, mem, n);
    case 4:
      return DownloadColumn<uint32_t>(backend, stream, mem, n);
    default:
      return DownloadColumn<uint64_t>(backend, stream, mem, n);
  }
}

class UfuncSpecialValues : public BackendConformance {
 protected:
  void Check(const GoldenCase& c) {
    SCOPED_TRACE(absl::StrCat(c.expression, " of ", DTypeName(c.arguments[0]), " (line ", c.line,
                              " of the golden file)"));
    constexpr std::string_view kNames[] = {"x", "y", "z"};
    expr::InputMap inputs;
    for (size_t k = 0; k < c.arguments.size(); ++k) {
      inputs.emplace(std::string(kNames[k]), expr::ArrayInput{c.arguments[k]});
    }
    ASSIGN_OR_FAIL(const expr::Program program, expr::Compile(c.expression, inputs));
    ASSERT_EQ(DTypeName(program.result_dtype()), DTypeName(c.result)) << program.canonical();
    const size_t n = c.expected.size();
    if (n == 0) return;
    std::vector<DeviceMemory> arrays(c.arguments.size());
    std::vector<const DeviceMemory*> bound;
    for (size_t k = 0; k < c.arguments.size(); ++k) {
      ASSIGN_OR_FAIL(arrays[k], UploadBits(backend(), stream(), c.arguments[k], c.columns[k]));
    }
    // program.inputs() is sorted, and so are x, y, z.
    for (const DeviceMemory& a : arrays) bound.push_back(&a);
    ASSIGN_OR_FAIL(DeviceMemory out, backend().Allocate(0, n * DTypeSize(c.result)));
    ASSERT_OK(backend()
                  .Elementwise(stream(), program, bound, out, c.result, static_cast<int64_t>(n))
                  .status());
    ASSIGN_OR_FAIL(const std::vector<uint64_t> got,
                   DownloadBits(backend(), stream(), c.result, out, n));
    int reported = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::string why = Mismatch(c, got[i], c.expected[i]);
      if (why.empty()) continue;
      std::string arguments;
      for (const auto& column : c.columns) absl::StrAppend(&arguments, " ", Hex(column[i]));
      ADD_FAILURE() << c.expression << " of" << arguments << " (" << DTypeName(c.arguments[0])
                    << "): got " << Hex(got[i]) << ", NumPy gives " << Hex(c.expected[i]) << ": "
                    << why;
      if (++reported == 5) break;  // enough to see the pattern
    }
  }
};

TEST_P(UfuncSpecialValues, MatchNumPyWithinTheStatedBounds) {
  const std::vector<GoldenCase> cases = LoadGolden();
  ASSERT_GT(cases.size(), 100u);
  for (const GoldenCase& c : cases) Check(c);
}

// The golden file reaches every function of the table and every dtype of each.
TEST(UfuncGolden, CoversEveryFunctionAndItsDtypes) {
  std::map<std::string, std::vector<std::string>> seen;
  for (const GoldenCase& c : LoadGolden()) {
    seen[c.expression].push_back(DTypeName(c.arguments[0]));
  }
  for (const UlpBound& b : kUlpBounds) {
    EXPECT_EQ(seen[absl::StrCat(std::string(b.function), b.function == "hypot" ? "(x, y)" : "(x)")]
                  .size(),
              4u)
        << b.function;
  }
  for (const char* f : {"floor_divide(x, y)", "remainder(x, y)", "fmod(x, y)", "sign(x)",
                        "round(x, -1)", "clip(x, y, z)", "reciprocal(x)"}) {
    EXPECT_EQ(seen[f].size(), 4u) << f;
  }
  for (const char* f : {"isnan(x)", "logical_not(x)", "maximum(x, y)", "fmin(x, y)", "int32(x)"}) {
    EXPECT_EQ(seen[f].size(), 5u) << f;
  }
  EXPECT_EQ(seen["left_shift(x, y)"], (std::vector<std::string>{"int32", "int64"}));
  EXPECT_EQ(seen["bitwise_xor(x, y)"], (std::vector<std::string>{"bool", "int32", "int64"}));
}

INSTANTIATE_TEST_SUITE_P(Cpu, UfuncSpecialValues,
                         ::testing::Values(BackendFactory{
                             "TwoThreads", [] { return std::make_unique<cpu::CpuBackend>(2); }}),
                         BackendFactoryName);

#if defined(GPUCOMPUTE_HAVE_CUDA)
INSTANTIATE_TEST_SUITE_P(Cuda, UfuncSpecialValues,
                         ::testing::Values(BackendFactory{"Gpu", MaybeCreateCudaBackend}),
                         BackendFactoryName);
#endif

}  // namespace
}  // namespace gpucompute::conformance

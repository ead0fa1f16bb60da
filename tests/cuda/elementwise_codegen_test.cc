// The CUDA elementwise code generator and the NVRTC compiler, without a GPU: every OpKind
// at every dtype it accepts, every kind of scalar parameter, literal edge values and output
// conversions must generate source that NVRTC compiles for sm_90; the disk cache must
// hit, reject damaged files and survive an unusable directory; the source must not depend
// on scalar values; and the text around the per-element function is checked exactly.
// NVRTC runs about 35 times in all: the cases batch many operations into few expressions.
#include "server/cuda/elementwise_codegen.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cuda/elementwise_kernels.h"
#include "server/cuda/nvrtc_compiler.h"
#include "server/expression/expression.h"
#include "server/expression/ir.h"
#include "tests/support/test_util.h"

namespace gpucompute::cuda {
namespace {

using expr::ArrayInput;
using expr::InputMap;
using expr::OpKind;
using expr::Program;
using expr::ScalarInput;

constexpr int kArch = 90;

InputMap AllInputs() {
  return {
      {"f", ArrayInput{DType::kFloat32}},        {"g", ArrayInput{DType::kFloat32}},
      {"d", ArrayInput{DType::kFloat64}},        {"e", ArrayInput{DType::kFloat64}},
      {"i", ArrayInput{DType::kInt32}},          {"j", ArrayInput{DType::kInt32}},
      {"l", ArrayInput{DType::kInt64}},          {"m", ArrayInput{DType::kInt64}},
      {"b", ArrayInput{DType::kBool}},           {"c", ArrayInput{DType::kBool}},
      {"sf", ScalarInput{DType::kFloat64, 2.5}}, {"si", ScalarInput{DType::kInt64, 0, 3}},
      {"sb", ScalarInput{DType::kBool, 0, 1}},
  };
}

// Binds only the inputs that `text` mentions (an unused input is a compile error).
InputMap InputsFor(std::string_view text) {
  auto is_name_char = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
  };
  InputMap used;
  for (const auto& [name, type] : AllInputs()) {
    for (size_t pos = text.find(name); pos != std::string_view::npos;
         pos = text.find(name, pos + 1)) {
      const size_t end = pos + name.size();
      if ((pos == 0 || !is_name_char(text[pos - 1])) &&
          (end == text.size() || !is_name_char(text[end]))) {
        used.emplace(name, type);
        break;
      }
    }
  }
  return used;
}

Program MustCompile(std::string_view text, const InputMap& inputs) {
  absl::StatusOr<Program> program = expr::Compile(text, inputs);
  EXPECT_OK(program) << text;
  return program.ok() ? *program : *expr::Compile("0", {});
}

Program MustCompile(std::string_view text) { return MustCompile(text, InputsFor(text)); }

std::string Repeat(const std::string& what, int count, const std::string& separator) {
  std::vector<std::string> parts(count, what);
  return absl::StrJoin(parts, separator);
}

// Every comparison of x and y, folded into one bool with min (and) and max (or).
std::string AllComparisons(const std::string& x, const std::string& y) {
  return absl::StrCat("max(max(", x, " < ", y, ", ", x, " <= ", y, "), max(min(", x, " > ", y, ", ",
                      x, " >= ", y, "), min(", x, " == ", y, ", ", x, " != ", y, ")))");
}

struct Case {
  std::string name;
  std::string text;
  // The output dtype; kBool..kFloat64, or -1 for the program's result dtype.
  int out = -1;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string UnaryAll(const std::string& x) {
  std::vector<std::string> terms;
  for (const char* fn : {"sin", "cos", "tan", "exp", "log", "log1p", "expm1", "sqrt", "tanh",
                         "sinh", "cosh", "asin", "acos", "atan", "floor", "ceil", "abs"}) {
    terms.push_back(absl::StrCat(fn, "(", x, ")"));
  }
  terms.push_back(absl::StrCat("(-", x, ")"));
  return absl::StrJoin(terms, " + ");
}

std::string BinaryAll(const std::string& x, const std::string& y, bool is_float) {
  std::string text =
      absl::StrCat(x, " + ", y, " - ", x, " * ", y, " + ", x, " ** ", y, " - pow(", y, ", ", x,
                   ") + min(", x, ", ", y, ") * max(", x, ", ", y, ") + (-", x, ") - abs(", y, ")");
  if (is_float) absl::StrAppend(&text, " + ", x, " / ", y, " + atan2(", x, ", ", y, ")");
  return text;
}

// The float functions added with NumPy's names, and those of sign, square and reciprocal.
std::string UfuncsFloat(const std::string& x) {
  std::vector<std::string> terms;
  for (const char* fn : {"rint", "trunc", "exp2", "log2", "log10", "cbrt", "degrees", "radians",
                         "arcsinh", "arccosh", "arctanh", "sign", "square", "reciprocal"}) {
    terms.push_back(absl::StrCat(fn, "(", x, ")"));
  }
  return absl::StrJoin(terms, " + ");
}

// Division, remainders, fmin/fmax and, for integers, shifts and bitwise operators.
std::string UfuncsBinary(const std::string& x, const std::string& y, bool is_float) {
  std::string text = absl::StrCat(x, " // ", y, " + ", x, " % ", y, " + fmod(", x, ", ", y,
                                  ") + fmax(", x, ", ", y, ") - fmin(", x, ", ", y, ")");
  if (is_float) {
    absl::StrAppend(&text, " + hypot(", x, ", ", y, ") + copysign(", x, ", ", y, ")");
  } else {
    absl::StrAppend(&text, " + (", x, " << ", y, ") + (", x, " >> ", y, ") + (", x, " & ", y,
                    ") + (", x, " | ", y, ") + (", x, " ^ ", y, ") + ~", x, " + sign(", x,
                    ") + square(", x, ") + reciprocal(", x, ")");
  }
  return text;
}

// The float tests of every dtype, or-ed together.
std::string FloatTests() {
  std::vector<std::string> terms;
  for (const char* x : {"b", "i", "l", "f", "d"}) {
    for (const char* fn : {"isnan", "isinf", "isfinite", "signbit"}) {
      terms.push_back(absl::StrCat(fn, "(", x, ")"));
    }
  }
  return absl::StrJoin(terms, " | ");
}

int Out(DType t) { return static_cast<int>(t); }

std::vector<Case> Cases() {
  const std::string comparisons =
      absl::StrCat("max(max(", AllComparisons("f", "g"), ", ", AllComparisons("d", "e"),
                   "), max(max(", AllComparisons("i", "j"), ", ", AllComparisons("l", "m"), "), ",
                   AllComparisons("b", "c"), "))");
  return {
      {"UnaryFloat32", UnaryAll("f"), Out(DType::kFloat64)},
      {"UnaryFloat64", UnaryAll("d"), Out(DType::kFloat32)},
      {"BinaryFloat32", BinaryAll("f", "g", true)},
      {"BinaryFloat64", BinaryAll("d", "e", true)},
      {"Int32", BinaryAll("i", "j", false), Out(DType::kInt64)},
      {"Int64", BinaryAll("l", "m", false), Out(DType::kFloat32)},
      {"Int64ToInt32", BinaryAll("l", "m", false), Out(DType::kInt32)},
      {"UfuncsFloat32", UfuncsFloat("f")},
      {"UfuncsFloat64", UfuncsFloat("d")},
      {"UfuncsBinaryFloat32", UfuncsBinary("f", "g", true)},
      {"UfuncsBinaryFloat64", UfuncsBinary("d", "e", true)},
      {"UfuncsInt32", UfuncsBinary("i", "j", false)},
      {"UfuncsInt64", UfuncsBinary("l", "m", false)},
      {"UfuncsBool",
       "logical_and(b, c) | logical_or(b, c) ^ logical_xor(b, c) & (b & c) | fmax(b, c) | "
       "fmin(b, c) | logical_not(b) | ~c | logical_not(d)"},
      {"FloatTestsEveryDtype", FloatTests()},
      {"ComparisonsEveryDtype", comparisons},
      {"ComparisonsToInt32", AllComparisons("f", "g"), Out(DType::kInt32)},
      {"BoolMinMax", "max(min(b, c), b == c)"},
      // where at every dtype, with a bool and a non-bool condition; the sum promotes every
      // branch type to float64 (casts from bool, int32, int64 and float32).
      {"WhereEveryDtype",
       "where(b, f, g) + where(c, d, e) + where(b, i, j) + where(c, l, m) + where(b, c, b) + "
       "where(i, f, g)",
       Out(DType::kBool)},
      {"Promotions",
       "(b + i) * (i + l) + (b + l) + (b + f) + (b + d) + (i + f) + (l + d) + (f + d) + i / j + "
       "sin(i) + sqrt(l)",
       Out(DType::kInt64)},
      {"Float32ToInt32", "f * g", Out(DType::kInt32)},
      {"Float64ToInt64Saturating", "d", Out(DType::kInt64)},
      {"BoolToFloat32", "f < g", Out(DType::kFloat32)},
      {"BoolToFloat64", "b", Out(DType::kFloat64)},
      {"BoolToInt64", "b", Out(DType::kInt64)},
      {"Int32ToFloat32", "i * j", Out(DType::kFloat32)},
      {"Int32ToFloat64", "i - j", Out(DType::kFloat64)},
      {"Int32ToBool", "i + j", Out(DType::kBool)},
      {"Int64ToFloat64", "l", Out(DType::kFloat64)},
      // Parameters of every dtype: bool (a where condition and a max operand), int32,
      // int64, float32 (from a float and from an int scalar) and float64.
      {"ParametersEveryDtype",
       "where(sb, f * sf + si, g) + d * sf + i * si + (l - si) + max(b, sb)"},
      {"Axpy", "sf * f + g"},
      // Literals: float32 0.1 and a subnormal, float64 subnormal, +-inf and NaN of both
      // widths, -0.0, the most negative and largest integers, a bool.
      {"Literals",
       "where(b, f + 0.1, f * 1e-45) + (d * 5e-324 + 1e400) + (e - 1e400) + "
       "(1e400 - 1e400) * d + f * (1e400 - 1e400) + (f + 1e400) + -0.0 * f + "
       "(l + (-9223372036854775807 - 1)) + (l * 9223372036854775807) + "
       "(i + (-2147483647 - 1)) + (i - 2147483647) + max(b, True) + 0.1 * d"},
      {"ConstantOnly", "2.5 * 4"},
      {"ParameterOnly", "sf * 2"},
      // Mixed widths: one byte and eight bytes per element in the same pack.
      {"MixedWidths", "where(b, d, e) > l"},
      {"DeepChain", Repeat("f", 1000, " + ")},
      {"ReferenceFloat32", "sqrt(abs(exp(-sin(f*f)) / (sqrt(abs(f))*tanh(f))))"},
      {"ReferenceFloat64", "sqrt(abs(exp(-sin(d*d)) / (sqrt(abs(d))*tanh(d))))"},
  };
}

Case CaseNamed(std::string_view name) {
  for (const Case& c : Cases()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no case " << name;
  return {};
}

DType OutDtype(const Case& c, const Program& p) {
  return c.out < 0 ? p.result_dtype() : static_cast<DType>(c.out);
}

NvrtcCompiler& SharedCompiler() {
  static NvrtcCompiler* compiler = new NvrtcCompiler("");
  return *compiler;
}

class CompileTest : public ::testing::TestWithParam<Case> {};

TEST_P(CompileTest, GeneratesSourceThatNvrtcCompiles) {
  const Case& c = GetParam();
  const Program program = MustCompile(c.text);
  const ElementwiseSource generated = GenerateElementwise(program, OutDtype(c, program));
  EXPECT_EQ(generated.source.find("#include"), std::string::npos);
  EXPECT_EQ(generated.source.find('@'), std::string::npos);  // every placeholder filled
  EXPECT_NE(generated.source.find(
                absl::StrCat("void __launch_bounds__(256)\n", generated.vector_kernel, "(")),
            std::string::npos);
  EXPECT_NE(generated.source.find(absl::StrCat(generated.scalar_kernel, "(")), std::string::npos);
  bool from_cache = true;
  absl::StatusOr<std::string> cubin =
      SharedCompiler().Compile(generated.source, kArch, &from_cache);
  ASSERT_OK(cubin) << "\n" << generated.source;
  EXPECT_FALSE(from_cache);
  // An ELF image.
  ASSERT_GE(cubin->size(), 4u);
  EXPECT_EQ(cubin->substr(0, 4),
            "\x7f"
            "ELF");
}

INSTANTIATE_TEST_SUITE_P(Expressions, CompileTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// The cases above reach every OpKind at every dtype the IR allows for it, every parameter
// and literal dtype, every cast the type checker inserts and the output conversions named
// here. Checked on the IR, so that a change to the cases cannot silently drop coverage.
TEST(CodegenCoverageTest, CasesCoverEveryOpAndDtype) {
  std::set<std::pair<OpKind, DType>> ops;  // (op, operand dtype; node dtype for leaves)
  std::set<std::pair<DType, DType>> casts;
  std::set<std::pair<DType, DType>> outputs;
  std::set<DType> parameters;
  std::set<DType> literals;
  for (const Case& c : Cases()) {
    const Program program = MustCompile(c.text);
    const expr::Ir& ir = program.ir();
    outputs.insert({program.result_dtype(), OutDtype(c, program)});
    for (const expr::Node& node : ir.nodes) {
      if (node.op == OpKind::kConstant) {
        (node.parameter >= 0 ? parameters : literals).insert(node.dtype);
      }
      if (node.op == OpKind::kCast) casts.insert({ir.nodes[node.args[0]].dtype, node.dtype});
      const DType operand = node.op == OpKind::kWhere ? node.dtype
                            : node.num_args > 0       ? ir.nodes[node.args[0]].dtype
                                                      : node.dtype;
      ops.insert({node.op, operand});
    }
  }
  const std::vector<DType> all = {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32,
                                  DType::kFloat64};
  const std::vector<DType> numbers = {DType::kInt32, DType::kInt64, DType::kFloat32,
                                      DType::kFloat64};
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat64};
  auto expect_op = [&](OpKind op, const std::vector<DType>& dtypes) {
    for (DType t : dtypes) {
      EXPECT_TRUE(ops.count({op, t})) << expr::OpName(op) << "<" << DTypeName(t) << ">";
    }
  };
  const std::vector<DType> ints = {DType::kInt32, DType::kInt64};
  const std::vector<DType> ints_and_bool = {DType::kBool, DType::kInt32, DType::kInt64};
  const std::vector<DType> bools = {DType::kBool};
  // A switch without a default, so that a new OpKind is a compiler warning here until it
  // is given its dtypes (and cases that reach them).
  auto operand_dtypes = [&](OpKind op) -> const std::vector<DType>& {
    switch (op) {
      case OpKind::kInput:
      case OpKind::kConstant:
      case OpKind::kIndex:
      case OpKind::kCast:
      case OpKind::kMin:
      case OpKind::kMax:
      case OpKind::kFmin:
      case OpKind::kFmax:
      case OpKind::kIsNan:
      case OpKind::kIsInf:
      case OpKind::kIsFinite:
      case OpKind::kSignbit:
      case OpKind::kLess:
      case OpKind::kLessEqual:
      case OpKind::kGreater:
      case OpKind::kGreaterEqual:
      case OpKind::kEqual:
      case OpKind::kNotEqual:
      case OpKind::kWhere:
        return all;
      case OpKind::kNeg:
      case OpKind::kAbs:
      case OpKind::kSign:
      case OpKind::kSquare:
      case OpKind::kReciprocal:
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kPow:
      case OpKind::kFloorDiv:
      case OpKind::kMod:
      case OpKind::kFmod:
        return numbers;
      case OpKind::kSin:
      case OpKind::kCos:
      case OpKind::kTan:
      case OpKind::kExp:
      case OpKind::kLog:
      case OpKind::kLog1p:
      case OpKind::kExpm1:
      case OpKind::kSqrt:
      case OpKind::kTanh:
      case OpKind::kSinh:
      case OpKind::kCosh:
      case OpKind::kAsin:
      case OpKind::kAcos:
      case OpKind::kAtan:
      case OpKind::kFloor:
      case OpKind::kCeil:
      case OpKind::kRint:
      case OpKind::kTrunc:
      case OpKind::kExp2:
      case OpKind::kLog2:
      case OpKind::kLog10:
      case OpKind::kCbrt:
      case OpKind::kDegrees:
      case OpKind::kRadians:
      case OpKind::kAsinh:
      case OpKind::kAcosh:
      case OpKind::kAtanh:
      case OpKind::kDiv:
      case OpKind::kAtan2:
      case OpKind::kHypot:
      case OpKind::kCopysign:
        return floats;
      case OpKind::kInvert:
      case OpKind::kBitAnd:
      case OpKind::kBitOr:
      case OpKind::kBitXor:
        return ints_and_bool;
      case OpKind::kLeftShift:
      case OpKind::kRightShift:
        return ints;
      case OpKind::kLogicalNot:
      case OpKind::kLogicalAnd:
      case OpKind::kLogicalOr:
      case OpKind::kLogicalXor:
        return bools;
    }
    return all;
  };
  for (int op = 0; op < expr::kNumOpKinds; ++op) {
    const auto kind = static_cast<OpKind>(op);
    if (kind == OpKind::kCast) continue;  // checked below, pair by pair
    // Never generated: the backend reads index() as an input (expr::IndexAsInputs).
    if (kind == OpKind::kIndex) continue;
    expect_op(kind, operand_dtypes(kind));
  }
  for (DType t : all) {
    EXPECT_TRUE(parameters.count(t)) << "parameter " << DTypeName(t);
    EXPECT_TRUE(literals.count(t)) << "literal " << DTypeName(t);
  }
  // Every widening the type checker performs.
  for (auto [from, to] : std::vector<std::pair<DType, DType>>{{DType::kBool, DType::kInt32},
                                                              {DType::kBool, DType::kInt64},
                                                              {DType::kBool, DType::kFloat32},
                                                              {DType::kBool, DType::kFloat64},
                                                              {DType::kInt32, DType::kInt64},
                                                              {DType::kInt32, DType::kFloat64},
                                                              {DType::kInt64, DType::kFloat64},
                                                              {DType::kFloat32, DType::kFloat64}}) {
    EXPECT_TRUE(casts.count({from, to})) << "cast " << DTypeName(from) << "->" << DTypeName(to);
  }
  // Output conversions: every same_kind cast, plus float -> int (saturating) and -> bool
  // (outside same_kind, but the generator must still follow ops::Convert).
  for (DType from : all) {
    for (DType to : all) {
      const bool wanted = (expr::CanCastSameKind(from, to) && from != to) ||
                          (from == DType::kFloat32 && to == DType::kInt32) ||
                          (from == DType::kFloat64 && to == DType::kInt64) ||
                          (from == DType::kInt32 && to == DType::kBool) ||
                          (from == DType::kFloat64 && to == DType::kBool);
      if (!wanted) continue;
      EXPECT_TRUE(outputs.count({from, to}))
          << "output " << DTypeName(from) << "->" << DTypeName(to);
    }
  }
}

// ---- what the source says ----

TEST(CodegenSourceTest, AxpyShape) {
  const Program program = MustCompile("sf * f + g");
  const ElementwiseSource generated = GenerateElementwise(program, DType::kFloat32);
  const ElementwiseSignature& sig = generated.signature;
  // inputs() is sorted: f, g, sf.
  EXPECT_EQ(sig.array_inputs, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(sig.array_dtypes, (std::vector<DType>{DType::kFloat32, DType::kFloat32}));
  EXPECT_EQ(sig.parameter_dtypes, (std::vector<DType>{DType::kFloat32}));
  EXPECT_EQ(sig.out_dtype, DType::kFloat32);
  EXPECT_EQ(sig.elements_per_pack, 4);
  EXPECT_EQ(sig.packs_per_thread, 2);
  EXPECT_EQ(sig.threads_per_block, 256);
  EXPECT_EQ(sig.argument_bytes, 8 * 4 + 4);
  const std::string& src = generated.source;
  EXPECT_NE(src.find("const float* in0, const float* in1, float* out, gc::i64 n, float p0"),
            std::string::npos)
      << src;
  // Explicitly rounded, so that --fmad=true never fuses the product into the sum.
  EXPECT_NE(src.find("__fmul_rn(p0, x0)"), std::string::npos) << src;
  EXPECT_NE(src.find("__fadd_rn(v0, x1)"), std::string::npos) << src;
  EXPECT_EQ(src.find("__restrict__"), std::string::npos);  // out may alias an input
  EXPECT_EQ(src.find("fma"), std::string::npos);
}

// The kernels around the per-element function, for a mix of widths and a bool input and
// output: one 16-byte word of bools and eight of each 8-byte array per pack. The kernel
// template (kernels/cuda/elementwise/contiguous.cuh.in) and the server's body together
// must give exactly this text.
TEST(CodegenSourceTest, MixedWidthsSourceText) {
  const std::string source =
      GenerateElementwise(MustCompile(CaseNamed("MixedWidths").text), DType::kBool).source;
  EXPECT_EQ(source.substr(0, source.find("\n//   ")),
            "// Generated by gpucompute (server/cuda/elementwise_codegen.cc) for");
  // The helpers follow the two comment lines, without the comment of their file.
  const size_t helpers = source.find("\nnamespace gc {\n");
  ASSERT_NE(helpers, std::string::npos) << source;
  EXPECT_EQ(source.find('\n', source.find('\n') + 1), helpers);
  const size_t element = source.find("namespace {\n");
  ASSERT_NE(element, std::string::npos) << source;
  EXPECT_EQ(source.substr(element), R"gold(namespace {
__device__ __forceinline__ bool Element(bool x0, double x1, double x2, gc::i64 x3) {
  const double v0 = (x0 ? x1 : x2);
  const double v1 = static_cast<double>(x3);
  const bool v2 = (v0 > v1);
  return v2;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(256)
gpucompute_elementwise_vector(const gc::u8* in0, const double* in1, const double* in2, const gc::i64* in3, gc::u8* out, gc::i64 n) {
  constexpr int kV = 16;  // elements per pack: 16 bytes of the narrowest array
  constexpr int kPacks = 1;  // packs per thread per iteration
  const gc::i64 packs = n / kV;
  const gc::i64 first = (gc::i64)blockIdx.x * blockDim.x + threadIdx.x;
  const gc::i64 stride = (gc::i64)gridDim.x * blockDim.x;
  for (gc::i64 base = first; base < packs; base += stride * kPacks) {
    gc::Pack<gc::u8, 1> a0[kPacks] = {};
    gc::Pack<double, 8> a1[kPacks] = {};
    gc::Pack<double, 8> a2[kPacks] = {};
    gc::Pack<gc::i64, 8> a3[kPacks] = {};
    gc::Pack<gc::u8, 1> r[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const gc::i64 pack = base + j * stride;
      if (pack < packs) {
#pragma unroll
        for (int w = 0; w < 1; ++w) a0[j].q[w] = reinterpret_cast<const uint4*>(in0)[pack * 1 + w];
#pragma unroll
        for (int w = 0; w < 8; ++w) a1[j].q[w] = reinterpret_cast<const uint4*>(in1)[pack * 8 + w];
#pragma unroll
        for (int w = 0; w < 8; ++w) a2[j].q[w] = reinterpret_cast<const uint4*>(in2)[pack * 8 + w];
#pragma unroll
        for (int w = 0; w < 8; ++w) a3[j].q[w] = reinterpret_cast<const uint4*>(in3)[pack * 8 + w];
      }
    }
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
#pragma unroll
      for (int e = 0; e < kV; ++e) r[j].e[e] = static_cast<gc::u8>(Element((a0[j].e[e] != 0), a1[j].e[e], a2[j].e[e], a3[j].e[e]));
    }
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const gc::i64 pack = base + j * stride;
      if (pack < packs) {
#pragma unroll
        for (int w = 0; w < 1; ++w) reinterpret_cast<uint4*>(out)[pack * 1 + w] = r[j].q[w];
      }
    }
  }
  // The last n % kV elements, one per thread.
  if (first < n - packs * kV) {
    const gc::i64 i = packs * kV + first;
    out[i] = static_cast<gc::u8>(Element((in0[i] != 0), in1[i], in2[i], in3[i]));
  }
}

extern "C" __global__ void __launch_bounds__(256)
gpucompute_elementwise_scalar(const gc::u8* in0, const double* in1, const double* in2, const gc::i64* in3, gc::u8* out, gc::i64 n) {
  const gc::i64 stride = (gc::i64)gridDim.x * blockDim.x;
  for (gc::i64 i = (gc::i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<gc::u8>(Element((in0[i] != 0), in1[i], in2[i], in3[i]));
  }
}
)gold");
}

TEST(CodegenSourceTest, PackWidthFollowsTheNarrowestArray) {
  {
    // bool output with float64 inputs: 16 elements per pack, 8 words per float64 array.
    const ElementwiseSource g = GenerateElementwise(MustCompile("d < e"), DType::kBool);
    EXPECT_EQ(g.signature.elements_per_pack, 16);
    EXPECT_EQ(g.signature.packs_per_thread, 1);  // 256 bytes of loads per pack already
    EXPECT_NE(g.source.find("gc::Pack<double, 8> a0[kPacks]"), std::string::npos) << g.source;
    EXPECT_NE(g.source.find("gc::Pack<gc::u8, 1> r[kPacks]"), std::string::npos) << g.source;
  }
  {
    const ElementwiseSource g = GenerateElementwise(MustCompile("d + e"), DType::kFloat64);
    EXPECT_EQ(g.signature.elements_per_pack, 2);
    EXPECT_EQ(g.signature.packs_per_thread, 2);
  }
  {
    // Math-library calls make it compute-bound: one pack, and fewer registers.
    const ElementwiseSource g = GenerateElementwise(
        MustCompile("sqrt(abs(exp(-sin(f*f)) / (sqrt(abs(f))*tanh(f))))"), DType::kFloat32);
    EXPECT_EQ(g.signature.elements_per_pack, 4);
    EXPECT_EQ(g.signature.packs_per_thread, 1);
    EXPECT_NE(g.source.find("kPacks = 1;"), std::string::npos) << g.source;
  }
  {
    // No arrays at all: the output alone sets the width.
    const ElementwiseSource g = GenerateElementwise(MustCompile("sf * 2"), DType::kFloat64);
    EXPECT_TRUE(g.signature.array_inputs.empty());
    EXPECT_EQ(g.signature.elements_per_pack, 2);
  }
}

TEST(CodegenSourceTest, LiteralsAreExact) {
  const Program program = MustCompile(CaseNamed("Literals").text);
  const std::string generated = GenerateElementwise(program, program.result_dtype()).source;
  // The code, without the comment that repeats canonical() (which spells inf and nan).
  const std::string src = generated.substr(generated.find("namespace gc"));
  for (std::string_view expected : {
           "(0x1.99999ap-4f)",                                        // 0.1 as float32
           "(0x1.999999999999ap-4)",                                  // 0.1 as float64
           "(0x1p-149f)",                                             // 1e-45 as float32
           "(0x0.0000000000001p-1022)",                               // 5e-324
           "__longlong_as_double((long long)0x7ff0000000000000ull)",  // inf
           "__int_as_float((int)0x7f800000u)",                        // float32 inf
           "(-0x0p+0f)",                                              // -0.0
           "(-9223372036854775807ll - 1)",                            // int64 min
           "(9223372036854775807ll)",                                 // int64 max
           "(-2147483647 - 1)",                                       // int32 min
           "(2147483647)",                                            // int32 max
           "true",
       }) {
    EXPECT_NE(src.find(expected), std::string::npos) << expected << "\n" << src;
  }
  // NaN literals (of each width) by their bits, never as text that could round.
  EXPECT_NE(src.find("__longlong_as_double((long long)0x"), std::string::npos);
  EXPECT_EQ(src.find("nan"), std::string::npos);
  EXPECT_EQ(src.find("inf"), std::string::npos);
}

TEST(CodegenSourceTest, SourceDependsOnlyOnCanonicalAndOutDtype) {
  InputMap a = InputsFor("sf * f + g + si");
  InputMap b = a;
  b["sf"] = ScalarInput{DType::kFloat64, -1234.5};
  b["si"] = ScalarInput{DType::kInt64, 0, 77};
  const Program pa = MustCompile("sf * f + g + si", a);
  const Program pb = MustCompile("sf * f + g + si", b);
  ASSERT_EQ(pa.canonical(), pb.canonical());
  const std::string sa = GenerateElementwise(pa, DType::kFloat32).source;
  EXPECT_EQ(sa, GenerateElementwise(pb, DType::kFloat32).source);
  // No scalar value is baked in.
  EXPECT_EQ(sa.find("0x1.4p+1"), std::string::npos);     // 2.5
  EXPECT_EQ(sa.find("0x1.349p+10"), std::string::npos);  // 1234.5
  EXPECT_EQ(sa.find("(3)"), std::string::npos);
  EXPECT_NE(sa, GenerateElementwise(pa, DType::kFloat64).source);

  // Different text, same canonical form, same source.
  const Program pc = MustCompile("((sf * f) + (g)) + si", a);
  ASSERT_EQ(pa.canonical(), pc.canonical());
  EXPECT_EQ(sa, GenerateElementwise(pc, DType::kFloat32).source);
}

TEST(CodegenSourceTest, CommonSubexpressionsAreComputedOnce) {
  const Program program = MustCompile("sin(f * g) + sin(f * g) * sin(f * g)");
  const std::string src = GenerateElementwise(program, DType::kFloat32).source;
  size_t count = 0;
  for (size_t pos = src.find("sinf("); pos != std::string::npos; pos = src.find("sinf(", pos + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << src;
}

TEST(CodegenSourceTest, DeepChainsDoNotRecurse) {
  // 20000 nested additions: generation must not overflow the stack (not compiled here).
  const std::string text = Repeat("f", 20000, "+");
  const Program program = MustCompile(text);
  const ElementwiseSource generated = GenerateElementwise(program, DType::kFloat32);
  EXPECT_NE(generated.source.find("v19998"), std::string::npos);
}

// ---- the compiler and its disk cache ----

std::string TempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    absl::StrCat("gpucompute_nvrtc_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::string AxpySource(const std::string& extra = "") {
  return GenerateElementwise(MustCompile(absl::StrCat("sf * f + g", extra)), DType::kFloat32)
      .source;
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary (55, 56, 64 bytes) differ from each other.
  EXPECT_NE(Sha256Hex(std::string(55, 'x')), Sha256Hex(std::string(56, 'x')));
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

// The whole source of one expression, pinned: the text is the key of every kernel in the
// disk cache, so a change to it (the helpers, the template, or the generator) recompiles
// every kernel once. Update the digest only for a deliberate change to the generated code.
TEST(CodegenSourceTest, AxpySourceDigest) {
  EXPECT_EQ(Sha256Hex(AxpySource()),
            "c4590bc1cf184cb72a636ce30ddd2f8757344395b57561b3bfb9dff75f946939");
}

// NVRTC's defaults (IEEE division and square root, --fmad=true): no fast-math flag, and no
// --fmad=false either, which would slow the math library down (the generated arithmetic
// is kept uncontracted by its rounded intrinsics instead).
TEST(NvrtcCompilerTest, OptionsAreTheIeeeDefaults) {
  const std::vector<std::string> options = NvrtcCompiler::Options(90);
  EXPECT_EQ(options, (std::vector<std::string>{"--gpu-architecture=sm_90", "-std=c++17"}));
}

// Every float operator of the expression's own arithmetic is a rounded intrinsic, in
// both precisions; no plain + - * / between float values is left for contraction.
TEST(CodegenSourceTest, FloatArithmeticIsExplicitlyRounded) {
  const Program program = MustCompile("sqrt(f * g + f / g - f) + sqrt(d * e + d / e - d)");
  const std::string generated = GenerateElementwise(program, DType::kFloat64).source;
  const std::string element = generated.substr(generated.find("Element("));
  const std::string body = element.substr(0, element.find("\n}"));
  for (std::string_view expected :
       {"__fmul_rn(", "__fdiv_rn(", "__fadd_rn(", "__fsub_rn(", "__fsqrt_rn(", "__dmul_rn(",
        "__ddiv_rn(", "__dadd_rn(", "__dsub_rn(", "__dsqrt_rn("}) {
    EXPECT_NE(body.find(expected), std::string::npos) << expected << "\n" << body;
  }
  for (std::string_view plain : {" + ", " - ", " * ", " / "}) {
    EXPECT_EQ(body.find(plain), std::string::npos) << "'" << plain << "'\n" << body;
  }
}

TEST(NvrtcCompilerTest, UnsupportedArchitectureIsFailedPrecondition) {
  NvrtcCompiler compiler("");
  absl::StatusOr<std::string> cubin = compiler.Compile(AxpySource(), 11);
  EXPECT_EQ(cubin.status().code(), absl::StatusCode::kFailedPrecondition) << cubin.status();
  EXPECT_EQ(compiler.nvrtc_compilations(), 0);
}

TEST(NvrtcCompilerTest, CompileErrorIsInternalWithTheLog) {
  NvrtcCompiler compiler("");
  absl::StatusOr<std::string> cubin =
      compiler.Compile("extern \"C\" __global__ void k() { undeclared_name = 1; }", kArch);
  ASSERT_EQ(cubin.status().code(), absl::StatusCode::kInternal) << cubin.status();
  EXPECT_NE(cubin.status().message().find("undeclared_name"), std::string::npos) << cubin.status();
  EXPECT_NE(cubin.status().message().find("-std=c++17"), std::string::npos);  // the options
}

TEST(NvrtcCompilerTest, DiskCacheHitsCorruptionAndTruncationAreRecompiled) {
  const std::string dir = TempDir("cache") + "/nested/dir";  // created on first write
  const std::string source = AxpySource();

  NvrtcCompiler first(dir);
  bool from_cache = true;
  absl::StatusOr<std::string> cubin = first.Compile(source, kArch, &from_cache);
  ASSERT_OK(cubin);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(first.nvrtc_compilations(), 1);
  const std::string path = first.CachePath(source, kArch);
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir));
  EXPECT_EQ(std::filesystem::path(path).filename().string().size(), 64u + 6u);  // hex + .cubin
  EXPECT_NE(first.CachePath(source, 80), path);
  EXPECT_NE(first.CachePath(source + " ", kArch), path);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);

  // A second compiler (a restarted server) hits the file without compiling.
  NvrtcCompiler second(dir);
  absl::StatusOr<std::string> again = second.Compile(source, kArch, &from_cache);
  ASSERT_OK(again);
  EXPECT_TRUE(from_cache);
  EXPECT_EQ(*again, *cubin);
  EXPECT_EQ(second.nvrtc_compilations(), 0);

  const std::string good = ReadFile(path);
  // One flipped bit in the CUBIN: detected by the checksum, recompiled and rewritten.
  std::string corrupt = good;
  corrupt[corrupt.size() / 2] ^= 0x10;
  WriteFile(path, corrupt);
  NvrtcCompiler third(dir);
  again = third.Compile(source, kArch, &from_cache);
  ASSERT_OK(again);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(*again, *cubin);
  EXPECT_EQ(third.nvrtc_compilations(), 1);
  EXPECT_EQ(ReadFile(path), good);

  // Truncated (a crash mid-write without the rename would never show this, but a full
  // disk or a copy might).
  WriteFile(path, good.substr(0, good.size() - 100));
  NvrtcCompiler fourth(dir);
  again = fourth.Compile(source, kArch, &from_cache);
  ASSERT_OK(again);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(fourth.nvrtc_compilations(), 1);
  EXPECT_EQ(ReadFile(path), good);

  // A file cut right after its header is ignored too; then the good file hits again.
  WriteFile(path, good.substr(0, 80));
  NvrtcCompiler fresh(dir);
  again = fresh.Compile(source, kArch, &from_cache);
  ASSERT_OK(again);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(*again, *cubin);
  NvrtcCompiler last(dir);
  ASSERT_OK(last.Compile(source, kArch, &from_cache));
  EXPECT_TRUE(from_cache);
  std::filesystem::remove_all(TempDir("cache"));
}

TEST(NvrtcCompilerTest, DiskCacheRejectsAnotherKeysFile) {
  const std::string dir = TempDir("otherkey");
  const std::string source_a = AxpySource();
  const std::string source_b = AxpySource(" + f");
  NvrtcCompiler compiler(dir);
  absl::StatusOr<std::string> a = compiler.Compile(source_a, kArch);
  absl::StatusOr<std::string> b = compiler.Compile(source_b, kArch);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_NE(*a, *b);
  // B's (valid) file under A's name: the key in the header does not match.
  std::filesystem::copy_file(compiler.CachePath(source_b, kArch),
                             compiler.CachePath(source_a, kArch),
                             std::filesystem::copy_options::overwrite_existing);
  NvrtcCompiler restarted(dir);
  bool from_cache = true;
  absl::StatusOr<std::string> again = restarted.Compile(source_a, kArch, &from_cache);
  ASSERT_OK(again);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(*again, *a);
  std::filesystem::remove_all(dir);
}

TEST(NvrtcCompilerTest, UnusableDirectoryStillCompilesAndWarnsOnce) {
  // A directory below a regular file cannot be created, even by root.
  const std::string base = TempDir("unwritable");
  std::filesystem::create_directories(base);
  WriteFile(base + "/file", "x");
  NvrtcCompiler compiler(base + "/file/cache");
  ::testing::internal::CaptureStderr();
  bool from_cache = true;
  absl::StatusOr<std::string> a = compiler.Compile(AxpySource(), kArch, &from_cache);
  absl::StatusOr<std::string> b = compiler.Compile(AxpySource(), kArch, &from_cache);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_FALSE(from_cache);
  EXPECT_EQ(compiler.nvrtc_compilations(), 2);
  const size_t first = log.find("warning");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("warning", first + 1), std::string::npos) << log;
  std::filesystem::remove_all(base);
}

TEST(NvrtcCompilerTest, ConcurrentCompilesOfOneSourceShareTheCache) {
  const std::string dir = TempDir("threads");
  const std::string source = AxpySource(" - g");
  NvrtcCompiler compiler(dir);
  std::vector<absl::StatusOr<std::string>> results(2);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&compiler, &source, &r] { r = compiler.Compile(source, kArch); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& r : results) {
    ASSERT_OK(r);
    EXPECT_EQ(*r, *results[0]);
  }
  bool from_cache = false;
  NvrtcCompiler restarted(dir);
  ASSERT_OK(restarted.Compile(source, kArch, &from_cache));
  EXPECT_TRUE(from_cache);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
  std::filesystem::remove_all(dir);
}

// Programs that differ only in scalar values compile to one cache entry: the second is a
// disk hit (and, in ElementwiseKernels, the same in-memory key, canonical()).
TEST(NvrtcCompilerTest, ScalarValuesShareOneCacheEntry) {
  const std::string dir = TempDir("scalars");
  InputMap a = InputsFor("sf * f + g");
  InputMap b = a;
  b["sf"] = ScalarInput{DType::kFloat64, 1e-7};
  const Program pa = MustCompile("sf * f + g", a);
  const Program pb = MustCompile("sf * f + g", b);
  EXPECT_EQ(pa.canonical(), pb.canonical());
  NvrtcCompiler compiler(dir);
  bool from_cache = true;
  ASSERT_OK(compiler.Compile(GenerateElementwise(pa, DType::kFloat32).source, kArch, &from_cache));
  EXPECT_FALSE(from_cache);
  ASSERT_OK(compiler.Compile(GenerateElementwise(pb, DType::kFloat32).source, kArch, &from_cache));
  EXPECT_TRUE(from_cache);
  EXPECT_EQ(compiler.nvrtc_compilations(), 1);
  std::filesystem::remove_all(dir);
}

// A 0-d array input of the contiguous kernels is a pointer to its one element, read once
// per thread before the loop (as a parameter is), never loaded in packs; it does not
// narrow the pack. The kernels of programs without one keep their text (the digest test).
TEST(CodegenSourceTest, ConstantArrayIsReadOncePerThread) {
  const Program program = MustCompile("f - b * g");  // arrays b, f, g
  const ElementwiseSource plain = GenerateElementwise(program, DType::kFloat32);
  EXPECT_EQ(plain.signature.elements_per_pack, 16);  // the bools' 16 bytes
  EXPECT_EQ(plain.source,
            GenerateElementwise(program, DType::kFloat32, {false, false, false}).source);
  const ElementwiseSource constant =
      GenerateElementwise(program, DType::kFloat32, {true, false, true});
  EXPECT_EQ(constant.signature.array_constant, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(constant.signature.elements_per_pack, 4);  // f's packs alone
  const std::string& src = constant.source;
  for (const char* read : {"const gc::u8 c0 = *in0;", "const float c2 = *in2;"}) {
    size_t first = src.find(read);
    ASSERT_NE(first, std::string::npos) << read << "\n" << src;
    EXPECT_NE(src.find(read, first + 1), std::string::npos) << read;  // in both kernels
  }
  EXPECT_EQ(src.find("a0["), std::string::npos) << src;
  EXPECT_EQ(src.find("a2["), std::string::npos) << src;
  EXPECT_EQ(src.find("in0[i]"), std::string::npos) << src;
  EXPECT_NE(src.find("Element((c0 != 0), a1[j].e[e], c2)"), std::string::npos) << src;
  EXPECT_NE(src.find("Element((c0 != 0), in1[i], c2)"), std::string::npos) << src;
  EXPECT_NE(src, plain.source);
  absl::StatusOr<std::string> cubin = SharedCompiler().Compile(src, kArch);
  ASSERT_OK(cubin) << "\n" << src;
}

// ---- strided kernels (kernels/cuda/elementwise/strided.cuh.in) ----

struct StridedCase {
  std::string name;
  std::string text;
  int out;  // DType, or -1 for the program's result dtype
  StridedSpecialization spec;
};

void PrintTo(const StridedCase& c, std::ostream* os) { *os << c.text << " " << c.spec.Name(); }

constexpr RowStep kU = RowStep::kUnit;
constexpr RowStep kB = RowStep::kBroadcast;
constexpr RowStep kG = RowStep::kGather;
constexpr RowStep kC = RowStep::kConstant;
constexpr RowStep kT = RowStep::kTransposed;

// Every row step for inputs and output, 1 to 8 axes, bool and float64 mixes, scalar
// parameters and math-library calls. The program's array inputs are in name order.
std::vector<StridedCase> StridedCases() {
  const int kBool = static_cast<int>(DType::kBool);
  const int kF64 = static_cast<int>(DType::kFloat64);
  return {
      {"ContiguousOneAxis", "f - g", -1, {1, {kU, kU}, kU}},
      {"ZeroDimOperand", "f - g", -1, {1, {kU, kC}, kU}},
      {"RowBroadcast", "f - g", -1, {2, {kU, kB}, kU}},
      {"ColumnBroadcast", "f - g", -1, {2, {kU, kU}, kU}},
      {"Transposed", "f + g", -1, {2, {kG, kU}, kU}},
      {"TransposedOutput", "d * 2", -1, {2, {kU}, kG}},
      {"StepSlice", "sf * f + g", -1, {1, {kG, kG}, kG}},
      {"ThreeAxes", "(f - g) * f", kF64, {3, {kG, kB}, kU}},
      {"FourAxesBoolOut", "d < e", kBool, {4, {kU, kB}, kG}},
      {"FiveAxesWhere", "where(b, d, e) > l", kBool, {5, {kB, kU, kG, kC}, kU}},
      {"SixAxesBools", "max(b, c)", kBool, {6, {kC, kU}, kU}},
      {"SevenAxesMath", "sin(d) * f + exp(f)", -1, {7, {kG, kU}, kU}},
      {"EightAxesMixed", "where(b, d, f) + i * l - si", kF64, {8, {kB, kU, kG, kC, kU}, kG}},
      {"EightAxesAllConstant", "d + e", -1, {8, {kC, kC}, kU}},
      {"TransposedTile", "f + g", -1, {2, {kT, kU}, kU}},
      {"TransposedTilesMixed", "where(b, d, e) > l", kBool, {3, {kT, kT, kU, kC}, kG}},
      {"TransposedTilesEightAxes", "d * f - i", -1, {8, {kT, kB, kT}, kG}},
      {"FourTiles", "b + d + e + f + l", -1, {2, {kT, kT, kT, kT, kU}, kU}},
      {"RowsColumn", "f - g", -1, {2, {kU, kB}, kU, true}},
      {"RowsRowVector", "f - g", -1, {2, {kU, kU}, kU, true}},
      {"RowsZeroDim", "f - g", -1, {2, {kC, kU}, kU, true}},
      {"RowsMixedBoolOut", "where(b, d, e) > l", kBool, {2, {kB, kU, kC, kU}, kU, true}},
      {"RowsMath", "sin(d) * f + exp(f)", -1, {2, {kB, kU}, kU, true}},
  };
}

class StridedCompileTest : public ::testing::TestWithParam<StridedCase> {};

TEST_P(StridedCompileTest, GeneratesSourceThatNvrtcCompiles) {
  const StridedCase& c = GetParam();
  const Program program = MustCompile(c.text);
  const DType out = c.out < 0 ? program.result_dtype() : static_cast<DType>(c.out);
  const StridedElementwiseSource generated = GenerateElementwiseStrided(program, out, c.spec);
  ASSERT_EQ(generated.signature.array_inputs.size(), c.spec.in_steps.size()) << c.text;
  EXPECT_EQ(generated.kernel, c.spec.rows ? kElementwiseRowsKernel : kElementwiseStridedKernel);
  EXPECT_EQ(generated.source.find("#include"), std::string::npos);
  EXPECT_EQ(generated.source.find('@'), std::string::npos) << generated.source;
  EXPECT_EQ(generated.source.find(absl::StrCat("constexpr int kDims = ", c.spec.dims, ";")) !=
                std::string::npos,
            !c.spec.rows);
  EXPECT_NE(generated.source.find(absl::StrCat("strided ", c.spec.Name())), std::string::npos);
  EXPECT_NE(generated.source.find(
                absl::StrCat("void __launch_bounds__(256)\n", generated.kernel, "(")),
            std::string::npos);
  EXPECT_LE(StridedArgumentBytes(generated.signature, c.spec), kMaxElementwiseArgumentBytes);
  absl::StatusOr<std::string> cubin = SharedCompiler().Compile(generated.source, kArch);
  ASSERT_OK(cubin) << "\n" << generated.source;
  ASSERT_GE(cubin->size(), 4u);
  EXPECT_EQ(cubin->substr(0, 4),
            "\x7f"
            "ELF");
}

INSTANTIATE_TEST_SUITE_P(Specializations, StridedCompileTest, ::testing::ValuesIn(StridedCases()),
                         [](const ::testing::TestParamInfo<StridedCase>& info) {
                           return info.param.name;
                         });

// The source is a function of the expression, the dtypes and the specialisation: each
// of those changes it, and nothing else can reach it (sizes are kernel arguments).
TEST(StridedSourceTest, SourceFollowsTheSpecialization) {
  const Program program = MustCompile("f - g");
  const StridedSpecialization row{2, {kU, kB}, kU};
  const std::string a = GenerateElementwiseStrided(program, DType::kFloat32, row).source;
  EXPECT_EQ(a, GenerateElementwiseStrided(program, DType::kFloat32, row).source);
  std::set<std::string> sources = {a};
  for (const StridedSpecialization& other : {StridedSpecialization{3, {kU, kB}, kU},
                                             StridedSpecialization{2, {kU, kC}, kU},
                                             StridedSpecialization{2, {kU, kB}, kG}}) {
    EXPECT_TRUE(sources.insert(GenerateElementwiseStrided(program, DType::kFloat32, other).source)
                    .second)
        << other.Name();
  }
  EXPECT_NE(a, GenerateElementwiseStrided(program, DType::kFloat64, row).source);
  // The contiguous kernels of the same program are another source (another cache entry).
  EXPECT_NE(a, GenerateElementwise(program, DType::kFloat32).source);
}

TEST(StridedSourceTest, SpecializationNames) {
  EXPECT_EQ((StridedSpecialization{2, {kU, kB}, kU}.Name()), "2d:ub>u");
  EXPECT_EQ((StridedSpecialization{8, {kG, kC, kU, kT}, kG}.Name()), "8d:gcut>g");
  EXPECT_EQ((StridedSpecialization{1, {}, kU}.Name()), "1d:>u");
  EXPECT_EQ((StridedSpecialization{2, {kU, kB, kC}, kU, true}.Name()), "rows:ubc>u");
}

// The rows kernel is chosen for two axes of whole rows, row vectors, column vectors and
// 0-d arrays whose rows start 16-byte aligned and hold whole packs; anything else takes
// the strided kernel. No GPU: the pointers are only looked at.
TEST(StridedSourceTest, RowsKernelOnlyForAlignedRowsOfWholePacks) {
  const Program program = MustCompile("f - g + d");  // arrays d, f, g; packs of 4
  const auto* base = reinterpret_cast<const char*>(uintptr_t{1} << 20);
  auto array = [&](int64_t offset, int64_t row_stride, int64_t stride) {
    return StridedArray{base, offset, {row_stride, stride}};
  };
  struct Case {
    std::string what;
    std::vector<int64_t> shape;
    StridedArray d, f, g, out;
    bool rows;
  };
  const std::vector<Case> cases = {
      {"column, row, whole rows",
       {37, 64},
       array(0, 64, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 64, 1),
       true},
      {"0-d and views of wider rows",
       {3, 8},
       array(2, 10, 1),
       array(5, 0, 0),
       array(4, 12, 1),
       array(4, 12, 1),
       true},
      {"a row not a whole number of packs",
       {37, 66},
       array(0, 66, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 66, 1),
       false},
      {"a misaligned first row",
       {37, 64},
       array(1, 64, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 64, 1),
       false},
      {"a misaligned output row stride",
       {37, 64},
       array(0, 64, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 65, 1),
       false},
      {"a float64 row stride of 8 bytes' multiple only",
       {37, 64},
       array(0, 65, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 64, 1),
       false},
      {"a gathered input",
       {37, 64},
       array(0, 128, 2),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 64, 1),
       false},
      {"a transposed input",
       {64, 64},
       array(0, 1, 64),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 64, 1),
       false},
      {"a gathered output",
       {37, 64},
       array(0, 64, 1),
       array(0, 1, 0),
       array(0, 0, 1),
       array(0, 128, 2),
       false},
  };
  for (const Case& c : cases) {
    const std::vector<StridedArray> inputs = {c.d, c.f, c.g};
    const StridedSpecialization spec =
        SpecializationOf(program, inputs, c.out, c.shape, DType::kFloat64);
    EXPECT_EQ(spec.rows, c.rows) << c.what << ": " << spec.Name();
  }
  // One axis or three: never.
  const std::vector<StridedArray> line = {StridedArray{base, 0, {1}}, StridedArray{base, 0, {0}},
                                          StridedArray{base, 0, {1}}};
  EXPECT_FALSE(
      SpecializationOf(program, line, line[0], std::vector<int64_t>{64}, DType::kFloat64).rows);
  const std::vector<StridedArray> cube = {StridedArray{base, 0, {64, 8, 1}},
                                          StridedArray{base, 0, {8, 1, 0}},
                                          StridedArray{base, 0, {0, 0, 1}}};
  EXPECT_FALSE(
      SpecializationOf(program, cube, cube[0], std::vector<int64_t>{8, 8, 8}, DType::kFloat64)
          .rows);
}

TEST(StridedSourceTest, RowSteps) {
  const int64_t unit[] = {100, 1};
  const int64_t row_broadcast[] = {1, 0};
  const int64_t zero_dim[] = {0, 0};
  const int64_t transposed[] = {1, 100};
  const int64_t reversed[] = {-100, -1};
  EXPECT_EQ(ClassifyRowStep(unit, 2, false), kU);
  EXPECT_EQ(ClassifyRowStep(row_broadcast, 2, false), kB);
  EXPECT_EQ(ClassifyRowStep(zero_dim, 2, false), kC);
  const int64_t permuted[] = {1, 100, 10};
  const int64_t step[] = {20, 2};
  EXPECT_EQ(ClassifyRowStep(transposed, 2, false), kT);
  EXPECT_EQ(ClassifyRowStep(permuted, 3, false), kG);
  EXPECT_EQ(ClassifyRowStep(step, 2, false), kG);
  EXPECT_EQ(ClassifyRowStep(reversed, 2, false), kG);
  EXPECT_EQ(ClassifyRowStep(unit, 2, true), kU);
  EXPECT_EQ(ClassifyRowStep(transposed, 2, true), kG);
  // An output is never read as broadcast: one element with stride 0 is gathered.
  EXPECT_EQ(ClassifyRowStep(zero_dim, 2, true), kG);
}

// The kernel's row-number division, against the hardware's, for divisors of every size
// and the dividends around their multiples, up to the largest int64.
TEST(StridedSourceTest, FastDivisionIsExact) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> divisors = {1, 2, 3, 5, 7, 10, 255, 256, 257, 641, 65535, 65536, 65537,
                                   (int64_t{1} << 31) - 1, int64_t{1} << 31, (int64_t{1} << 32) + 1,
                                   (int64_t{1} << 62) + 1, std::numeric_limits<int64_t>::max()};
  for (int i = 0; i < 200; ++i) {
    const int bits = static_cast<int>(rng() % 63) + 1;
    divisors.push_back(std::max<int64_t>(1, static_cast<int64_t>(rng() >> (64 - bits))));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t d : divisors) {
    const FastDivisor f = MakeFastDivisor(d);
    std::vector<int64_t> dividends = {0, 1, d - 1, d, kMax, kMax - 1, kMax - d + 1, kMax / d * d,
                                      kMax / d * d - 1};
    for (int i = 0; i < 200; ++i) {
      const int64_t n = static_cast<int64_t>(rng() >> 1);
      dividends.push_back(n);
      const int64_t m = n / d * d;
      dividends.push_back(m);
      if (m > 0) dividends.push_back(m - 1);
    }
    for (int64_t n : dividends) {
      if (n < 0) continue;
      ASSERT_EQ(FastDivide(n, f), n / d) << n << " / " << d;
    }
  }
}

// An expression of more arrays than the strided kernel's arguments allow at 8 axes is
// refused before anything is compiled or loaded (no GPU needed).
TEST(StridedSourceTest, TooManyArgumentBytesIsInvalidArgument) {
  std::string text = "x0";
  InputMap inputs = {{"x0", ArrayInput{DType::kFloat32}}};
  for (int k = 1; k < 60; ++k) {
    absl::StrAppend(&text, " + x", k);
    inputs.emplace(absl::StrCat("x", k), ArrayInput{DType::kFloat32});
  }
  const Program program = MustCompile(text, inputs);
  StridedSpecialization spec{8, std::vector<RowStep>(60, kU), kU};
  ElementwiseKernels kernels("");
  absl::StatusOr<const CompiledStridedElementwise*> k =
      kernels.GetStrided(program, DType::kFloat32, spec, kArch, nullptr);
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(k.status().message(),
            "the expression needs 5080 bytes of CUDA kernel arguments (60 arrays, 0 uses of "
            "scalar inputs); at most 4096 are supported. Use fewer scalar inputs, or pass some "
            "values as arrays.");
  EXPECT_EQ(kernels.nvrtc_compilations(), 0);
  spec.dims = 9;
  EXPECT_EQ(kernels.GetStrided(program, DType::kFloat32, spec, kArch, nullptr).status().message(),
            "strided kernels have 1 to 8 axes, not 9");
}

}  // namespace
}  // namespace gpucompute::cuda

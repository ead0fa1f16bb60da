// The expression compiler: exact error codes and messages (positions included) for
// malformed and hostile text, NumPy 2 type promotion, the canonical form, and the IR's
// invariants.
#include "server/expression/expression.h"

#include <gtest/gtest.h>

#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/expression/ir.h"
#include "server/expression/program_cache.h"
#include "tests/support/test_util.h"

namespace gpucompute::expr {
namespace {

InputMap DefaultInputs() {
  return {
      {"b", ArrayInput{DType::kBool}},           {"c", ArrayInput{DType::kBool}},
      {"i", ArrayInput{DType::kInt32}},          {"j", ArrayInput{DType::kInt32}},
      {"l", ArrayInput{DType::kInt64}},          {"f", ArrayInput{DType::kFloat32}},
      {"g", ArrayInput{DType::kFloat32}},        {"x", ArrayInput{DType::kFloat64}},
      {"y", ArrayInput{DType::kFloat64}},        {"si", ScalarInput{DType::kInt64, 0, 3}},
      {"sf", ScalarInput{DType::kFloat64, 2.5}}, {"sb", ScalarInput{DType::kBool, 0, 1}},
  };
}

// Binds only the inputs that `text` mentions, so the unused-input check stays quiet.
InputMap InputsFor(std::string_view text) {
  InputMap all = DefaultInputs();
  InputMap used;
  for (const auto& [name, type] : all) {
    size_t pos = 0;
    while ((pos = text.find(name, pos)) != std::string_view::npos) {
      const auto is_name_char = [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '_';
      };
      const bool start_ok = pos == 0 || !is_name_char(text[pos - 1]);
      const size_t end = pos + name.size();
      const bool end_ok = end == text.size() || !is_name_char(text[end]);
      if (start_ok && end_ok) {
        used.emplace(name, type);
        break;
      }
      pos = end;
    }
  }
  return used;
}

// Checks the invariants that ir.h promises.
void CheckIr(const Program& program) {
  const Ir& ir = program.ir();
  ASSERT_FALSE(ir.nodes.empty());
  ASSERT_EQ(ir.root, static_cast<int32_t>(ir.nodes.size()) - 1);
  int32_t parameters = 0;
  for (size_t n = 0; n < ir.nodes.size(); ++n) {
    const Node& node = ir.nodes[n];
    ASSERT_EQ(node.num_args, OpArity(node.op)) << n;
    for (int a = 0; a < node.num_args; ++a) {
      ASSERT_GE(node.args[a], 0);
      ASSERT_LT(node.args[a], static_cast<int32_t>(n)) << "not topological at node " << n;
    }
    auto arg = [&](int a) { return ir.nodes[node.args[a]].dtype; };
    switch (node.op) {
      case OpKind::kInput:
        ASSERT_GE(node.input, 0);
        ASSERT_LT(node.input, static_cast<int32_t>(program.inputs().size()));
        ASSERT_EQ(std::get<ArrayInput>(program.input_types()[node.input]).dtype, node.dtype);
        break;
      case OpKind::kConstant:
        if (node.parameter >= 0) {
          ASSERT_EQ(node.parameter, parameters++);
        }
        break;
      case OpKind::kCast:
        ASSERT_NE(arg(0), node.dtype);
        break;
      case OpKind::kWhere:
        ASSERT_EQ(arg(0), DType::kBool);
        ASSERT_EQ(arg(1), node.dtype);
        ASSERT_EQ(arg(2), node.dtype);
        break;
      default:
        if (IsComparison(node.op)) {
          ASSERT_EQ(node.dtype, DType::kBool);
          ASSERT_EQ(arg(0), arg(1));
        } else if (IsFloatTest(node.op)) {
          ASSERT_EQ(node.dtype, DType::kBool);
        } else {
          for (int a = 0; a < node.num_args; ++a) ASSERT_EQ(arg(a), node.dtype) << OpName(node.op);
          const OpKind op = node.op;
          if ((op >= OpKind::kSin && op <= OpKind::kRadians) || op == OpKind::kDiv ||
              op == OpKind::kAtan2 || op == OpKind::kHypot || op == OpKind::kCopysign) {
            ASSERT_TRUE(IsFloat(node.dtype)) << OpName(op);
          }
          if (op >= OpKind::kBitAnd && op <= OpKind::kRightShift) {
            ASSERT_FALSE(IsFloat(node.dtype)) << OpName(op);
          }
          const bool logical = op == OpKind::kLogicalNot || op == OpKind::kLogicalAnd ||
                               op == OpKind::kLogicalOr || op == OpKind::kLogicalXor;
          if (logical) {
            ASSERT_EQ(node.dtype, DType::kBool) << OpName(op);
          }
          const bool takes_bool = logical || op == OpKind::kMin || op == OpKind::kMax ||
                                  op == OpKind::kFmin || op == OpKind::kFmax ||
                                  op == OpKind::kInvert || op == OpKind::kBitAnd ||
                                  op == OpKind::kBitOr || op == OpKind::kBitXor;
          if (!takes_bool) {
            ASSERT_NE(node.dtype, DType::kBool) << OpName(op);
          }
        }
    }
  }
}

absl::StatusOr<Program> CompileChecked(std::string_view text, const InputMap& inputs) {
  absl::StatusOr<Program> program = Compile(text, inputs);
  if (program.ok()) CheckIr(*program);
  return program;
}

// ---------------------------------------------------------------------------------------
// Errors

struct ErrorCase {
  std::string text;
  std::string message;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << "\"" << c.text.substr(0, 40) << "\""; }

class ErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ErrorTest, InvalidArgumentWithPosition) {
  const ErrorCase& c = GetParam();
  const absl::StatusOr<Program> program = Compile(c.text, DefaultInputs());
  ASSERT_FALSE(program.ok()) << c.text;
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(program.status().message()), c.message) << "text: " << c.text;
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, ErrorTest,
    ::testing::Values(
        ErrorCase{"", "at position 0: the expression is empty"},
        ErrorCase{"   ", "at position 3: the expression is empty"},
        ErrorCase{
            "x +",
            "at position 3: expected a number, a name or '(', found the end of the expression"},
        ErrorCase{"x +* y", "at position 3: expected a number, a name or '(', found '*'"},
        ErrorCase{"()", "at position 1: expected a number, a name or '(', found ')'"},
        ErrorCase{"(x + y",
                  "at position 6: expected ')' to close '(' at position 0, found the end of the "
                  "expression"},
        ErrorCase{"(1 + (x 2", "at position 8: expected ')' to close '(' at position 5, found '2'"},
        ErrorCase{"x)", "at position 1: ')' has no matching '('"},
        ErrorCase{"x y", "at position 2: unexpected 'y' after a complete expression"},
        ErrorCase{"x + 1 2", "at position 6: unexpected '2' after a complete expression"},
        ErrorCase{"sinn(x)", "at position 0: unknown function 'sinn'"},
        ErrorCase{"x(1)", "at position 0: unknown function 'x'"},
        ErrorCase{"x + z", "at position 4: 'z' is not bound to an input"},
        ErrorCase{"2 * sin",
                  "at position 4: function 'sin' must be called with its arguments in parentheses"},
        ErrorCase{"atan2(x)", "at position 0: function 'atan2' takes 2 arguments, got 1"},
        ErrorCase{"1 + sin(x, y)", "at position 4: function 'sin' takes 1 argument, got 2"},
        ErrorCase{"sin()", "at position 0: function 'sin' takes 1 argument, got 0"},
        ErrorCase{"where(b, x)", "at position 0: function 'where' takes 3 arguments, got 2"},
        ErrorCase{"min(x, y, 1)", "at position 0: function 'min' takes 2 arguments, got 3"},
        ErrorCase{"min(x,)", "at position 6: expected a number, a name or '(', found ')'"},
        ErrorCase{"min(x y)",
                  "at position 6: expected ',' or ')' to close '(' at position 3, found 'y'"},
        ErrorCase{"max(x, y",
                  "at position 8: expected ',' or ')' to close '(' at position 3, found the end of "
                  "the expression"},
        ErrorCase{"1e", "at position 0: malformed number '1e': the exponent has no digits"},
        ErrorCase{"x * 2.5e+",
                  "at position 4: malformed number '2.5e+': the exponent has no digits"},
        ErrorCase{"2x", "at position 0: invalid number literal '2x'"},
        ErrorCase{"x + 1.2.3", "at position 4: invalid number literal '1.2.3'"},
        ErrorCase{"x + 0x10", "at position 4: invalid number literal '0x10'"},
        ErrorCase{"x + 99999999999999999999",
                  "at position 4: integer literal '99999999999999999999' does not fit in int64"},
        ErrorCase{"x < y < 1",
                  "at position 6: comparisons cannot be chained (a < b < c); add parentheses, e.g. "
                  "(a < b) == (b < c)"},
        ErrorCase{"x == y != b",
                  "at position 7: comparisons cannot be chained (a < b < c); add parentheses, e.g. "
                  "(a < b) == (b < c)"},
        ErrorCase{"x = y", "at position 2: '=' is not an operator; use '==' to compare"},
        ErrorCase{"!b", "at position 0: unexpected character '!'; use '!=' for 'not equal'"},
        // Bitwise operators and shifts take integers and bools, as NumPy's ufuncs do.
        ErrorCase{"x ^ 2",
                  "at position 2: ufunc 'bitwise_xor' not supported for the input types "
                  "(float64, int); operator '^' takes integers or bools"},
        ErrorCase{"f & i",
                  "at position 2: ufunc 'bitwise_and' not supported for the input types "
                  "(float32, int32); operator '&' takes integers or bools"},
        ErrorCase{"i | 1.5",
                  "at position 2: ufunc 'bitwise_or' not supported for the input types "
                  "(int32, float); operator '|' takes integers or bools"},
        ErrorCase{"left_shift(x, 1)",
                  "at position 0: ufunc 'left_shift' not supported for the input types "
                  "(float64, int); function 'left_shift' takes integers or bools"},
        ErrorCase{"i >> f",
                  "at position 2: ufunc 'right_shift' not supported for the input types "
                  "(int32, float32); operator '>>' takes integers or bools"},
        ErrorCase{"~x",
                  "at position 0: ufunc 'invert' not supported for the input type (float64); "
                  "operator '~' takes integers or bools"},
        ErrorCase{"b << c",
                  "at position 2: operator '<<' cannot combine two bool operands; convert one to "
                  "a number first, e.g. where(b, 1, 0)"},
        ErrorCase{"b // c",
                  "at position 2: operator '//' cannot combine two bool operands; convert one to "
                  "a number first, e.g. where(b, 1, 0)"},
        ErrorCase{"True % b",
                  "at position 5: operator '%' cannot combine two bool operands; convert one to "
                  "a number first, e.g. where(b, 1, 0)"},
        ErrorCase{"hypot(b, c)",
                  "at position 0: function 'hypot' cannot combine two bool operands; convert one "
                  "to a number first, e.g. where(b, 1, 0)"},
        // Python's and/or/not need one truth value; NumPy arrays refuse them.
        ErrorCase{"b and c",
                  "at position 2: 'and' is not supported (an array has no single truth value); "
                  "use logical_and(a, b), or a & b on bools"},
        ErrorCase{"(b or c)",
                  "at position 3: 'or' is not supported (an array has no single truth value); "
                  "use logical_or(a, b), or a | b on bools"},
        ErrorCase{"not b",
                  "at position 0: 'not' is not supported (an array has no single truth value); "
                  "use logical_not(x), or ~x on bools"},
        ErrorCase{"where(b, 1, not c)",
                  "at position 12: 'not' is not supported (an array has no single truth value); "
                  "use logical_not(x), or ~x on bools"},
        // round's decimals, argument counts, casts.
        ErrorCase{"round(x, 1.5)",
                  "at position 9: the decimals of round() must be an integer literal or an integer "
                  "scalar input"},
        ErrorCase{"round(x, i)",
                  "at position 9: the decimals of round() must be an integer literal or an integer "
                  "scalar input"},
        ErrorCase{"round(x, sf)",
                  "at position 9: the decimals of round() must be an integer literal or an integer "
                  "scalar input"},
        ErrorCase{"round(x, 1, 2)",
                  "at position 0: function 'round' takes 1 or 2 arguments, got 3"},
        ErrorCase{"clip(x, 1)", "at position 0: function 'clip' takes 3 arguments, got 2"},
        ErrorCase{"isnan()", "at position 0: function 'isnan' takes 1 argument, got 0"},
        ErrorCase{"int32(3000000000)",
                  "at position 0: the integer 3000000000 does not fit in int32"},
        ErrorCase{"float32",
                  "at position 0: function 'float32' must be called with its arguments "
                  "in parentheses"},
        ErrorCase{"x + @", "at position 4: unexpected character '@'"},
        ErrorCase{"x + \xc3\xa9", "at position 4: unexpected character '\\xc3'"},
        ErrorCase{std::string("x\0y", 3), "at position 1: unexpected character '\\x00'"},
        // Arithmetic on two bools, and math functions of a bool.
        ErrorCase{"b + c",
                  "at position 2: operator '+' cannot combine two bool operands; convert one to a "
                  "number first, e.g. where(b, 1, 0)"},
        ErrorCase{"b * True",
                  "at position 2: operator '*' cannot combine two bool operands; convert one to a "
                  "number first, e.g. where(b, 1, 0)"},
        ErrorCase{"(x < y) / b",
                  "at position 8: operator '/' cannot combine two bool operands; convert one to a "
                  "number first, e.g. where(b, 1, 0)"},
        ErrorCase{"b ** c",
                  "at position 2: operator '**' cannot combine two bool operands; convert one to a "
                  "number first, e.g. where(b, 1, 0)"},
        ErrorCase{"pow(b, c)",
                  "at position 0: function 'pow' cannot combine two bool operands; convert one to "
                  "a number first, e.g. where(b, 1, 0)"},
        ErrorCase{"atan2(b, sb)",
                  "at position 0: function 'atan2' cannot combine two bool operands; convert one "
                  "to a number first, e.g. where(b, 1, 0)"},
        ErrorCase{"True - False",
                  "at position 5: operator '-' cannot combine two bool operands; convert one to a "
                  "number first, e.g. where(b, 1, 0)"},
        ErrorCase{"sin(b)",
                  "at position 0: function 'sin' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"x + abs(x < y)",
                  "at position 4: function 'abs' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"floor(True)",
                  "at position 0: function 'floor' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"-b",
                  "at position 0: unary '-' cannot be applied to a bool; use where(b, -1, 0) or a "
                  "comparison instead"},
        ErrorCase{"rint(b)",
                  "at position 0: function 'rint' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"sign(True)",
                  "at position 0: function 'sign' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"positive(b)",
                  "at position 0: function 'positive' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"round(b, 1)",
                  "at position 0: function 'round' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        ErrorCase{"square(x < y)",
                  "at position 0: function 'square' cannot take a bool argument; convert it with "
                  "where(b, 1.0, 0.0) first"},
        // NumPy 2 raises OverflowError for a Python int outside the array's integer dtype.
        ErrorCase{"i + 3000000000",
                  "at position 4: the integer 3000000000 does not fit in int32, the dtype of the "
                  "array it is combined with (as in NumPy 2)"},
        ErrorCase{"i < -(2**40)",
                  "at position 4: the integer -1099511627776 does not fit in int32, the dtype of "
                  "the array it is combined with (as in NumPy 2)"}));

TEST(ExpressionErrors, TooLong) {
  const std::string text(kMaxExpressionLength + 1, 'x');
  const absl::StatusOr<Program> program = Compile(text, DefaultInputs());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(program.status().message(),
            "at position 65536: the expression is 65537 bytes long; the limit is 65536");
}

TEST(ExpressionErrors, HostileNestingIsRejectedWithoutRecursingDeeply) {
  const std::string kDepthMessage =
      ": the expression is nested more than 256 levels deep, the most "
      "--max-expression-depth allows (parentheses, calls, unary operators and ** exponents "
      "each add a level)";
  struct Case {
    std::string text;
    std::string message;
  };
  std::string calls;
  for (int k = 0; k < 300; ++k) calls += "sin(";
  calls += "x";
  for (int k = 0; k < 300; ++k) calls += ")";
  std::string powers = "x";
  for (int k = 0; k < 20000; ++k) powers += "**x";
  const Case cases[] = {
      // 100000 '(' is over the length limit, and rejected before parsing.
      {std::string(100000, '('),
       "at position 65536: the expression is 100000 bytes long; the limit is 65536"},
      {std::string(60000, '(') + "x", "at position 256" + kDepthMessage},
      {std::string(60000, '-') + "x", "at position 256" + kDepthMessage},
      {std::string(30000, '+') + "x", "at position 256" + kDepthMessage},
      {calls, "at position 1027" + kDepthMessage},  // the '(' of the 257th sin
      {powers, "at position 769" + kDepthMessage},  // the 257th '**'
  };
  for (const Case& c : cases) {
    const absl::StatusOr<Program> program = Compile(c.text, DefaultInputs());
    ASSERT_FALSE(program.ok());
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(program.status().message(), c.message) << c.text.substr(0, 20);
  }
}

TEST(ExpressionErrors, NestingUpToTheLimitIsAccepted) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat64}}};
  EXPECT_OK(CompileChecked(std::string(256, '(') + "x" + std::string(256, ')'), inputs));
  EXPECT_FALSE(CompileChecked(std::string(257, '(') + "x" + std::string(257, ')'), inputs).ok());
  EXPECT_OK(CompileChecked(std::string(256, '-') + "x", inputs));
}

TEST(ExpressionErrors, ALowerDepthBoundIsHonouredAndAHigherOneIsCapped) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat64}}};
  EXPECT_OK(Compile("-(sin(x))", inputs, 3));
  const absl::StatusOr<Program> deep = Compile("-(sin(-x))", inputs, 3);
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.status().message(),
            "at position 6: the expression is nested more than 3 levels deep, the most "
            "--max-expression-depth allows (parentheses, calls, unary operators and ** "
            "exponents each add a level)");
  // The parser's recursion stays bounded whatever the caller asks for.
  const absl::StatusOr<Program> capped =
      Compile(std::string(257, '(') + "x" + std::string(257, ')'), inputs, 100000);
  ASSERT_FALSE(capped.ok());
  EXPECT_NE(capped.status().message().find("nested more than 256 levels"), std::string::npos)
      << capped.status();
}

TEST(ExpressionErrors, LongFlatExpressionsCompile) {
  // Deep trees from left-associative chains must not recurse anywhere (canonical() is
  // rendered iteratively): 16000 additions, well within 64 KiB.
  std::string text = "x";
  for (int k = 0; k < 16000; ++k) text += "+x";
  const absl::StatusOr<Program> program =
      CompileChecked(text, {{"x", ArrayInput{DType::kFloat32}}});
  ASSERT_OK(program);
  EXPECT_EQ(program->ops_per_element(), 16000);
  EXPECT_EQ(program->ir().nodes.size(), 16001u);
}

TEST(ExpressionErrors, UnusedInput) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat64}}, {"y", ArrayInput{DType::kFloat64}}};
  const absl::StatusOr<Program> program = Compile("x * 2", inputs);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(program.status().message(), "input 'y' is bound but not used by the expression");

  const absl::StatusOr<Program> scalar = Compile(
      "x * 2", {{"x", ArrayInput{DType::kFloat64}}, {"a", ScalarInput{DType::kFloat64, 1}}});
  ASSERT_FALSE(scalar.ok());
  EXPECT_EQ(scalar.status().message(), "input 'a' is bound but not used by the expression");
}

TEST(ExpressionErrors, InvalidInputName) {
  const absl::StatusOr<Program> program =
      Compile("x", {{"x", ArrayInput{DType::kFloat64}}, {"1x", ArrayInput{DType::kFloat64}}});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      program.status().message(),
      "input name '1x' is not a valid identifier ([A-Za-z_][A-Za-z0-9_]*, not True or False)");
}

// ---------------------------------------------------------------------------------------
// Promotion

struct PromotionCase {
  std::string text;
  DType expected;
  std::string why;
};

void PrintTo(const PromotionCase& c, std::ostream* os) { *os << "\"" << c.text << "\""; }

class PromotionTest : public ::testing::TestWithParam<PromotionCase> {};

TEST_P(PromotionTest, MatchesNumPy2) {
  const PromotionCase& c = GetParam();
  const absl::StatusOr<Program> program = CompileChecked(c.text, InputsFor(c.text));
  ASSERT_OK(program) << c.text;
  EXPECT_EQ(DTypeName(program->result_dtype()), DTypeName(c.expected))
      << c.text << " (" << c.why << "); canonical: " << program->canonical();
}

// Inputs: b, c bool; i, j int32; l int64; f, g float32; x, y float64 arrays; si, sf, sb
// int, float and bool scalars (weak, like Python scalars).
INSTANTIATE_TEST_SUITE_P(
    NumPy2, PromotionTest,
    ::testing::Values(
        // array op array: np.result_type.
        PromotionCase{"i + j", DType::kInt32, "same dtype"},
        PromotionCase{"b + i", DType::kInt32, "bool with X gives X"},
        PromotionCase{"b * f", DType::kFloat32, "bool with X gives X"},
        PromotionCase{"i + l", DType::kInt64, "int32+int64 -> int64"},
        PromotionCase{"i + f", DType::kFloat64, "int32+float32 -> float64, not float32"},
        PromotionCase{"l - f", DType::kFloat64, "int64+float32 -> float64"},
        PromotionCase{"f * x", DType::kFloat64, "float32+float64 -> float64"},
        PromotionCase{"f + g", DType::kFloat32, "same dtype"},
        PromotionCase{"l * x", DType::kFloat64, "int64+float64 -> float64"},
        // Weak Python scalars (NEP 50): literals and scalar inputs.
        PromotionCase{"i + 1", DType::kInt32, "int scalar keeps the int array's dtype"},
        PromotionCase{"i * si", DType::kInt32, "int scalar input is weak too"},
        PromotionCase{"f + 1", DType::kFloat32, "int scalar with float array keeps float"},
        PromotionCase{"f * 2.5", DType::kFloat32, "float scalar with float32 stays float32"},
        PromotionCase{"f * sf", DType::kFloat32, "float scalar input with float32"},
        PromotionCase{"i + 1.5", DType::kFloat64, "float scalar with int array -> float64"},
        PromotionCase{"l * sf", DType::kFloat64, "float scalar with int array -> float64"},
        PromotionCase{"b + 1.5", DType::kFloat64, "float scalar with bool array -> float64"},
        PromotionCase{"b + 1", DType::kInt64, "int scalar with bool array -> default int"},
        PromotionCase{"i + True", DType::kInt32, "bool scalar with int array -> int array"},
        PromotionCase{"f + sb", DType::kFloat32, "bool scalar input with float32"},
        PromotionCase{"x + 1", DType::kFloat64, "weak int with float64"},
        // weak op weak stays weak; a weak result becomes int64/float64/bool.
        PromotionCase{"1 + 2", DType::kInt64, "weak int result -> int64"},
        PromotionCase{"si * 2", DType::kInt64, "scalar-only -> int64"},
        PromotionCase{"1 + 2.0", DType::kFloat64, "weak float result -> float64"},
        PromotionCase{"True", DType::kBool, "weak bool result -> bool"},
        PromotionCase{"1 < 2", DType::kBool, "weak comparison"},
        PromotionCase{"f + (1 + 2)", DType::kFloat32, "folded weak int stays weak"},
        PromotionCase{"f + sin(1)", DType::kFloat32, "a function of a weak scalar stays weak"},
        PromotionCase{"i + (2 * 3)", DType::kInt32, "folded weak int stays weak"},
        PromotionCase{"i + (True + 1)", DType::kInt32, "weak bool+int is weak int"},
        // True division.
        PromotionCase{"i / j", DType::kFloat64, "int32/int32 -> float64"},
        PromotionCase{"l / 2", DType::kFloat64, "int/int -> float64"},
        PromotionCase{"b / 2", DType::kFloat64, "bool/int -> float64"},
        PromotionCase{"f / g", DType::kFloat32, "float32/float32 stays float32"},
        PromotionCase{"f / 2", DType::kFloat32, "float32/weak int stays float32"},
        PromotionCase{"i / f", DType::kFloat64, "int32/float32 -> float64"},
        PromotionCase{"1 / 2", DType::kFloat64, "weak int/int -> weak float"},
        // Powers.
        PromotionCase{"i ** 2", DType::kInt32, "int**int stays int"},
        PromotionCase{"i ** l", DType::kInt64, "int32**int64 -> int64"},
        PromotionCase{"pow(i, j)", DType::kInt32, "pow like **"},
        PromotionCase{"f ** 2", DType::kFloat32, "float32**weak int"},
        PromotionCase{"i ** 0.5", DType::kFloat64, "int**weak float -> float64"},
        PromotionCase{"2 ** -1", DType::kInt64, "weak int**int stays int"},
        // One-argument functions.
        PromotionCase{"sin(i)", DType::kFloat64, "math of int computes in float64"},
        PromotionCase{"floor(l)", DType::kFloat64, "floor of int -> float64"},
        PromotionCase{"ceil(i)", DType::kFloat64, "ceil of int -> float64"},
        PromotionCase{"sqrt(f)", DType::kFloat32, "math of float32 stays float32"},
        PromotionCase{"exp(x)", DType::kFloat64, "math of float64"},
        PromotionCase{"abs(i)", DType::kInt32, "abs of int stays int"},
        PromotionCase{"-l", DType::kInt64, "negation of int stays int"},
        PromotionCase{"abs(f)", DType::kFloat32, "abs of float32"},
        // min/max/atan2 promote like binary ops.
        PromotionCase{"min(i, f)", DType::kFloat64, "int32 with float32"},
        PromotionCase{"max(i, 1)", DType::kInt32, "weak int"},
        PromotionCase{"max(b, c)", DType::kBool, "min/max of bools are allowed"},
        PromotionCase{"atan2(i, j)", DType::kFloat64, "atan2 of ints -> float64"},
        PromotionCase{"atan2(f, 1)", DType::kFloat32, "atan2 float32 with weak int"},
        PromotionCase{"atan2(b, i)", DType::kFloat64, "bool with int -> int -> float64"},
        // Comparisons give bool.
        PromotionCase{"i < f", DType::kBool, "compared in float64"},
        PromotionCase{"b == c", DType::kBool, "bools compare"},
        PromotionCase{"x != 1", DType::kBool, "weak int"},
        // where: result promote(a, b); a non-bool condition is compared with 0.
        PromotionCase{"where(b, i, f)", DType::kFloat64, "int32 with float32"},
        PromotionCase{"where(i, f, 1)", DType::kFloat32, "int condition; weak int branch"},
        PromotionCase{"where(b, f, 2.5)", DType::kFloat32, "weak float branch"},
        PromotionCase{"where(b, 1, 2)", DType::kInt64, "two weak branches, array condition"},
        PromotionCase{"where(b, 1, 2.5)", DType::kFloat64, "two weak branches, array condition"},
        PromotionCase{"where(True, i, 2.5)", DType::kFloat64,
                      "folded condition keeps the promotion"},
        PromotionCase{"where(sb, i, 1)", DType::kInt32, "scalar condition"},
        PromotionCase{"where(x, b, c)", DType::kBool, "bool branches"},
        // Floor division and remainders keep integers; float ones promote as arithmetic.
        PromotionCase{"i // j", DType::kInt32, "floor_divide of ints stays int"},
        PromotionCase{"i % 2", DType::kInt32, "remainder with a weak int"},
        PromotionCase{"l % i", DType::kInt64, "int32 with int64"},
        PromotionCase{"f // 2", DType::kFloat32, "float32 // weak int"},
        PromotionCase{"i // 2.0", DType::kFloat64, "int // weak float"},
        PromotionCase{"fmod(i, f)", DType::kFloat64, "int32 with float32"},
        PromotionCase{"b // 2", DType::kInt64, "bool with a weak int"},
        // hypot and copysign promote like atan2; fmax and fmin like max.
        PromotionCase{"hypot(i, j)", DType::kFloat64, "hypot of ints -> float64"},
        PromotionCase{"copysign(f, 1)", DType::kFloat32, "float32 with weak int"},
        PromotionCase{"fmax(b, c)", DType::kBool, "fmax of bools"},
        PromotionCase{"fmin(i, f)", DType::kFloat64, "int32 with float32"},
        PromotionCase{"maximum(i, l)", DType::kInt64, "NumPy's name of max"},
        // Bitwise operators and shifts: integers and bools.
        PromotionCase{"i & j", DType::kInt32, "same dtype"},
        PromotionCase{"b | c", DType::kBool, "bool | bool stays bool"},
        PromotionCase{"b ^ 1", DType::kInt64, "bool with a weak int -> default int"},
        PromotionCase{"b & i", DType::kInt32, "bool with int32"},
        PromotionCase{"i << 2", DType::kInt32, "weak shift amount"},
        PromotionCase{"i >> l", DType::kInt64, "int32 with int64"},
        PromotionCase{"~i", DType::kInt32, "invert keeps the dtype"},
        PromotionCase{"~b", DType::kBool, "invert of bool is logical not"},
        PromotionCase{"bitwise_not(l)", DType::kInt64, "NumPy 2's name of invert"},
        // Logical functions take any dtype and give bool.
        PromotionCase{"logical_and(x, i)", DType::kBool, "any dtype"},
        PromotionCase{"logical_not(f)", DType::kBool, "any dtype"},
        PromotionCase{"logical_xor(b, 2)", DType::kBool, "weak int"},
        PromotionCase{"logical_or(1, 0)", DType::kBool, "weak only"},
        // Float tests take any dtype and give bool.
        PromotionCase{"isnan(i)", DType::kBool, "ints are never NaN, but accepted"},
        PromotionCase{"signbit(x)", DType::kBool, "float"},
        PromotionCase{"isfinite(b)", DType::kBool, "bool"},
        PromotionCase{"isinf(sf)", DType::kBool, "weak float"},
        // Float functions of integers compute in float64; sign, square and reciprocal keep
        // integers.
        PromotionCase{"rint(i)", DType::kFloat64, "float function of an int"},
        PromotionCase{"trunc(f)", DType::kFloat32, "float32 stays"},
        PromotionCase{"exp2(l)", DType::kFloat64, "float function of an int"},
        PromotionCase{"log10(f)", DType::kFloat32, "float32 stays"},
        PromotionCase{"degrees(i)", DType::kFloat64, "float function of an int"},
        PromotionCase{"arctanh(f)", DType::kFloat32, "float32 stays"},
        PromotionCase{"arcsin(x)", DType::kFloat64, "NumPy's name of asin"},
        PromotionCase{"sign(i)", DType::kInt32, "sign keeps ints"},
        PromotionCase{"square(l)", DType::kInt64, "square keeps ints"},
        PromotionCase{"reciprocal(i)", DType::kInt32, "reciprocal keeps ints"},
        PromotionCase{"absolute(i)", DType::kInt32, "NumPy's name of abs"},
        PromotionCase{"positive(i)", DType::kInt32, "identity"},
        PromotionCase{"true_divide(i, j)", DType::kFloat64, "NumPy's name of /"},
        // round: rint for floats, the identity for ints, 10**d with the operand's dtype.
        PromotionCase{"round(f)", DType::kFloat32, "rint of float32"},
        PromotionCase{"round(i)", DType::kInt32, "round of an int is the int"},
        PromotionCase{"round(x, 2)", DType::kFloat64, "float64"},
        PromotionCase{"round(f, 2)", DType::kFloat32, "10**2 is a weak float"},
        PromotionCase{"round(i, -1)", DType::kInt32, "through float64 and back"},
        PromotionCase{"round(f, si)", DType::kFloat32, "decimals from a scalar input"},
        // clip promotes its three operands.
        PromotionCase{"clip(i, 0, 10)", DType::kInt32, "weak bounds"},
        PromotionCase{"clip(i, 0, 2.5)", DType::kFloat64, "a weak float bound"},
        PromotionCase{"clip(f, 0, 1)", DType::kFloat32, "float32"},
        PromotionCase{"clip(i, l, f)", DType::kFloat64, "three arrays"},
        // Casts give typed (strong) values, like np.float32(2.5).
        PromotionCase{"float32(i)", DType::kFloat32, "cast"},
        PromotionCase{"int64(x)", DType::kInt64, "cast"},
        PromotionCase{"bool(x)", DType::kBool, "cast"},
        PromotionCase{"float32(2) + x", DType::kFloat64, "a float32 scalar is strong"},
        PromotionCase{"float32(2.5) * i", DType::kFloat64, "float32 with int32"},
        PromotionCase{"int32(2) + 1", DType::kInt32, "strong int32 with a weak int"},
        PromotionCase{"f + float64(1)", DType::kFloat64, "strong float64"}));

std::string CanonicalOf(std::string_view text) {
  const absl::StatusOr<Program> program = CompileChecked(text, InputsFor(text));
  EXPECT_OK(program) << text;
  return program.ok() ? program->canonical() : "";
}

TEST(Promotion, CanonicalShowsCastsAndComputeTypes) {
  // int32 + float32 casts both sides to float64.
  EXPECT_EQ(CanonicalOf("i + f"),
            "add<float64>(cast<float64>(in1<int32>), cast<float64>(in0<float32>))");
  // A weak float is converted to float32 at compile time.
  EXPECT_EQ(CanonicalOf("f * 0.5"), "mul<float32>(in0<float32>, 0.5<float32>)");
  // A non-bool condition is compared with zero in its own dtype.
  EXPECT_EQ(CanonicalOf("where(i, f, 1)"),
            "where<float32>(ne<bool>(in1<int32>, 0<int32>), in0<float32>, 1<float32>)");
  // Integer division goes through float64.
  EXPECT_EQ(CanonicalOf("i / 2"), "div<float64>(cast<float64>(in0<int32>), 2<float64>)");
  // Weak-only subexpressions are folded: (1 + 2) * 3 == 9; 2**3**2 == 2**9 (right-assoc).
  EXPECT_EQ(CanonicalOf("i * ((1 + 2) * 3) + 2**3**2 - -2**2"),
            "sub<int32>(add<int32>(mul<int32>(in0<int32>, 9<int32>), 512<int32>), -4<int32>)");
  // x**2 is x*x.
  EXPECT_EQ(CanonicalOf("-f**2"), "neg<float32>(mul<float32>(in0<float32>, in0<float32>))");
}

TEST(Promotion, WeakFoldingFollowsIntegerRules) {
  const auto value = [](std::string_view text) {
    const absl::StatusOr<Program> p = Compile(text, {});
    EXPECT_OK(p);
    const Node& root = p->ir().nodes[p->ir().root];
    EXPECT_EQ(root.op, OpKind::kConstant);
    return IsFloat(root.dtype) ? root.value.f : static_cast<double>(root.value.i);
  };
  EXPECT_EQ(value("2 ** -1"), 0);  // truncation of 0.5 (documented; Python gives 0.5)
  EXPECT_EQ(value("(-1) ** -3"), -1);
  EXPECT_EQ(value("1 ** -7"), 1);
  EXPECT_EQ(value("1 / 4"), 0.25);   // true division
  EXPECT_EQ(value("7 - 2 - 1"), 4);  // left-assoc
  EXPECT_EQ(value("2 * 3 + 4 * 5"), 26);
  EXPECT_EQ(value("-2 ** 2"), -4);  // ** binds tighter than unary minus
  EXPECT_EQ(value("2 ** 2 ** 3"), 256);
  EXPECT_EQ(value("9223372036854775807 + 1"), -9223372036854775807.0 - 1);  // wraps
  EXPECT_EQ(value("1e999"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(value("1e-999"), 0.0);
  EXPECT_EQ(value(".5 + 3."), 3.5);
  EXPECT_EQ(value("where(1 < 2, 10, 20)"), 10);
  EXPECT_EQ(value("max(3, 7.5)"), 7.5);
  EXPECT_EQ(value("abs(-3)"), 3);
  EXPECT_EQ(value("floor(2)"), 2.0);
}

// Python's precedence: | ^ & (<< >>) (+ -) (* / // %) (unary - + ~) **, comparisons
// loosest; and NumPy's integer semantics where Python's unbounded ints differ.
TEST(Operators, PrecedenceAndIntegerSemantics) {
  const auto value = [](std::string_view text) {
    const absl::StatusOr<Program> p = CompileChecked(text, {});
    EXPECT_OK(p) << text;
    if (!p.ok()) return -12345.0;
    const Node& root = p->ir().nodes[p->ir().root];
    EXPECT_EQ(root.op, OpKind::kConstant) << text;
    return IsFloat(root.dtype) ? root.value.f : static_cast<double>(root.value.i);
  };
  EXPECT_EQ(value("1 | 2 ^ 3 & 4 << 1 + 1"), 3);  // 1 | (2 ^ (3 & (4 << 2)))
  EXPECT_EQ(value("6 & 3 | 8"), 10);
  EXPECT_EQ(value("6 ^ 3 ^ 1"), 4);
  EXPECT_EQ(value("1 << 3 >> 1"), 4);    // left-assoc
  EXPECT_EQ(value("1 + 2 < 4 & 7"), 1);  // (1 + 2) < (4 & 7)
  EXPECT_EQ(value("7 // 2 * 3"), 9);
  EXPECT_EQ(value("2 ** 3 // 3"), 2);
  EXPECT_EQ(value("-7 // 2"), -4);  // floor, unary minus first
  EXPECT_EQ(value("7 // -2"), -4);
  EXPECT_EQ(value("-7 % 3"), 2);  // the divisor's sign
  EXPECT_EQ(value("7 % -3"), -2);
  EXPECT_EQ(value("-7 % -3"), -1);
  EXPECT_EQ(value("fmod(-7, 3)"), -1);  // the dividend's sign
  EXPECT_EQ(value("7 // 0"), 0);        // NumPy: 0, no trap
  EXPECT_EQ(value("7 % 0"), 0);
  EXPECT_EQ(value("(-9223372036854775807 - 1) // -1"), -9223372036854775807.0 - 1);  // wraps
  EXPECT_EQ(value("-7.5 // 2"), -4.0);
  EXPECT_EQ(value("-7.5 % 2"), 0.5);
  EXPECT_EQ(value("~5"), -6);
  EXPECT_EQ(value("-~5"), 6);
  EXPECT_EQ(value("~True"), 0);    // invert of a bool is logical not
  EXPECT_EQ(value("1 << 64"), 0);  // shifts out of range, as NumPy
  EXPECT_EQ(value("-8 >> 70"), -1);
  EXPECT_EQ(value("5 >> -1"), 0);
  EXPECT_EQ(value("1 << -1"), 0);
  EXPECT_EQ(value("(1 < 2) | (3 < 2)"), 1);
  EXPECT_EQ(value("logical_xor(2, 0)"), 1);
  EXPECT_EQ(value("round(2.5)"), 2.0);
  EXPECT_TRUE(std::signbit(value("round(-0.5)")));
  EXPECT_EQ(value("round(0.285, 2)"), 0.28);  // NumPy's algorithm: 28.499999... rounds down
  EXPECT_EQ(value("round(2.675, 2)"), 2.68);  // 267.5 exactly, to even
  EXPECT_EQ(value("round(1250, -2)"), 1200);  // half to even
  EXPECT_EQ(value("round(1350, -2)"), 1400);
  EXPECT_EQ(value("round(7, 3)"), 7);
  EXPECT_EQ(value("clip(5, 0, 3)"), 3);
  EXPECT_TRUE(std::isnan(value("clip(0.0 / 0.0, 0, 3)")));
  EXPECT_EQ(value("sign(-3)"), -1);
  EXPECT_EQ(value("square(3)"), 9);
  EXPECT_EQ(value("reciprocal(2)"), 0);
  EXPECT_EQ(value("reciprocal(-1)"), -1);
  EXPECT_EQ(value("reciprocal(0)"), -9223372036854775807.0 - 1);
  EXPECT_EQ(value("isnan(0.0 / 0.0)"), 1);
  EXPECT_EQ(value("fmax(0.0 / 0.0, 1)"), 1.0);
  EXPECT_EQ(value("degrees(3.141592653589793)"), 180.0);
  // Casts of literals are typed constants, folded all the same.
  EXPECT_EQ(value("int32(2.9)"), 2);
  EXPECT_EQ(value("int32(-1e20)"), -2147483648.0);  // saturates (ops::Convert)
  EXPECT_EQ(value("int64(0.0 / 0.0)"), 0);          // NaN gives 0
  EXPECT_EQ(value("bool(0.5)"), 1);
  EXPECT_EQ(value("float32(0.1)"), static_cast<double>(0.1f));
}

TEST(Operators, CanonicalUsesNumPyNames) {
  EXPECT_EQ(CanonicalOf("i // j % 3"),
            "remainder<int32>(floor_divide<int32>(in0<int32>, in1<int32>), 3<int32>)");
  EXPECT_EQ(CanonicalOf("i & l | ~i"),
            "bitwise_or<int64>(bitwise_and<int64>(cast<int64>(in0<int32>), in1<int64>), "
            "cast<int64>(invert<int32>(in0<int32>)))");
  EXPECT_EQ(CanonicalOf("logical_and(x, i)"),
            "logical_and<bool>(cast<bool>(in1<float64>), cast<bool>(in0<int32>))");
  EXPECT_EQ(CanonicalOf("isnan(f)"), "isnan<bool>(in0<float32>)");
  EXPECT_EQ(CanonicalOf("clip(f, 0, 1)"),
            "min<float32>(max<float32>(in0<float32>, 0<float32>), 1<float32>)");
  EXPECT_EQ(CanonicalOf("round(f, 2)"),
            "div<float32>(rint<float32>(mul<float32>(in0<float32>, 100<float32>)), 100<float32>)");
  EXPECT_EQ(CanonicalOf("round(i, -1)"),
            "cast<int32>(mul<float64>(rint<float64>(div<float64>(cast<float64>(in0<int32>), "
            "10<float64>)), 10<float64>))");
  EXPECT_EQ(CanonicalOf("float32(i) + 1"), "add<float32>(cast<float32>(in0<int32>), 1<float32>)");
}

TEST(Operators, RoundWithScalarDecimalsKeepsOneShape) {
  // The sign of decimals picks the form at run time, so the IR (and canonical) do not
  // depend on its value.
  const auto canonical = [](int64_t decimals) {
    const InputMap inputs = {{"f", ArrayInput{DType::kFloat32}},
                             {"d", ScalarInput{DType::kInt64, 0, decimals}}};
    const absl::StatusOr<Program> p = CompileChecked("round(f, d)", inputs);
    EXPECT_OK(p);
    return p.ok() ? p->canonical() : "";
  };
  EXPECT_EQ(canonical(2), canonical(-3));
  EXPECT_EQ(canonical(2),
            "where<float32>(param4<bool>, div<float32>(rint<float32>(mul<float32>(in1<float32>, "
            "param0<float32>)), param1<float32>), mul<float32>(rint<float32>(div<float32>("
            "in1<float32>, param2<float32>)), param3<float32>))");
}

TEST(Operators, OpsPerElementCountsTheOperationsEachCallBecomes) {
  const auto ops = [](std::string_view text) {
    const absl::StatusOr<Program> p = CompileChecked(text, InputsFor(text));
    EXPECT_OK(p) << text;
    return p.ok() ? p->ops_per_element() : -1;
  };
  EXPECT_EQ(ops("x // y"), 1);
  EXPECT_EQ(ops("i << 2 | j"), 2);
  EXPECT_EQ(ops("clip(x, 0, 1)"), 2);  // max, min
  EXPECT_EQ(ops("round(x, 2)"), 3);    // mul, rint, div
  EXPECT_EQ(ops("float32(x)"), 0);     // a conversion
  EXPECT_EQ(ops("isnan(x) | ~b"), 3);
}

// ---------------------------------------------------------------------------------------
// Program

TEST(Program, InputsAreSortedAndIncludeScalars) {
  const InputMap inputs = {{"y", ArrayInput{DType::kFloat32}},
                           {"a", ScalarInput{DType::kFloat64, 2.0}},
                           {"x", ArrayInput{DType::kFloat32}}};
  const absl::StatusOr<Program> program = CompileChecked("a*x + y", inputs);
  ASSERT_OK(program);
  EXPECT_EQ(program->inputs(), (std::vector<std::string>{"a", "x", "y"}));
  EXPECT_EQ(program->result_dtype(), DType::kFloat32);
  EXPECT_EQ(program->ops_per_element(), 2);
  EXPECT_EQ(program->canonical(),
            "add<float32>(mul<float32>(param0<float32>, in1<float32>), in2<float32>)");
}

TEST(Program, CanonicalDependsOnDtypesNotScalarValues) {
  auto canonical = [](DType x, double a) {
    const InputMap inputs = {{"x", ArrayInput{x}}, {"a", ScalarInput{DType::kFloat64, a}}};
    return Compile("a * x + 1", inputs)->canonical();
  };
  EXPECT_EQ(canonical(DType::kFloat32, 2.0), canonical(DType::kFloat32, -7.25));
  EXPECT_NE(canonical(DType::kFloat32, 2.0), canonical(DType::kFloat64, 2.0));
  // Same text, same dtypes: same canonical.
  EXPECT_EQ(canonical(DType::kInt32, 1.0), canonical(DType::kInt32, 1.0));
  // Literals are part of the expression.
  const InputMap x = {{"x", ArrayInput{DType::kFloat32}}};
  EXPECT_NE(Compile("x + 1", x)->canonical(), Compile("x + 2", x)->canonical());
  // A scalar condition stays a runtime choice, so its value does not change the shape.
  auto where = [](int64_t flag) {
    const InputMap inputs = {{"x", ArrayInput{DType::kFloat32}},
                             {"s", ScalarInput{DType::kBool, 0, flag}}};
    return Compile("where(s, x, 0)", inputs)->canonical();
  };
  EXPECT_EQ(where(0), where(1));
}

TEST(Program, ParametersCarryTheScalarValues) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat32}},
                           {"a", ScalarInput{DType::kFloat64, 1.5}},
                           {"k", ScalarInput{DType::kInt64, 0, 4}}};
  const absl::StatusOr<Program> program = CompileChecked("a * x + k * 2", inputs);
  ASSERT_OK(program);
  std::vector<double> values;
  for (const Node& n : program->ir().nodes) {
    if (n.op == OpKind::kConstant && n.parameter >= 0) values.push_back(n.value.f);
  }
  EXPECT_EQ(values, (std::vector<double>{1.5, 8.0}));  // k * 2 is folded, still a parameter
}

TEST(Program, ReferenceWorkload) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat32}}};
  const absl::StatusOr<Program> program =
      CompileChecked("sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))", inputs);
  ASSERT_OK(program);
  EXPECT_EQ(program->result_dtype(), DType::kFloat32);
  // sqrt abs exp neg sin mul div sqrt abs mul tanh
  EXPECT_EQ(program->ops_per_element(), 11);
}

TEST(Program, CommonSubexpressionsAreShared) {
  const InputMap inputs = {{"x", ArrayInput{DType::kInt32}}};
  const absl::StatusOr<Program> program = CompileChecked("sin(x) * sin(x) + x / 2", inputs);
  ASSERT_OK(program);
  // in, cast, sin, mul, const 2, div, add: cast(x) and sin(x) appear once.
  EXPECT_EQ(program->ir().nodes.size(), 7u);
  EXPECT_EQ(program->ops_per_element(), 5);  // counted as written: sin sin * / +
}

TEST(Program, InputNamedLikeAFunction) {
  const InputMap inputs = {{"sin", ArrayInput{DType::kFloat64}}};
  const absl::StatusOr<Program> program = CompileChecked("sin(sin) + sin", inputs);
  ASSERT_OK(program);
  EXPECT_EQ(program->canonical(), "add<float64>(sin<float64>(in0<float64>), in0<float64>)");
}

TEST(Program, IndexIsAStrongInt64LeafWithItsAxisAsWritten) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat32}},
                           {"s", ScalarInput{DType::kFloat64, 0.5}}};
  absl::StatusOr<Program> program = CompileChecked("index(0)", {});
  ASSERT_OK(program);
  EXPECT_EQ(program->result_dtype(), DType::kInt64);
  EXPECT_TRUE(program->inputs().empty());
  EXPECT_EQ(program->canonical(), "index<int64>(0)");
  // An int64 array, as numpy.indices gives: with float32 it is float64 (NumPy 2), a
  // weak float scalar takes its dtype, and index(-1) is another axis than index(1).
  program = CompileChecked("x + index(-1) * s + index(1) + index(-1)", inputs);
  ASSERT_OK(program);
  EXPECT_EQ(program->result_dtype(), DType::kFloat64);
  EXPECT_EQ(IndexAxes(program->ir()), (std::vector<int64_t>{-1, 1}));  // shared, in node order
  program = CompileChecked("float32(index(2 - 1))", {});
  ASSERT_OK(program);
  EXPECT_EQ(program->canonical(), "cast<float32>(index<int64>(1))");
  EXPECT_EQ(ResolveIndexAxis(-1, 3), 2);
  EXPECT_EQ(ResolveIndexAxis(1, 3), 1);

  const std::vector<std::pair<std::string, std::string>> errors = {
      {"index(s)", "at position 6: the axis of index() must be an integer literal"},
      {"index(0.0)", "at position 6: the axis of index() must be an integer literal"},
      {"index(x)", "at position 6: the axis of index() must be an integer literal"},
      {"index()", "at position 0: function 'index' takes 1 argument, got 0"},
      {"index(0, 1)", "at position 0: function 'index' takes 1 argument, got 2"},
      {"index + x", "at position 0: function 'index' must be called with its arguments in "
                    "parentheses"}};
  for (const auto& [text, message] : errors) {
    InputMap used;
    for (const auto& [name, type] : inputs) {
      if (text.find(name) != std::string::npos) used.emplace(name, type);
    }
    const absl::StatusOr<Program> refused = Compile(text, used);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(refused.status().message()), message) << text;
  }
}

TEST(Program, CopiesShareState) {
  const InputMap inputs = {{"x", ArrayInput{DType::kFloat64}}};
  const Program a = *Compile("x + 1", inputs);
  const Program b = a;
  EXPECT_EQ(&a.canonical(), &b.canonical());
}

// ---------------------------------------------------------------------------------------
// Casting

TEST(CanCastSameKind, Table) {
  constexpr DType kAll[] = {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32,
                            DType::kFloat64};
  // expected[from][to], as np.can_cast(from, to, casting="same_kind").
  constexpr bool kExpected[5][5] = {
      //            bool   int32  int64  f32    f64
      /* bool  */ {true, true, true, true, true},
      /* int32 */ {false, true, true, true, true},
      /* int64 */ {false, true, true, true, true},
      /* f32   */ {false, false, false, true, true},
      /* f64   */ {false, false, false, true, true},
  };
  for (int f = 0; f < 5; ++f) {
    for (int t = 0; t < 5; ++t) {
      EXPECT_EQ(CanCastSameKind(kAll[f], kAll[t]), kExpected[f][t])
          << DTypeName(kAll[f]) << " -> " << DTypeName(kAll[t]);
    }
  }
}

TEST(ProgramCacheTest, ReusesOnlyWhatCompilesToTheSameProgram) {
  ProgramCache cache(10);
  const InputMap f32 = {{"x", ArrayInput{DType::kFloat32}}};
  ASSIGN_OR_FAIL(Program a, cache.Compile("x + 1", f32, kMaxNestingDepth));
  ASSIGN_OR_FAIL(Program again, cache.Compile("x + 1", f32, kMaxNestingDepth));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(&again.ir(), &a.ir()) << "the second compile should come from the cache";
  // Another dtype, another text, another depth, another input name: other programs.
  ASSIGN_OR_FAIL(Program f64,
                 cache.Compile("x + 1", {{"x", ArrayInput{DType::kFloat64}}}, kMaxNestingDepth));
  EXPECT_EQ(f64.result_dtype(), DType::kFloat64);
  ASSERT_OK(cache.Compile("x + 2", f32, kMaxNestingDepth).status());
  ASSERT_OK(cache.Compile("x + 1", f32, 16).status());
  ASSERT_OK(cache.Compile("y + 1", {{"y", ArrayInput{DType::kFloat32}}}, kMaxNestingDepth));
  EXPECT_EQ(cache.size(), 5u);
  // Scalars are baked in: another value is another program.
  ScalarInput two{DType::kFloat64, 2.0, 0};
  ScalarInput three{DType::kFloat64, 3.0, 0};
  ASSIGN_OR_FAIL(
      Program p2,
      cache.Compile("x * a", {{"x", ArrayInput{DType::kFloat32}}, {"a", two}}, kMaxNestingDepth));
  ASSIGN_OR_FAIL(
      Program p3,
      cache.Compile("x * a", {{"x", ArrayInput{DType::kFloat32}}, {"a", three}}, kMaxNestingDepth));
  EXPECT_NE(&p2.ir(), &p3.ir());
  EXPECT_EQ(cache.size(), 7u);
  // A depth that the text exceeds fails, though the same text compiled at a larger one.
  ASSERT_OK(cache.Compile("((x + 1))", f32, kMaxNestingDepth).status());
  EXPECT_EQ(cache.Compile("((x + 1))", f32, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // Errors are not kept, and come back the same each time.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(cache.Compile("x +", f32, kMaxNestingDepth).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(cache.size(), 8u);
  // Full: it starts over.
  ASSERT_OK(cache.Compile("x + 3", f32, kMaxNestingDepth).status());
  ASSERT_OK(cache.Compile("x + 4", f32, kMaxNestingDepth).status());
  EXPECT_EQ(cache.size(), 10u);
  ASSERT_OK(cache.Compile("x + 5", f32, kMaxNestingDepth).status());
  EXPECT_EQ(cache.size(), 1u);
}

}  // namespace
}  // namespace gpucompute::expr

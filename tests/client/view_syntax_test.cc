// The view syntax (client/cpp/view_syntax.h): every form, spaces, negative numbers and
// errors; ArrayRef's builders; the view shapes the client computes for downloads.
#include "client/cpp/view_syntax.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/array_ref.h"
#include "client/cpp/client.h"

namespace gpucompute {

// Failures show references in the view syntax.
void PrintTo(const ArrayRef& ref, std::ostream* out) { *out << ref.ToString(); }

namespace {

using view::At;
using view::Ellipsis;
using view::NewAxis;
using view::Slice;

ArrayRef ParseOk(std::string_view text) {
  absl::StatusOr<ArrayRef> ref = ParseArrayRef(text);
  EXPECT_TRUE(ref.ok()) << text << ": " << ref.status();
  return ref.ok() ? *ref : ArrayRef();
}

// The error message of parsing `text`, which must fail with INVALID_ARGUMENT.
std::string ParseError(std::string_view text) {
  absl::StatusOr<ArrayRef> ref = ParseArrayRef(text);
  EXPECT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(ref.status().message());
}

TEST(ViewSyntaxTest, PlainReferencesAreTakenAsTheyAre) {
  EXPECT_EQ(ParseOk("x"), ArrayRef("x"));
  EXPECT_EQ(ParseOk("  buf-0123456789abcdef0123456789abcdef "),
            ArrayRef("buf-0123456789abcdef0123456789abcdef"));
  // Dots that start no suffix, colons, '#' and inner spaces belong to the name.
  EXPECT_EQ(ParseOk("data.v1"), ArrayRef("data.v1"));
  EXPECT_EQ(ParseOk("x.Transpose"), ArrayRef("x.Transpose"));
  EXPECT_EQ(ParseOk("x.Tx"), ArrayRef("x.Tx"));
  EXPECT_EQ(ParseOk("tag:#1"), ArrayRef("tag:#1"));
  EXPECT_EQ(ParseOk("my array"), ArrayRef("my array"));
  EXPECT_FALSE(ParseOk("x").is_view());
}

TEST(ViewSyntaxTest, IndexingForms) {
  const ArrayRef x("x");
  EXPECT_EQ(ParseOk("x[0:10, ::2]"), x.Index({Slice(0, 10), Slice({}, {}, 2)}));
  EXPECT_EQ(ParseOk("x[-1]"), x.Index({At(-1)}));
  EXPECT_EQ(ParseOk("x[..., None]"), x.Index({Ellipsis(), NewAxis()}));
  EXPECT_EQ(ParseOk("x[:]"), x.Index({Slice()}));
  EXPECT_EQ(ParseOk("x[::]"), x.Index({Slice()}));
  EXPECT_EQ(ParseOk("x[1:]"), x.Index({Slice(1)}));
  EXPECT_EQ(ParseOk("x[:-1]"), x.Index({Slice({}, -1)}));
  EXPECT_EQ(ParseOk("x[::-1]"), x.Index({Slice({}, {}, -1)}));
  EXPECT_EQ(ParseOk("x[-2:-8:-3]"), x.Index({Slice(-2, -8, -3)}));
  EXPECT_EQ(ParseOk("x[+3]"), x.Index({At(3)}));
  EXPECT_EQ(ParseOk("x[0,]"), x.Index({At(0)}));
  EXPECT_EQ(ParseOk("x[]"), x.Index({}));
  EXPECT_EQ(ParseOk("x[-9223372036854775808:9223372036854775807]"),
            x.Index({Slice(INT64_MIN, INT64_MAX)}));
  EXPECT_EQ(ParseOk("x[0][1:2]"), x.Index({At(0)}).Index({Slice(1, 2)}));
}

TEST(ViewSyntaxTest, MethodForms) {
  const ArrayRef x("x");
  EXPECT_EQ(ParseOk("x.T"), x.T());
  EXPECT_EQ(ParseOk("x.transpose()"), x.Transpose());
  EXPECT_EQ(ParseOk("x.transpose(1, 0, 2)"), x.Transpose({1, 0, 2}));
  EXPECT_EQ(ParseOk("x.transpose((1, 0, -1))"), x.Transpose({1, 0, -1}));
  EXPECT_EQ(ParseOk("x.reshape(2, -1)"), x.Reshape({2, -1}));
  EXPECT_EQ(ParseOk("x.reshape((2, -1))"), x.Reshape({2, -1}));
  EXPECT_EQ(ParseOk("x.reshape()"), x.Reshape({}));
  EXPECT_EQ(ParseOk("x.squeeze()"), x.Squeeze());
  EXPECT_EQ(ParseOk("x.squeeze(0)"), x.Squeeze({0}));
  EXPECT_EQ(ParseOk("x.squeeze(0, -1)"), x.Squeeze({0, -1}));
  EXPECT_EQ(ParseOk("x.expand_dims(0)"), x.ExpandDims({0}));
  EXPECT_EQ(ParseOk("x.expand_dims(-1, 0,)"), x.ExpandDims({-1, 0}));
  EXPECT_EQ(ParseOk("x.broadcast_to(4, 3)"), x.BroadcastTo({4, 3}));
  EXPECT_EQ(ParseOk("x.broadcast_to((4, 3))"), x.BroadcastTo({4, 3}));
}

TEST(ViewSyntaxTest, SuffixesChainInAnyOrder) {
  const ArrayRef x("x");
  EXPECT_EQ(ParseOk("x[0:10, ::2].T"), x.Index({Slice(0, 10), Slice({}, {}, 2)}).T());
  EXPECT_EQ(ParseOk("x.T[0:10, ::2]"), x.T().Index({Slice(0, 10), Slice({}, {}, 2)}));
  EXPECT_EQ(ParseOk("x.T.T"), x.T().T());
  EXPECT_EQ(ParseOk("x.reshape(4, 6)[1].expand_dims(0).broadcast_to(3, 1, 6).squeeze(1)"),
            x.Reshape({4, 6}).Index({At(1)}).ExpandDims({0}).BroadcastTo({3, 1, 6}).Squeeze({1}));
  EXPECT_EQ(ParseOk("data.v1[0]"), ArrayRef("data.v1").Index({At(0)}));
  EXPECT_EQ(ParseOk("tag:#1.T"), ArrayRef("tag:#1").T());
}

TEST(ViewSyntaxTest, SpacesAroundEveryToken) {
  const ArrayRef expected = ArrayRef("x").Index({Slice(0, 10), Slice({}, {}, -2)}).T().Reshape(
      {2, -1});
  EXPECT_EQ(ParseOk("x[0:10,::-2].T.reshape(2,-1)"), expected);
  EXPECT_EQ(ParseOk(" x [ 0 : 10 , : : -2 ] .T . reshape ( 2 , -1 ) "), expected);
  EXPECT_EQ(ParseOk("\tx\t[\t0:10, ::-2\t]\t.T.reshape( ( 2, -1 ) )"), expected);
}

TEST(ViewSyntaxTest, FormatReadsBackAsTheSameReference) {
  for (const char* text :
       {"x", "x[0:10, ::2]", "x[-1]", "x[..., None]", "x.T", "x.transpose(1, 0, 2)",
        "x.reshape(2, -1)", "x.squeeze()", "x.squeeze(0)", "x.expand_dims(0)",
        "x.broadcast_to(4, 3)", "x[0:10, ::2].T", "x[]", "x[:, 1:, :-1, ::-3, 2:5:7]"}) {
    const ArrayRef ref = ParseOk(text);
    EXPECT_EQ(ref.ToString(), text);
    EXPECT_EQ(ParseOk(ref.ToString()), ref);
  }
}

TEST(ViewSyntaxTest, ErrorsGiveThePositionAndWhatWasExpected) {
  EXPECT_EQ(ParseError(""), "in '' at position 1: expected a buffer id or name, found the end");
  EXPECT_EQ(ParseError("[0]"),
            "in '[0]' at position 1: expected a buffer id or name, found '['");
  EXPECT_EQ(ParseError("x[0"), "in 'x[0' at position 4: expected ',' or ']', found the end");
  EXPECT_EQ(ParseError("x[a]"),
            "in 'x[a]' at position 3: expected an integer, a slice, None or '...', found 'a'");
  EXPECT_EQ(ParseError("x[0:1:2:3]"),
            "in 'x[0:1:2:3]' at position 8: expected ',' or ']', found ':'");
  EXPECT_EQ(ParseError("x[::0]"),
            "in 'x[::0]' at position 5: expected a nonzero slice step, found '0'");
  EXPECT_EQ(ParseError("x[,]"),
            "in 'x[,]' at position 3: expected an integer, a slice, None or '...', found ','");
  EXPECT_EQ(ParseError("x[0]junk"),
            "in 'x[0]junk' at position 5: expected '[', '.T' or a method (.transpose .reshape "
            ".squeeze .expand_dims .broadcast_to), found 'j'");
  EXPECT_EQ(ParseError("x.T.foo"),
            "in 'x.T.foo' at position 5: expected '[', '.T' or a method (.transpose .reshape "
            ".squeeze .expand_dims .broadcast_to), found 'f'");
  EXPECT_EQ(ParseError("x.reshape(2, -1"),
            "in 'x.reshape(2, -1' at position 16: expected ',' or ')', found the end");
  EXPECT_EQ(ParseError("x.reshape(2 3)"),
            "in 'x.reshape(2 3)' at position 13: expected ',' or ')', found '3'");
  EXPECT_EQ(ParseError("x.transpose(a)"),
            "in 'x.transpose(a)' at position 13: expected an integer or ')', found 'a'");
  EXPECT_EQ(ParseError("x.reshape((2, 3)"),
            "in 'x.reshape((2, 3)' at position 17: expected ')', found the end");
  EXPECT_EQ(ParseError("x[9223372036854775808]"),
            "in 'x[9223372036854775808]' at position 3: expected an integer in "
            "[-9223372036854775808, 9223372036854775807], not 9223372036854775808, found '9'");
  EXPECT_EQ(ParseError("x[99999999999999999999999]"),
            "in 'x[99999999999999999999999]' at position 3: expected an integer in "
            "[-9223372036854775808, 9223372036854775807], not 99999999999999999999999, "
            "found '9'");
  EXPECT_EQ(ParseError("x.squeeze(2147483648)"),
            "in 'x.squeeze(2147483648)' at position 11: expected an integer in "
            "[-2147483648, 2147483647], not 2147483648, found '2'");
  EXPECT_EQ(ParseError("x.broadcast_to(4, -3)"),
            "in 'x.broadcast_to(4, -3)' at position 19: expected an integer in "
            "[0, 9223372036854775807], not -3, found '-'");
}

std::vector<uint64_t> ShapeOk(std::vector<uint64_t> shape, std::string_view text) {
  const ArrayRef ref = ParseOk(text);
  absl::StatusOr<std::vector<uint64_t>> result = ViewShape(shape, ref.steps());
  EXPECT_TRUE(result.ok()) << text << ": " << result.status();
  return result.ok() ? *result : std::vector<uint64_t>{999};
}

TEST(ViewShapeTest, ShapesAsNumPyGivesThem) {
  using S = std::vector<uint64_t>;
  EXPECT_EQ(ShapeOk({20, 7}, "x[0:10, ::2]"), (S{10, 4}));
  EXPECT_EQ(ShapeOk({20, 7}, "x[-1]"), (S{7}));
  EXPECT_EQ(ShapeOk({20, 7}, "x[..., None]"), (S{20, 7, 1}));
  EXPECT_EQ(ShapeOk({2, 3, 4}, "x[None, ..., 1]"), (S{1, 2, 3}));
  EXPECT_EQ(ShapeOk({20, 7}, "x.T"), (S{7, 20}));
  EXPECT_EQ(ShapeOk({2, 3, 4}, "x.transpose(1, 0, 2)"), (S{3, 2, 4}));
  EXPECT_EQ(ShapeOk({2, 3, 4}, "x.transpose(-1, 0, 1)"), (S{4, 2, 3}));
  EXPECT_EQ(ShapeOk({2, 3, 4}, "x.reshape(2, -1)"), (S{2, 12}));
  EXPECT_EQ(ShapeOk({1, 3, 1}, "x.squeeze()"), (S{3}));
  EXPECT_EQ(ShapeOk({1, 3, 1}, "x.squeeze(-1)"), (S{1, 3}));
  EXPECT_EQ(ShapeOk({3}, "x.expand_dims(0)"), (S{1, 3}));
  EXPECT_EQ(ShapeOk({3}, "x.expand_dims(0, -1)"), (S{1, 3, 1}));
  EXPECT_EQ(ShapeOk({3}, "x.broadcast_to(4, 3)"), (S{4, 3}));
  EXPECT_EQ(ShapeOk({10}, "x[::-1]"), (S{10}));
  EXPECT_EQ(ShapeOk({10}, "x[8:2:-3]"), (S{2}));
  EXPECT_EQ(ShapeOk({10}, "x[-100:100]"), (S{10}));
  EXPECT_EQ(ShapeOk({10}, "x[100::-1]"), (S{10}));
  EXPECT_EQ(ShapeOk({10}, "x[5:2]"), (S{0}));
  EXPECT_EQ(ShapeOk({10}, "x[::-9223372036854775808]"), (S{1}));
  EXPECT_EQ(ShapeOk({10}, "x[-9223372036854775808:9223372036854775807:9223372036854775807]"),
            (S{1}));
  EXPECT_EQ(ShapeOk({}, "x[None]"), (S{1}));
  EXPECT_EQ(ShapeOk({0, 4}, "x.reshape(-1, 2)"), (S{0, 2}));
}

TEST(ViewShapeTest, StepsThatDoNotApplyNameTheStepAndShape) {
  auto error = [](std::vector<uint64_t> shape, std::string_view text) {
    absl::StatusOr<std::vector<uint64_t>> result = ViewShape(shape, ParseOk(text).steps());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(result.status().message());
  };
  EXPECT_EQ(error({3}, "x[3]"),
            "view step 0 (index) does not apply to shape (3,): index 3 is out of range for axis "
            "0 of length 3");
  EXPECT_EQ(error({3}, "x[0, 0]"),
            "view step 0 (index) does not apply to shape (3,): 2 indices for 1 axes");
  EXPECT_EQ(error({3, 4}, "x.T.transpose(0)"),
            "view step 1 (transpose) does not apply to shape (4, 3): 1 axes do not permute 2");
  EXPECT_EQ(error({3, 4}, "x.reshape(5, -1)"),
            "view step 0 (reshape) does not apply to shape (3, 4): cannot reshape 12 elements "
            "into (5, -1)");
  EXPECT_EQ(error({3, 4}, "x.reshape(-1, -1)"),
            "view step 0 (reshape) does not apply to shape (3, 4): only one extent may be -1");
  EXPECT_EQ(error({3, 4}, "x.reshape(4294967296, 4294967296)"),
            "view step 0 (reshape) does not apply to shape (3, 4): cannot reshape 12 elements "
            "into (4294967296, 4294967296)");
  EXPECT_EQ(error({3, 4}, "x.squeeze(0)"),
            "view step 0 (squeeze) does not apply to shape (3, 4): axis 0 has length 3, not 1");
  EXPECT_EQ(error({3, 4}, "x.broadcast_to(4, 3)"),
            "view step 0 (broadcast_to) does not apply to shape (3, 4): it does not broadcast "
            "to (4, 3)");
  EXPECT_EQ(error({3}, "x.expand_dims(0, 0)"),
            "view step 0 (expand_dims) does not apply to shape (3,): axis 0 is repeated");
  EXPECT_EQ(error({3}, "x.expand_dims(2)"),
            "view step 0 (expand_dims) does not apply to shape (3,): axis 2 is out of range for "
            "2 axes");
}

TEST(ViewShapeTest, ViewBytesCountTheViewsElements) {
  v1::BufferInfo info;
  info.set_dtype(v1::DTYPE_FLOAT32);
  info.add_shape(20);
  info.add_shape(7);
  info.set_size_bytes(20 * 7 * 4);
  EXPECT_EQ(*ViewBytes(info, {}), 560u);
  EXPECT_EQ(*ViewBytes(info, ParseOk("x[0:10, ::2]").steps()), 10u * 4 * 4);
  EXPECT_EQ(*ViewBytes(info, ParseOk("x[None].broadcast_to(1000, 20, 7)").steps()),
            1000u * 560);
  EXPECT_EQ(ViewBytes(info, ParseOk("x.broadcast_to(4294967296, 4294967296, 20, 7)").steps())
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
}

TEST(RequestBuildersTest, ViewsGoWhereTheProtoTakesThem) {
  const ArrayRef v = ParseOk("a[::2].T");
  v1::SubmitRequest eval = Elementwise("x + 1", {{"x", BufferOperand(v)}}, ExistingOutput(v));
  EXPECT_EQ(eval.elementwise().inputs().at("x").buffer(), "a");
  EXPECT_EQ(eval.elementwise().inputs().at("x").view_size(), 2);
  EXPECT_EQ(eval.elementwise().output().view_size(), 2);
  // A plain string is a whole buffer, as before.
  EXPECT_EQ(BufferOperand("a[0]").buffer(), "a[0]");
  EXPECT_EQ(BufferOperand("a[0]").view_size(), 0);

  v1::SubmitRequest reduce =
      ReduceOver(v1::REDUCE_KIND_VAR, v, {.axes = std::vector<int32_t>{0, -1}, .keepdims = true,
                                          .ddof = 1});
  EXPECT_EQ(reduce.reduce().input(), "a");
  EXPECT_EQ(reduce.reduce().input_view_size(), 2);
  EXPECT_EQ(reduce.reduce().axes().axes_size(), 2);
  EXPECT_EQ(reduce.reduce().axes().axes(1), -1);
  EXPECT_TRUE(reduce.reduce().keepdims());
  EXPECT_EQ(reduce.reduce().ddof(), 1);
  EXPECT_FALSE(reduce.reduce().has_axis());
  // axis=(): present and empty.
  EXPECT_TRUE(
      ReduceOver(v1::REDUCE_KIND_SUM, "a", {.axes = std::vector<int32_t>{}}).reduce().has_axes());
  EXPECT_FALSE(ReduceOver(v1::REDUCE_KIND_SUM, "a", {}).reduce().has_axes());

  v1::SubmitRequest fused = ReduceExpression(
      v1::REDUCE_KIND_SUM, "x*y", {{"x", BufferOperand("a")}, {"y", BufferOperand(v)}});
  EXPECT_EQ(fused.reduce().expression(), "x*y");
  EXPECT_TRUE(fused.reduce().input().empty());
  EXPECT_EQ(fused.reduce().inputs().at("y").view_size(), 2);

  v1::SubmitRequest gemv = Gemv(v, "x");
  EXPECT_EQ(gemv.gemv().a_view_size(), 2);
  EXPECT_EQ(gemv.gemv().x_view_size(), 0);

  v1::SubmitRequest matmul = Matmul(v, ArrayRef("b").T(), ExistingOutput("c"),
                                    {.transpose_a = true, .alpha = 2, .beta = 0.5,
                                     .allow_tf32 = true});
  EXPECT_EQ(matmul.matmul().a(), "a");
  EXPECT_EQ(matmul.matmul().a_view_size(), 2);
  EXPECT_EQ(matmul.matmul().b(), "b");
  EXPECT_EQ(matmul.matmul().b_view_size(), 1);
  EXPECT_EQ(matmul.matmul().c().buffer(), "c");
  EXPECT_TRUE(matmul.matmul().transpose_a());
  EXPECT_FALSE(matmul.matmul().transpose_b());
  EXPECT_EQ(matmul.matmul().alpha(), 2);
  EXPECT_EQ(matmul.matmul().beta(), 0.5);
  EXPECT_TRUE(matmul.matmul().allow_tf32());

  EXPECT_EQ(DownloadOf(v).view_size(), 2);
  EXPECT_EQ(DownloadOf(v).buffer(), "a");
}

}  // namespace
}  // namespace gpucompute

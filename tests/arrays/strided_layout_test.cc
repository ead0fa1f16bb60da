// The view and broadcasting arithmetic against NumPy's answers, worked out by hand below,
// and against a brute-force model: every element a view reaches is the element NumPy's
// view of a C-ordered arange would hold.
#include "server/arrays/strided_layout.h"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpucompute {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kMaxDims = 8;

IndexItem Item(IndexItem::Kind kind) {
  IndexItem item;
  item.kind = kind;
  return item;
}
IndexItem Idx(int64_t i) {
  IndexItem item = Item(IndexItem::Kind::kIndex);
  item.index = i;
  return item;
}
IndexItem Sl(std::optional<int64_t> start, std::optional<int64_t> stop,
             std::optional<int64_t> step = std::nullopt) {
  IndexItem item = Item(IndexItem::Kind::kSlice);
  item.start = start;
  item.stop = stop;
  item.step = step;
  return item;
}
IndexItem NewAxis() { return Item(IndexItem::Kind::kNewAxis); }
IndexItem Ellipsis() { return Item(IndexItem::Kind::kEllipsis); }

// The element offsets of a layout, in C order of its index space.
std::vector<int64_t> Offsets(const StridedLayout& l) {
  std::vector<int64_t> out;
  std::vector<int64_t> idx(l.ndim(), 0);
  const int64_t n = l.num_elements();
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = l.offset;
    for (int d = 0; d < l.ndim(); ++d) off += idx[d] * l.strides[d];
    out.push_back(off);
    for (int d = l.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < l.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

TEST(StridedLayoutTest, DenseLayouts) {
  StridedLayout c = DenseLayout({2, 3, 4}, false);
  EXPECT_THAT(c.strides, ElementsAre(12, 4, 1));
  EXPECT_TRUE(c.IsCContiguous());
  EXPECT_FALSE(c.IsFContiguous());
  StridedLayout f = DenseLayout({2, 3, 4}, true);
  EXPECT_THAT(f.strides, ElementsAre(1, 2, 6));
  EXPECT_TRUE(f.IsFContiguous());
  // Unit axes have stride 0 and do not spoil contiguity.
  StridedLayout u = DenseLayout({3, 1}, false);
  EXPECT_THAT(u.strides, ElementsAre(1, 0));
  EXPECT_TRUE(u.IsCContiguous());
  EXPECT_TRUE(u.IsFContiguous());
  EXPECT_EQ(DenseLayout({}, false).num_elements(), 1);
}

TEST(StridedLayoutTest, BasicIndexingMatchesNumpy) {
  const StridedLayout x = DenseLayout({4, 6}, false);  // np.arange(24).reshape(4, 6)
  // x[1:3, ::2]
  absl::StatusOr<StridedLayout> v = IndexView(x, {{Sl(1, 3), Sl({}, {}, 2)}}, kMaxDims);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->shape, ElementsAre(2, 3));
  EXPECT_THAT(Offsets(*v), ElementsAre(6, 8, 10, 12, 14, 16));
  // x[::-1, 4:0:-3]
  v = IndexView(x, {{Sl({}, {}, -1), Sl(4, 0, -3)}}, kMaxDims);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(Offsets(*v), ElementsAre(22, 19, 16, 13, 10, 7, 4, 1));
  // x[-1] drops the axis; x[..., 2] and x[:, np.newaxis, 5]
  v = IndexView(x, {{Idx(-1)}}, kMaxDims);
  EXPECT_THAT(Offsets(*v), ElementsAre(18, 19, 20, 21, 22, 23));
  v = IndexView(x, {{Ellipsis(), Idx(2)}}, kMaxDims);
  EXPECT_THAT(Offsets(*v), ElementsAre(2, 8, 14, 20));
  v = IndexView(x, {{Sl({}, {}), NewAxis(), Idx(5)}}, kMaxDims);
  EXPECT_THAT(v->shape, ElementsAre(4, 1));
  EXPECT_THAT(Offsets(*v), ElementsAre(5, 11, 17, 23));
  // Python's clamping: x[10:], x[-100:2], x[5:-100:-1]
  v = IndexView(x, {{Sl(10, {})}}, kMaxDims);
  EXPECT_EQ(v->num_elements(), 0);
  v = IndexView(x, {{Sl(-100, 2)}}, kMaxDims);
  EXPECT_THAT(v->shape, ElementsAre(2, 6));
  v = IndexView(x, {{Sl(5, -100, -1), Idx(0)}}, kMaxDims);
  EXPECT_THAT(Offsets(*v), ElementsAre(18, 12, 6, 0));
  // Extreme steps and bounds take one element or none, without overflow.
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  v = IndexView(x, {{Sl({}, {}, kMin), Sl(kMin, kMax, kMax)}}, kMaxDims);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(Offsets(*v), ElementsAre(18));
}

TEST(StridedLayoutTest, IndexingErrorsSayWhatNumpySays) {
  const StridedLayout x = DenseLayout({4, 6}, false);
  auto message = [&](std::vector<IndexItem> items) {
    return std::string(IndexView(x, items, kMaxDims).status().message());
  };
  EXPECT_EQ(message({Idx(4)}), "index 4 is out of bounds for axis 0 with size 4");
  EXPECT_EQ(message({Sl({}, {}), Idx(-7)}), "index -7 is out of bounds for axis 1 with size 6");
  EXPECT_EQ(message({Idx(0), Idx(0), Idx(0)}),
            "too many indices for array: array is 2-dimensional, but 3 were indexed");
  EXPECT_EQ(message({Sl({}, {}, 0)}), "slice step cannot be zero");
  EXPECT_EQ(message({Ellipsis(), Ellipsis()}), "an index can only have a single ellipsis ('...')");
  std::vector<IndexItem> many(kMaxDims, NewAxis());
  EXPECT_THAT(message(many), HasSubstr("would have 10 dimensions"));
}

TEST(StridedLayoutTest, TransposeExpandSqueeze) {
  const StridedLayout x = DenseLayout({2, 3, 4}, false);
  absl::StatusOr<StridedLayout> t = TransposeView(x, {});
  EXPECT_THAT(t->shape, ElementsAre(4, 3, 2));
  EXPECT_THAT(t->strides, ElementsAre(1, 4, 12));
  EXPECT_TRUE(t->IsFContiguous());
  t = TransposeView(x, std::vector<int32_t>{1, -1, 0});
  EXPECT_THAT(t->shape, ElementsAre(3, 4, 2));
  EXPECT_EQ(TransposeView(x, std::vector<int32_t>{0, 0, 1}).status().message(),
            "repeated axis in transpose");
  EXPECT_EQ(TransposeView(x, std::vector<int32_t>{0, 3, 1}).status().message(),
            "axis 3 is out of bounds for array of dimension 3");
  EXPECT_THAT(TransposeView(x, std::vector<int32_t>{0, 1}).status().message(),
              HasSubstr("axes don't match array"));

  absl::StatusOr<StridedLayout> e = ExpandDimsView(x, std::vector<int32_t>{0, -1}, kMaxDims);
  EXPECT_THAT(e->shape, ElementsAre(1, 2, 3, 4, 1));
  EXPECT_EQ(Offsets(*e), Offsets(x));
  EXPECT_EQ(ExpandDimsView(x, std::vector<int32_t>{5}, kMaxDims).status().message(),
            "axis 5 is out of bounds for array of dimension 4");

  absl::StatusOr<StridedLayout> s = SqueezeView(*e, {});
  EXPECT_THAT(s->shape, ElementsAre(2, 3, 4));
  s = SqueezeView(*e, std::vector<int32_t>{-1});
  EXPECT_THAT(s->shape, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(SqueezeView(x, std::vector<int32_t>{1}).status().message(),
              HasSubstr("cannot select an axis to squeeze out which has size not equal to one"));
}

TEST(StridedLayoutTest, BroadcastTo) {
  const StridedLayout row = DenseLayout({1, 3}, false);
  absl::StatusOr<StridedLayout> b = BroadcastToView(row, std::vector<int64_t>{2, 2, 3}, kMaxDims);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(Offsets(*b), ElementsAre(0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2));
  EXPECT_TRUE(b->HasBroadcast());
  // An empty array reaches no element twice, though its dense strides have zeros.
  EXPECT_FALSE(DenseLayout({3, 0}, false).HasBroadcast());
  EXPECT_FALSE(DenseLayout({4, 5, 0}, true).HasBroadcast());
  EXPECT_EQ(BroadcastToView(row, std::vector<int64_t>{2, 4}, kMaxDims).status().message(),
            "cannot broadcast an array of shape (1,3) to shape (2,4)");
  const int64_t kBig = int64_t{1} << 40;
  EXPECT_THAT(
      BroadcastToView(row, std::vector<int64_t>{kBig, kBig, 3}, kMaxDims).status().message(),
      HasSubstr("overflow"));
}

TEST(StridedLayoutTest, ReshapeWithoutCopy) {
  const StridedLayout x = DenseLayout({4, 6}, false);
  absl::StatusOr<StridedLayout> r = ReshapeView(x, std::vector<int64_t>{2, -1, 3}, kMaxDims);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->shape, ElementsAre(2, 4, 3));
  EXPECT_EQ(Offsets(*r), Offsets(x));
  // A column slice x[:, 1:3] keeps runs of 2: (4, 2) -> (8,) needs a copy, (2, 2, 2) not.
  absl::StatusOr<StridedLayout> cols = IndexView(x, {{Sl({}, {}), Sl(1, 3)}}, kMaxDims);
  EXPECT_THAT(ReshapeView(*cols, std::vector<int64_t>{8}, kMaxDims).status().message(),
              HasSubstr("without copying its elements"));
  r = ReshapeView(*cols, std::vector<int64_t>{2, 2, 2}, kMaxDims);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Offsets(*r), Offsets(*cols));
  // The transpose of a C array reshapes only where NumPy's would without a copy.
  absl::StatusOr<StridedLayout> t = TransposeView(x, {});
  EXPECT_FALSE(ReshapeView(*t, std::vector<int64_t>{24}, kMaxDims).ok());
  r = ReshapeView(*t, std::vector<int64_t>{3, 2, 4}, kMaxDims);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Offsets(*r), Offsets(*t));
  EXPECT_EQ(ReshapeView(x, std::vector<int64_t>{5, -1}, kMaxDims).status().message(),
            "cannot reshape array of size 24 into shape (5,-1)");
  EXPECT_THAT(ReshapeView(x, std::vector<int64_t>{-1, -1}, kMaxDims).status().message(),
              HasSubstr("one extent of -1"));
}

TEST(StridedLayoutTest, BroadcastShapes) {
  std::vector<std::vector<int64_t>> shapes = {{8, 1, 6, 1}, {7, 1, 5}, {}};
  absl::StatusOr<std::vector<int64_t>> s = BroadcastShapes(shapes);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(*s, ElementsAre(8, 7, 6, 5));
  shapes = {{2, 3}, {4}};
  EXPECT_EQ(BroadcastShapes(shapes).status().message(),
            "operands could not be broadcast together with shapes (2,3) (4,)");
  shapes = {{0, 3}, {1, 3}};
  EXPECT_THAT(*BroadcastShapes(shapes), ElementsAre(0, 3));
  // Bounded operands whose broadcast shape cannot be counted in 64 bits.
  const int64_t kBig = int64_t{1} << 32;
  shapes = {{kBig, 1}, {1, kBig}};
  EXPECT_THAT(BroadcastShapes(shapes).status().message(), HasSubstr("overflows 64 bits"));
  // An empty broadcast shape counts 0 elements, however large its other extents.
  shapes = {{kBig, 1, 0}, {1, kBig, 1}};
  ASSERT_TRUE(BroadcastShapes(shapes).ok());
  StridedLayout empty = *BroadcastToView(DenseLayout({1, 1, 0}, false),
                                         *BroadcastShapes(shapes), kMaxDims);
  EXPECT_EQ(empty.num_elements(), 0);
  EXPECT_TRUE(empty.IsCContiguous());
}

TEST(StridedLayoutTest, Overlap) {
  const StridedLayout x = DenseLayout({10}, false);
  auto slice = [&](int64_t a, int64_t b, int64_t step = 1) {
    return *IndexView(x, {{Sl(a, b, step)}}, kMaxDims);
  };
  EXPECT_EQ(CompareOverlap(x, x), Overlap::kSame);
  EXPECT_EQ(CompareOverlap(slice(0, 5), slice(5, 10)), Overlap::kDisjoint);
  EXPECT_EQ(CompareOverlap(slice(0, 5), slice(1, 6)), Overlap::kPartial);
  EXPECT_EQ(CompareOverlap(slice(0, 5), slice(4, {}, -1)), Overlap::kPartial);
}

TEST(StridedLayoutTest, CoalesceKeepsTheIterationOrder) {
  StridedLayout a = DenseLayout({4, 5, 6}, false);
  StridedLayout m = *BroadcastToView(DenseLayout({4, 1, 1}, false), std::vector<int64_t>{4, 5, 6},
                                     kMaxDims);
  std::vector<int64_t> before_a = Offsets(a), before_m = Offsets(m);
  std::vector<StridedLayout*> both = {&a, &m};
  CoalesceAxes(both);
  EXPECT_THAT(a.shape, ElementsAre(4, 30));
  EXPECT_THAT(m.strides, ElementsAre(1, 0));
  EXPECT_EQ(Offsets(a), before_a);
  EXPECT_EQ(Offsets(m), before_m);
  StridedLayout c = DenseLayout({3, 1, 7}, false);
  std::vector<StridedLayout*> one = {&c};
  CoalesceAxes(one);
  EXPECT_THAT(c.shape, ElementsAre(21));
}

// Random chains of steps on random shapes: every offset a view reaches is one its base
// reaches, and TouchedSpan bounds them exactly.
TEST(StridedLayoutTest, RandomViewsStayInsideTheirBase) {
  std::mt19937_64 rng(20261127);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint64_t> shape(pick(0, 4));
    for (auto& e : shape) e = pick(0, 5);
    StridedLayout v = DenseLayout(shape, pick(0, 1) == 1);
    const int64_t size = v.num_elements();
    for (int step = 0; step < 4; ++step) {
      absl::StatusOr<StridedLayout> next;
      switch (pick(0, 3)) {
        case 0: {
          std::vector<IndexItem> items;
          for (int d = 0; d < v.ndim() && pick(0, 3) > 0; ++d) {
            if (v.shape[d] > 0 && pick(0, 2) == 0) {
              items.push_back(Idx(pick(-v.shape[d], v.shape[d] - 1)));
            } else {
              int64_t st = pick(-3, 3);
              items.push_back(Sl(pick(-7, 7), pick(-7, 7), st == 0 ? 1 : st));
            }
          }
          next = IndexView(v, items, kMaxDims);
          break;
        }
        case 1:
          next = TransposeView(v, {});
          break;
        case 2:
          next = ExpandDimsView(v, std::vector<int32_t>{0}, kMaxDims);
          break;
        case 3:
          next = ReshapeView(v, std::vector<int64_t>{-1}, kMaxDims);
          break;
      }
      if (next.ok()) v = *next;
    }
    absl::StatusOr<ElementSpan> span = TouchedSpan(v);
    ASSERT_TRUE(span.ok());
    std::vector<int64_t> offsets = Offsets(v);
    for (int64_t o : offsets) {
      ASSERT_GE(o, 0);
      ASSERT_LT(o, size);
    }
    if (!offsets.empty()) {
      EXPECT_EQ(*std::min_element(offsets.begin(), offsets.end()), span->first);
      EXPECT_EQ(*std::max_element(offsets.begin(), offsets.end()), span->last);
    }
  }
}

}  // namespace
}  // namespace gpucompute

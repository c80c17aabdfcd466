#include <gmock/gmock.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/nn/max_pool2d_lanes.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using ir::Ints;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {

ir::Attrs pool_attrs(Ints kernel, Ints stride = {}, Ints pad = {0, 0}) {
  return {{"kernel", kernel}, {"stride", stride}, {"pad", pad}};
}

ir::Attrs with_relu(ir::Attrs a) {
  a.set("activation", std::string("relu"));
  return a;
}

}  // namespace

// Finite differences are meaningless where the maximum is not unique: inputs are distinct.
static const std::vector<OpCase> kMaxPool = {
    OpCase().shapes({{2, 3, 8, 8}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{2, 3, 7, 7}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{1, 2, 7, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})).avoid_ties(),
    OpCase().shapes({{2, 1, 6, 5}}).attrs(pool_attrs({3, 2}, {1, 2}, {1, 0})).avoid_ties(),
    OpCase().shapes({{1, 3, 5, 5}}).attrs(pool_attrs({3, 3}, {1, 1})).avoid_ties(),
    OpCase().shapes({{3, 2, 4, 4}}).attrs(pool_attrs({1, 1}, {2, 2})).avoid_ties(),
    OpCase().shapes({{1, 1, 1, 1}}).attrs(pool_attrs({1, 1})).avoid_ties(),
    OpCase().shapes({{2, 2, 5, 5}}).attrs(pool_attrs({5, 5})).avoid_ties(),
    OpCase().shapes({{4, 8, 12, 12}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{2, 16, 9, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})).avoid_ties(),
    OpCase().shapes({{1, 1, 7, 7}}).attrs(pool_attrs({7, 7}, {1, 1}, {3, 3})).avoid_ties(),
    // A fused relu: the evenly spaced inputs keep every maximum at least half a spacing (> 5e-3)
    // from relu's kink at 0.
    OpCase().shapes({{2, 4, 6, 6}}).attrs(with_relu(pool_attrs({2, 2}))).avoid_ties(),
    OpCase()
        .shapes({{1, 3, 7, 7}})
        .attrs(with_relu(pool_attrs({3, 3}, {2, 2}, {1, 1})))
        .avoid_ties(),
};
static const std::vector<BadCase> kMaxPoolBad = {
    {{{1, 3, 3, 3}}, {}, pool_attrs({6, 6}, {1, 1}, {1, 1}), "kernel 6x6 exceeds padded input 5x5"},
    {{{1, 3, 3, 3}}, {}, pool_attrs({4, 2}), "kernel 4x2 exceeds padded input 3x3; x=[1,3,3,3]"},
    {{{1, 3, 8, 8}},
     {},
     pool_attrs({2, 2}, {1, 1}, {2, 0}),
     "pad [2,0] exceeds half the kernel 2x2"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {0, 1}), "stride must be positive, got [0,1]"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {}, {-1, 0}), "pad must be non-negative"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({0, 2}), "kernel must be positive, got [0,2]"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2}), "kernel must hold 2 values"},
    {{{3, 8, 8}}, {}, pool_attrs({2, 2}), "expected 4-D input [N,C,H,W]"},
    {{{1, 3, 8, 8}}, {DType::I32}, pool_attrs({2, 2}), "expected f32 x"},
    {{{1, 3, 8, 8}},
     {},
     [] {
       ir::Attrs a = pool_attrs({2, 2});
       a.set("activation", std::string("tanh"));
       return a;
     }(),
     "unknown activation 'tanh' (expected none or relu)"},
};
MINIDL_OP_TEST(max_pool2d, kMaxPool, kMaxPoolBad)

// argmax is drawn at random, so the window is the whole plane: every index is one a forward
// could have chosen (oneDNN's backward can only route dy inside each window).
static const std::vector<OpCase> kMaxPoolBwd = {
    OpCase()
        .shapes({{2, 3, 1, 1}, {2, 3, 1, 1}})
        .dtypes({DType::F32, DType::I32})
        .ints_below(64)
        .attrs({{"kernel", Ints{8, 8}}, {"in_shape", Ints{2, 3, 8, 8}}}),
};
static const std::vector<BadCase> kMaxPoolBwdBad = {
    {{{2, 3, 4, 4}, {2, 3, 4, 4}},
     {DType::F32, DType::I32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 9, 7}}},
     "in_shape [2,3,9,7] pools to [2,3,4,3], not dy's shape"},
    {{{2, 3, 4, 4}, {2, 3, 4, 4}},
     {DType::F32, DType::F32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 8, 8}}},
     "expected f32 dy and i32 argmax"},
    {{{2, 3, 4, 4}, {2, 3, 4, 3}},
     {DType::F32, DType::I32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 8, 8}}},
     "argmax must have dy's shape"},
};
MINIDL_OP_TEST(max_pool2d_bwd, kMaxPoolBwd, kMaxPoolBwdBad)

// Known values: the first maximum wins a tie, argmax is ih * W + iw within the plane, padding
// never wins (it is -inf, not 0), and the backward adds dy where overlapping windows share it.
TEST(MaxPool2d, KnownValuesAndIndices) {
  ir::Graph g;
  // One 3x4 plane.
  Tensor xt = Tensor::from<float>({1, 1, 3, 4}, {-1, 2, 2, 2,   //
                                                 -3, -2, 0, 9,  //
                                                 -4, -6, 1, -7});
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Node* n = ops::apply_node(
      "max_pool2d", {x}, {{"kernel", Ints{2, 2}}, {"stride", Ints{1, 2}}, {"pad", Ints{1, 1}}});
  ir::Value* dx = autograd::differentiate(g, ops::sum(n->output(0)), {x})[0];
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  g.add_output(dx);
  runtime::Executable exe(g);
  exe.run();
  // OH = (3 + 2 - 2) / 1 + 1 = 4, OW = (4 + 2 - 2) / 2 + 1 = 3.
  const Tensor& y = exe.value(n->output(0));
  const Tensor& am = exe.value(n->output(1));
  ASSERT_EQ(y.shape(), (Shape{1, 1, 4, 3}));
  const std::vector<float> want_y = {-1, 2, 2, -1, 2, 9, -3, 1, 9, -4, 1, -7};
  const std::vector<std::int32_t> want_am = {0, 1, 3, 0, 1, 7, 4, 10, 7, 8, 10, 11};
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(y.at(i), want_y[i]) << i;
    EXPECT_EQ(am.data<std::int32_t>()[i], want_am[i]) << i;
  }
  // d sum(y) / dx counts the windows that picked each element.
  const std::vector<float> want_dx = {2, 2, 0, 1, 1, 0, 0, 2, 1, 0, 2, 1};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(exe.value(dx).at(i), want_dx[i]) << i;
}

// The CNNs' 2x2 window with stride 2: a window of -inf picks its first element; a NaN wins over
// numbers, and a later NaN over an earlier one (as in PyTorch); the first of equal maxima wins.
TEST(MaxPool2d, TwoByTwoWindowsKeepTheRules) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  Tensor xt = Tensor::from<float>({1, 1, 2, 6}, {-inf, -inf, 1, nan, 5, 5,  //
                                                 -inf, -inf, nan, 1, 5, 5});
  ir::Node* n = ops::apply_node("max_pool2d", {ops::parameter(g, "x", xt)},
                                {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}});
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  runtime::Executable exe(g, {.backend = ir::Backend::Native});
  exe.run();
  const Tensor& y = exe.value(n->output(0));
  const std::int32_t* am = exe.value(n->output(1)).data<std::int32_t>();
  EXPECT_EQ(y.at(0), -inf);
  EXPECT_TRUE(std::isnan(y.at(1)));
  EXPECT_EQ(y.at(2), 5.0f);
  EXPECT_EQ(am[0], 0);
  EXPECT_EQ(am[1], 8);  // the second NaN, row 1 column 2
  EXPECT_EQ(am[2], 4);
}

// The harness compares f32 outputs only; argmax (i32) must agree exactly between the backends,
// since max_pool2d_bwd on either reads the other's. The inputs here are small integers, so many
// windows hold ties: both backends pick the first maximum in window order.
TEST(MaxPool2d, BackendsAgreeOnArgmaxAndTies) {
#if !MINIDL_WITH_ONEDNN
  GTEST_SKIP() << "built without oneDNN (MINIDL_WITH_ONEDNN=OFF)";
#endif
  struct Case {
    Shape x;
    ir::Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 8, 8}, pool_attrs({2, 2})},
      {{2, 3, 7, 7}, pool_attrs({2, 2})},
      {{1, 2, 7, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {{2, 1, 6, 5}, pool_attrs({3, 2}, {1, 2}, {1, 0})},
      {{1, 3, 5, 5}, pool_attrs({3, 3}, {1, 1})},
      {{3, 2, 4, 4}, pool_attrs({1, 1}, {2, 2})},
      {{2, 2, 5, 5}, pool_attrs({5, 5})},
      {{4, 32, 16, 16}, pool_attrs({2, 2})},
      {{2, 16, 9, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {{1, 1, 20, 20}, pool_attrs({17, 17}, {1, 1}, {8, 8})},  // a window of > 255 taps
  };
  for (const Case& c : cases) {
    for (const std::int64_t levels : {3, 1000000}) {  // many ties, next to none
      SCOPED_TRACE(fmt::format("x={} levels={}", c.x, levels));
      Tensor xt = Tensor::empty(c.x);
      const CounterRng rng(3);
      for (std::int64_t i = 0; i < xt.numel(); ++i)
        xt.data<float>()[i] = static_cast<float>(rng.bits(1, i) % levels);
      ir::Graph g;
      ir::Value* x = ops::parameter(g, "x", xt);
      ir::Node* n = ops::apply_node("max_pool2d", {x}, c.attrs);
      Tensor rt = Tensor::empty(n->output(0)->shape());
      rng.fill_normal(rt, 2, 0.0f, 1.0f);
      ir::Value* loss = ops::sum(ops::mul(n->output(0), ops::parameter(g, "r", rt)));
      ir::Value* dx = autograd::differentiate(g, loss, {x})[0];
      g.add_output(n->output(0));
      g.add_output(n->output(1));
      g.add_output(dx);
      runtime::Executable native(g, {.backend = ir::Backend::Native});
      // The native pooling is declared preferred: pin the pooling nodes to oneDNN's kernels.
      for (ir::Node* node : g.nodes())
        if (node->op().starts_with("max_pool2d"))
          node->annotations().set("backend", std::string("onednn"));
      runtime::Executable onednn(g, {.backend = ir::Backend::OneDnn});
      std::istringstream table(onednn.kernel_table());
      int pinned = 0;
      for (std::string line; std::getline(table, line);) {
        if (line.find("max_pool2d") == std::string::npos) continue;
        EXPECT_THAT(line, ::testing::EndsWith("-> onednn"));
        ++pinned;
      }
      ASSERT_EQ(pinned, 2) << onednn.kernel_table();
      native.run();
      onednn.run();
      const Tensor& am_n = native.value(n->output(1));
      const Tensor& am_o = onednn.value(n->output(1));
      for (std::int64_t i = 0; i < am_n.numel(); ++i) {
        ASSERT_EQ(am_n.data<std::int32_t>()[i], am_o.data<std::int32_t>()[i]) << "argmax " << i;
        ASSERT_EQ(native.value(n->output(0)).at(i), onednn.value(n->output(0)).at(i)) << "y " << i;
      }
      for (std::int64_t i = 0; i < xt.numel(); ++i)
        ASSERT_NEAR(native.value(dx).at(i), onednn.value(dx).at(i), 1e-5) << "dx " << i;
    }
  }
}

// oneDNN's backward routes dy through a workspace, which can only name taps of each window: an
// argmax outside its window (no forward produces one) is refused with the node named.
TEST(MaxPool2d, OneDnnBackwardRefusesArgmaxOutsideItsWindow) {
#if !MINIDL_WITH_ONEDNN
  GTEST_SKIP() << "built without oneDNN (MINIDL_WITH_ONEDNN=OFF)";
#endif
  ir::Graph g;
  ir::Value* dy = ops::parameter(g, "dy", Tensor::full({1, 1, 2, 2}, 1.0f));
  // Plane 4x4, 2x2 windows: output (0, 1) reads columns 2..3 of rows 0..1; index 4 is (1, 0).
  Tensor am = Tensor::from<std::int32_t>({1, 1, 2, 2}, {0, 4, 8, 10});
  ir::Node* bwd = ops::apply_node("max_pool2d_bwd", {dy, ops::parameter(g, "am", am)},
                                  {{"kernel", Ints{2, 2}}, {"in_shape", Ints{1, 1, 4, 4}}});
  bwd->annotations().set("backend", std::string("onednn"));  // the native kernel is preferred
  ir::Value* dx = bwd->output(0);
  g.add_output(dx);
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
  try {
    exe.run();
    FAIL() << "an argmax outside its window was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_pool2d_bwd"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("an argmax lies outside its 2x2 window"));
  }
}

// ---- every layout and stored type -----------------------------------------------------------

namespace {

// Where element (n, c, pos) of a [N,C,P] view lies in a value of `layout`.
std::int64_t offset_in(const std::string& layout, const Shape& s, std::int64_t n, std::int64_t c,
                       std::int64_t pos) {
  const std::int64_t ch = s[1], plane = s[2] * s[3];
  if (layout.empty()) return (n * ch + c) * plane + pos;
  if (layout == "nhwc") return (n * plane + pos) * ch + c;
  const std::int64_t b = ir::channel_block(layout);
  return (n * ch + c - c % b) * plane + pos * b + c % b;
}

std::uint16_t bf16_of(float f) {  // exact for the test's values
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}
float f32_of(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Writes plain tensor `plain` (f32 or i32) into `t`, laid out as `layout` (f32 possibly as bf16).
void pack(const Tensor& plain, const Tensor& t, const std::string& layout) {
  const Shape& s = plain.shape();
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t p = 0; p < s[2] * s[3]; ++p) {
        const std::int64_t from = offset_in("", s, n, c, p), to = offset_in(layout, s, n, c, p);
        if (plain.dtype() == DType::I32) {
          static_cast<std::int32_t*>(t.raw())[to] = plain.data<std::int32_t>()[from];
        } else if (t.dtype() == DType::BF16) {
          static_cast<std::uint16_t*>(t.raw())[to] = bf16_of(plain.data<float>()[from]);
        } else {
          static_cast<float*>(t.raw())[to] = plain.data<float>()[from];
        }
      }
}

// The plain f32 (or i32) tensor of `t`, laid out as `layout`.
Tensor unpack(const Tensor& t, const std::string& layout) {
  const Shape& s = t.shape();
  Tensor plain = Tensor::empty(s, t.dtype() == DType::I32 ? DType::I32 : DType::F32);
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t p = 0; p < s[2] * s[3]; ++p) {
        const std::int64_t to = offset_in("", s, n, c, p), from = offset_in(layout, s, n, c, p);
        if (t.dtype() == DType::I32) {
          plain.data<std::int32_t>()[to] = static_cast<const std::int32_t*>(t.raw())[from];
        } else if (t.dtype() == DType::BF16) {
          plain.data<float>()[to] = f32_of(static_cast<const std::uint16_t*>(t.raw())[from]);
        } else {
          plain.data<float>()[to] = static_cast<const float*>(t.raw())[from];
        }
      }
  return plain;
}

// How each value of a pooling node is kept: its layout and whether it is stored as bf16.
struct Keep {
  std::string layout;
  bool bf16 = false;
};

void keep(ir::Value* v, const Keep& k) {
  v->set_layout(k.layout);
  if (k.bf16 && v->dtype() == DType::F32) v->set_stored(DType::BF16);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// One forward node on x (plain values given) with its values kept as said, on `backend` (pinned);
// returns y and argmax plain.
std::pair<Tensor, Tensor> run_fwd(const Tensor& x, const ir::Attrs& attrs, const Keep& kx,
                                  const Keep& ky, const Keep& ka, ir::Backend backend) {
  ir::Graph g;
  ir::Value* xv = ops::input(g, "x", x.shape());
  ir::Node* n = ops::apply_node("max_pool2d", {xv}, attrs, "pool");
  n->annotations().set("backend", std::string(ir::backend_name(backend)));
  keep(xv, kx);
  keep(n->output(0), ky);
  keep(n->output(1), ka);
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  runtime::Executable exe(g, {.backend = backend});
  pack(x, exe.input("x"), kx.layout);
  exe.run();
  EXPECT_THAT(exe.kernel_table(), ::testing::HasSubstr(std::string(ir::backend_name(backend))));
  return {unpack(exe.value(n->output(0)), ky.layout), unpack(exe.value(n->output(1)), ka.layout)};
}

Tensor run_bwd(const Tensor& dy, const Tensor& am, const Shape& x, const ir::Attrs& attrs,
               const Keep& kdy, const Keep& ka, const Keep& kdx, ir::Backend backend) {
  ir::Graph g;
  ir::Value* dyv = ops::input(g, "dy", dy.shape());
  ir::Value* amv = ops::input(g, "am", am.shape(), DType::I32);
  ir::Attrs a = attrs;
  a.set("in_shape", x.dims());
  ir::Node* n = ops::apply_node("max_pool2d_bwd", {dyv, amv}, a, "pool_bwd");
  n->annotations().set("backend", std::string(ir::backend_name(backend)));
  keep(dyv, kdy);
  keep(amv, ka);
  keep(n->output(0), kdx);
  g.add_output(n->output(0));
  runtime::Executable exe(g, {.backend = backend});
  pack(dy, exe.input("dy"), kdy.layout);
  pack(am, exe.input("am"), ka.layout);
  exe.run();
  EXPECT_THAT(exe.kernel_table(), ::testing::HasSubstr(std::string(ir::backend_name(backend))));
  return unpack(exe.value(n->output(0)), kdx.layout);
}

}  // namespace

// The native kernels in each layout the graph uses (plain, nChw16c, nChw8c, nhwc), f32 and bf16
// stored values, and mixed (a blocked input pooled into a plain output before a flatten): y and
// argmax bit-exact against the plain kernel (today's results), dx bit-exact too; and against
// oneDNN's kernels in the same layouts (y and argmax exact, dx to rounding where windows overlap).
// Values are small integers (exact in bf16) with many ties, or next to none.
TEST(MaxPool2d, EveryLayoutAndStoredTypeMatchesPlain) {
  struct Geometry {
    Shape x;
    ir::Attrs attrs;
  };
  const std::vector<Geometry> geometries = {
      {{2, 32, 8, 8}, pool_attrs({2, 2})},                  // the CNNs': disjoint windows
      {{1, 16, 7, 9}, pool_attrs({2, 2})},                  // a row and column no window covers
      {{2, 16, 9, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},  // overlapping, padded
      {{1, 32, 8, 8}, pool_attrs({2, 2}, {3, 3})},          // gaps between windows
  };
  struct Layouts {
    Keep in, out, am;  // x (or dx), y (or dy), argmax
  };
  std::vector<Layouts> layouts;
  for (const std::string l : {"", "nChw16c", "nChw8c", "nhwc"})
    for (const bool bf16 : {false, true}) layouts.push_back({{l, bf16}, {l, bf16}, {l, false}});
  layouts.push_back({{"nChw16c", false}, {"", false}, {"", false}});  // f32 pool2 -> flatten
  layouts.push_back({{"nhwc", true}, {"", false}, {"nhwc", false}});
  layouts.push_back({{"nhwc", true}, {"", false}, {"", false}});  // bf16 pool2 -> flatten
  layouts.push_back({{"nChw8c", false}, {"nhwc", true}, {"nChw16c", false}});
  for (const Geometry& geo : geometries) {
    for (const std::int64_t levels : {3, 200}) {
      Tensor x = Tensor::empty(geo.x);
      const CounterRng rng(5);
      for (std::int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = static_cast<float>(rng.bits(1, i) % levels) - levels / 2.0f;
      const Keep plain;
      const auto [y0, am0] = run_fwd(x, geo.attrs, plain, plain, plain, ir::Backend::Native);
      Tensor dy = Tensor::empty(y0.shape());
      for (std::int64_t i = 0; i < dy.numel(); ++i)
        dy.data<float>()[i] = static_cast<float>(static_cast<int>(rng.bits(2, i) % 64) - 32) / 4;
      const Tensor dx0 =
          run_bwd(dy, am0, geo.x, geo.attrs, plain, plain, plain, ir::Backend::Native);
      for (const Layouts& l : layouts) {
        SCOPED_TRACE(fmt::format(
            "x={} kernel {} stride {} levels={} in='{}'{} out='{}'{} "
            "argmax='{}'",
            geo.x, fmt::join(geo.attrs.get<Ints>("kernel"), "x"),
            fmt::join(geo.attrs.get<Ints>("stride"), "x"), levels, l.in.layout,
            l.in.bf16 ? " bf16" : "", l.out.layout, l.out.bf16 ? " bf16" : "", l.am.layout));
        std::vector<ir::Backend> backends = {ir::Backend::Native};
        // oneDNN keeps argmax plain or in its primitive's layout (the input side's), and pools
        // bf16 values only on CPUs with bf16 instructions.
        if (MINIDL_WITH_ONEDNN && (l.am.layout.empty() || l.am.layout == l.in.layout) &&
            (!(l.in.bf16 || l.out.bf16) || ops::bf16_unavailable().empty()))
          backends.push_back(ir::Backend::OneDnn);
        for (const ir::Backend b : backends) {
          SCOPED_TRACE(ir::backend_name(b));
          const auto [y, am] = run_fwd(x, geo.attrs, l.in, l.out, l.am, b);
          for (std::int64_t i = 0; i < y.numel(); ++i) {
            ASSERT_TRUE(same_bits(y.at(i), y0.at(i))) << "y " << i;
            ASSERT_EQ(am.data<std::int32_t>()[i], am0.data<std::int32_t>()[i]) << "argmax " << i;
          }
          const Tensor dx = run_bwd(dy, am0, geo.x, geo.attrs, l.out, l.am, l.in, b);
          for (std::int64_t i = 0; i < dx.numel(); ++i) {
            if (b == ir::Backend::Native) {
              ASSERT_TRUE(same_bits(dx.at(i), dx0.at(i))) << "dx " << i;
            } else {
              ASSERT_NEAR(dx.at(i), dx0.at(i), 1e-2 * (1.0 + std::fabs(dx0.at(i)))) << "dx " << i;
            }
          }
        }
      }
    }
  }
}

// A fused relu (activation=relu) is relu of the pooled value in every layout, with the argmax of
// the maximum where the value passes and -1 where relu clamps it (the mask the backward reads);
// its gradient is checked by the harness (kMaxPool's relu cases).
TEST(MaxPool2d, FusedReluInEveryLayout) {
  const Shape xs{2, 16, 6, 6};
  Tensor x = Tensor::empty(xs);
  const CounterRng rng(9);
  rng.fill_normal(x, 1, 0.0f, 1.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = std::round(x.data<float>()[i] * 8.0f) / 8.0f;  // exact in bf16
  ir::Attrs attrs = pool_attrs({2, 2});
  const Keep plain;
  const auto [y0, am0] = run_fwd(x, attrs, plain, plain, plain, ir::Backend::Native);
  attrs.set("activation", std::string("relu"));
  int clamped = 0;
  for (const std::string l : {"", "nChw16c", "nChw8c", "nhwc"}) {
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(fmt::format("layout '{}' bf16 {}", l, bf16));
      const auto [y, am] = run_fwd(x, attrs, {l, bf16}, {l, bf16}, {l, false}, ir::Backend::Native);
      for (std::int64_t i = 0; i < y.numel(); ++i) {
        ASSERT_TRUE(same_bits(y.at(i), y0.at(i) > 0.0f ? y0.at(i) : 0.0f)) << "y " << i;
        ASSERT_EQ(am.data<std::int32_t>()[i], y0.at(i) > 0.0f ? am0.data<std::int32_t>()[i] : -1)
            << "argmax " << i;
        clamped += y0.at(i) > 0.0f ? 0 : 1;
      }
    }
  }
  EXPECT_GT(clamped, 0) << "no window whose maximum relu clamps";
}

// The AVX-512 kernels (chosen at run time) against the portable ones every other CPU runs, bit for
// bit: y, argmax and dx, forward with and without the fused relu, in every layout and stored type
// and mixed ones, on the models' shapes and on the edges: odd widths (the MNIST CNN's 13 outputs
// per row), more than 16 outputs per row, rows and columns no window covers, gaps between
// windows, overlapping padded windows, and channel counts that leave a partial vector (nhwc with
// 24 or 40 channels, nChw8c). Inputs hold ties, -inf, -0 and NaNs; dy holds -0.
TEST(MaxPool2d, SimdKernelsMatchPortableBitForBit) {
  if (!ops::pool::avx512_kernels()) GTEST_SKIP() << "this CPU has no AVX-512 (F, BW, VL)";
  struct Geometry {
    Shape x;
    ir::Attrs attrs;
  };
  const std::vector<Geometry> geometries = {
      {{2, 32, 8, 8}, pool_attrs({2, 2})},
      {{2, 8, 26, 26}, pool_attrs({2, 2})},
      {{1, 16, 7, 9}, pool_attrs({2, 2})},
      {{1, 40, 5, 37}, pool_attrs({2, 2})},
      {{2, 16, 9, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {{1, 24, 6, 10}, pool_attrs({2, 2}, {3, 3})},
      {{1, 16, 6, 7}, pool_attrs({3, 2}, {1, 2}, {1, 0})},
  };
  struct Layouts {
    Keep in, out, am;
  };
  std::vector<Layouts> layouts;
  for (const std::string l : {"", "nChw16c", "nChw8c", "nhwc"})
    for (const bool bf16 : {false, true}) layouts.push_back({{l, bf16}, {l, bf16}, {l, false}});
  layouts.push_back({{"nChw16c", false}, {"", false}, {"", false}});
  layouts.push_back({{"nChw8c", false}, {"", false}, {"", false}});
  layouts.push_back({{"nhwc", true}, {"", false}, {"nhwc", false}});
  layouts.push_back({{"nhwc", true}, {"", true}, {"", false}});
  layouts.push_back({{"nChw8c", false}, {"nhwc", true}, {"nChw16c", false}});
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  int compared = 0;
  for (const Geometry& geo : geometries) {
    Tensor x = Tensor::empty(geo.x);
    const CounterRng rng(11);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const std::uint64_t r = rng.bits(1, i) % 64;
      x.data<float>()[i] = r == 0   ? -inf
                           : r == 1 ? nan
                           : r == 2 ? -0.0f
                                    : static_cast<float>(r % 7) - 3;
    }
    const auto fits = [&](const Keep& k) {
      return k.layout.empty() || k.layout == "nhwc" || geo.x[1] % ir::channel_block(k.layout) == 0;
    };
    for (const bool relu : {false, true}) {
      const ir::Attrs attrs = relu ? with_relu(geo.attrs) : geo.attrs;
      for (const Layouts& l : layouts) {
        if (!fits(l.in) || !fits(l.out) || !fits(l.am)) continue;
        SCOPED_TRACE(fmt::format("x={} kernel {} relu {} in='{}'{} out='{}'{} argmax='{}'", geo.x,
                                 fmt::join(geo.attrs.get<Ints>("kernel"), "x"), relu, l.in.layout,
                                 l.in.bf16 ? " bf16" : "", l.out.layout, l.out.bf16 ? " bf16" : "",
                                 l.am.layout));
        ops::pool::force_portable(true);
        const auto [y0, am0] = run_fwd(x, attrs, l.in, l.out, l.am, ir::Backend::Native);
        Tensor dy = Tensor::empty(y0.shape());
        for (std::int64_t i = 0; i < dy.numel(); ++i) {
          const std::uint64_t r = rng.bits(2, i) % 16;
          dy.data<float>()[i] = r == 0 ? -0.0f : static_cast<float>(static_cast<int>(r) - 8) / 4;
        }
        const Tensor dx0 =
            run_bwd(dy, am0, geo.x, geo.attrs, l.out, l.am, l.in, ir::Backend::Native);
        ops::pool::force_portable(false);
        const auto [y, am] = run_fwd(x, attrs, l.in, l.out, l.am, ir::Backend::Native);
        const Tensor dx =
            run_bwd(dy, am0, geo.x, geo.attrs, l.out, l.am, l.in, ir::Backend::Native);
        for (std::int64_t i = 0; i < y.numel(); ++i) {
          ASSERT_TRUE(same_bits(y.at(i), y0.at(i)))
              << "y " << i << ": " << y.at(i) << " vs " << y0.at(i);
          ASSERT_EQ(am.data<std::int32_t>()[i], am0.data<std::int32_t>()[i]) << "argmax " << i;
        }
        for (std::int64_t i = 0; i < dx.numel(); ++i)
          ASSERT_TRUE(same_bits(dx.at(i), dx0.at(i)))
              << "dx " << i << ": " << dx.at(i) << " vs " << dx0.at(i);
        ++compared;
      }
    }
  }
  ops::pool::force_portable(false);
  EXPECT_GE(compared, 100);
}

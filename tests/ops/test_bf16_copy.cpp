#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

// An f32 copy here (nothing stores it as bf16): exact, its gradient passed through. The bf16
// copies the mixed-precision pass makes are tested in test_precision.cpp.
static const std::vector<OpCase> kCases = {OpCase().shapes({{4, 5}}), OpCase().shapes({{3}})};
static const std::vector<BadCase> kBad = {{{{3}}, {minidl::DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(bf16_copy, kCases, kBad)

// Two f32 copies of a matrix (nothing packs them here): exact, the gradients summed. The packed
// bf16 copies are tested below.
static const std::vector<OpCase> kCopiesCases = {OpCase().shapes({{4, 5}}),
                                                 OpCase().shapes({{64, 96}})};
static const std::vector<BadCase> kCopiesBad = {
    {{{3, 2}}, {minidl::DType::I32}, {}, "expected f32 input"},
    {{{6}}, {minidl::DType::F32}, {}, "expected a matrix"}};
MINIDL_OP_TEST(bf16_copies, kCopiesCases, kCopiesBad)

#include <cstring>
#include <limits>
#include <vector>

#include "minidl/core/rng.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

#if MINIDL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include "minidl/ops/onednn/onednn.hpp"
#endif

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Ties to even; a NaN keeps its sign and upper payload and becomes quiet.
std::uint32_t want_bits(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x400000u) & 0xffff0000u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

}  // namespace

// A copy stored as bf16 and read back as f32, over values whose rounding is a corner (ties either
// way, the carry into the exponent, the largest finite values rounding to infinity, subnormals,
// signed zeros, infinities, quiet and signalling NaNs) and random bit patterns, 1003 of them so
// that the vectorised body of every thread's range runs as well as its tail: every element has
// the bits of the scalar rule.
TEST(Bf16Copy, RoundsToNearestEvenInEveryLane) {
  using namespace minidl;
  std::vector<float> x = {from_bits(0x3f808000u),
                          from_bits(0x3f818000u),
                          from_bits(0x3f80ffffu),
                          from_bits(0x3f7fffffu),
                          from_bits(0x7f7fffffu),
                          from_bits(0xff7fffffu),
                          from_bits(0x7f7f8000u),
                          from_bits(0x00000001u),
                          from_bits(0x80008000u),
                          0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          from_bits(0x7fc00001u),
                          from_bits(0x7f800001u),
                          from_bits(0xff812345u)};
  const CounterRng rng(7);
  while (x.size() < 1003) x.push_back(from_bits(static_cast<std::uint32_t>(rng.bits(1, x.size()))));
  const auto n = static_cast<std::int64_t>(x.size());
  Tensor in = Tensor::from(Shape{n}, x);
  ir::Graph g;
  ir::Value* copy = g.add_node(ops::op("bf16_copy"), {ops::parameter(g, "x", in)})->output();
  copy->set_stored(DType::BF16);
  ir::Value* back = g.add_node(ops::op("bf16_copy"), {copy})->output();
  g.add_output(back);
  runtime::Executable exe(g);
  exe.run();
  const Tensor& out = exe.value(back);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(out.data<float>()[i]), want_bits(x[static_cast<std::size_t>(i)]))
        << "element " << i << " bits 0x" << std::hex << bits_of(x[static_cast<std::size_t>(i)]);
}

namespace {

// The offset of (r, c) in a bf16 matrix pack of a [rows, cols] matrix, from the layout's
// description (ir::matrix_pack).
std::int64_t pack_offset(const std::string& layout, std::int64_t rows, std::int64_t cols,
                         std::int64_t r, std::int64_t c) {
  if (layout == "BA16a64b2a")
    return (c / 64) * (rows / 32) * 2048 + (r / 32) * 2048 + (r % 32 / 2) * 128 + (c % 64) * 2 +
           r % 2;
  return (r / 64) * (cols / 32) * 2048 + (c / 32) * 2048 + (c % 32 / 2) * 128 + (r % 64) * 2 +
         c % 2;
}

// Every element of `in` at its place in `got` (a pack of it in `layout`), rounded to bf16.
void expect_packed(const minidl::Tensor& in, const std::uint16_t* got, const std::string& layout) {
  const std::int64_t rows = in.shape()[0], cols = in.shape()[1];
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(std::uint32_t{got[pack_offset(layout, rows, cols, r, c)]} << 16,
                want_bits(in.data<float>()[r * cols + c]))
          << layout << " " << in.shape().str() << ": element (" << r << ", " << c << ")";
    }
  }
}

}  // namespace

// A plain f32 matrix copied into each bf16 matrix pack (ir::matrix_pack), by a bf16_copy and by
// both outputs of a bf16_copies (one plain, one packed; both packed): every element's bits,
// rounded as above, at the offset the pack's description gives it; for rows and columns of
// several blocks each, and of one. With oneDNN, the same bytes as its reorder into that format.
TEST(Bf16Copy, PacksMatricesForTheProducts) {
  using namespace minidl;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{192, 1024}, {64, 64}}) {
    const Shape shape{rows, cols};
    Tensor in = Tensor::empty(shape);
    CounterRng(11).fill_normal(in, 0, 0.0f, 1.0f);
    in.data<float>()[5] = from_bits(0x3f808000u);         // a tie, rounded to even
    in.data<float>()[70] = from_bits(0x00018000u);        // a subnormal (a tie too): 0x0002
    in.data<float>()[cols + 3] = from_bits(0x7f800001u);  // a signalling NaN, made quiet
    for (const char* layout : {"BA16a64b2a", "AB16b64a2b"}) {
      ir::Graph g;
      ir::Value* copy = g.add_node(ops::op("bf16_copy"), {ops::parameter(g, "x", in)})->output();
      copy->set_stored(DType::BF16);
      copy->set_layout(layout);
      g.add_output(copy);
      runtime::Executable exe(g);
      exe.run();
      const auto* got = static_cast<const std::uint16_t*>(exe.value(copy).raw());
      expect_packed(in, got, layout);
#if MINIDL_WITH_ONEDNN
      using dnnl::memory;
      const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
      dnnl::stream s(eng);
      memory src({{rows, cols}, memory::data_type::f32, memory::format_tag::ab}, eng, in.raw());
      memory dst(ops::onednn::layout_desc(shape, layout, DType::BF16), eng);
      dnnl::reorder(src, dst).execute(s, src, dst);
      s.wait();
      // oneDNN's reorder (AVX512-BF16's conversion where the CPU has it) takes the subnormal for
      // zero; the copy keeps bf16_round's rule there, as the plain copy does (checked above).
      const std::int64_t at = pack_offset(layout, rows, cols, 70 / cols, 70 % cols);
      static_cast<std::uint16_t*>(dst.get_data_handle())[at] = got[at];
      EXPECT_EQ(std::memcmp(dst.get_data_handle(), got, dst.get_desc().get_size()), 0) << layout;
#endif
    }
    for (const auto& [first, second] :
         {std::pair<std::string, std::string>{"", "BA16a64b2a"}, {"BA16a64b2a", "AB16b64a2b"}}) {
      ir::Graph g;
      ir::Node* n = g.add_node(ops::op("bf16_copies"), {ops::parameter(g, "x", in)});
      for (int i = 0; i < 2; ++i) {
        n->output(i)->set_stored(DType::BF16);
        n->output(i)->set_layout(i == 0 ? first : second);
        g.add_output(n->output(i));
      }
      runtime::Executable exe(g);
      exe.run();
      for (int i = 0; i < 2; ++i) {
        const auto* got = static_cast<const std::uint16_t*>(exe.value(n->output(i)).raw());
        const std::string& layout = i == 0 ? first : second;
        if (!layout.empty()) {
          expect_packed(in, got, layout);
          continue;
        }
        for (std::int64_t e = 0; e < in.numel(); ++e)
          ASSERT_EQ(std::uint32_t{got[e]} << 16, want_bits(in.data<float>()[e])) << e;
      }
    }
  }
}

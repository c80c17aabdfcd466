#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

// An f32 copy here (nothing stores it as bf16): exact, its gradient passed through. The bf16
// copies the mixed-precision pass makes are tested in test_precision.cpp.
static const std::vector<OpCase> kCases = {OpCase().shapes({{4, 5}}), OpCase().shapes({{3}})};
static const std::vector<BadCase> kBad = {{{{3}}, {minidl::DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(bf16_copy, kCases, kBad)

#include <cstring>
#include <limits>
#include <vector>

#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

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

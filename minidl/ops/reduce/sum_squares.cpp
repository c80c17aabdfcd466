// sum_squares: the sum of x's squared elements -> [] (a gradient's squared L2 norm, for
// global-norm clipping). Fixed chunks summed in double and combined in order, as `sum` does, so
// the result does not depend on the thread count.
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

constexpr std::int64_t kChunk = 4096;
constexpr std::int64_t kMaxChunks = 256;  // beyond this, chunks grow

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  c.set_output(0, Shape{});
}

void sum_squares_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  const std::int64_t n = k.in[0].numel();
  const std::int64_t chunk = std::max(kChunk, (n + kMaxChunks - 1) / kMaxChunks);
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks];
  parallel_for(chunks, chunk, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
      double s = 0.0;
      for (std::int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
      partial[c] = s;
    }
  });
  double total = 0.0;
  for (std::int64_t c = 0; c < chunks; ++c) total += partial[c];
  *k.out[0].data<float>() = static_cast<float>(total);
}

// d/dx sum(x^2) = 2 x dy
void grad(ir::GradCtx& g) {
  ir::Value* dy =
      g.op("expand", {g.out_grad(0)}, {{"shape", g.input(0)->shape().dims()}, {"alpha", 2.0}});
  g.set_input_grad(0, g.op("mul", {dy, g.input(0)}));
}

}  // namespace

MINIDL_OP(sum_squares)
    .inputs({"x"})
    .infer(infer)
    .kernel(ir::Backend::Native, sum_squares_native)
    .grad(grad);

}  // namespace minidl::ops

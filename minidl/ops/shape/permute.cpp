// permute: y's dimension i is x's dimension perm[i] (a copy; transpose(x, d0, d1) in ops.hpp is
// the permutation swapping two). The gradient is the inverse permutation of dy.
#include <vector>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  const Shape& x = c.input(0);
  const auto perm = c.attr<ir::Ints>("perm");
  std::vector<bool> seen(static_cast<std::size_t>(x.rank()), false);
  bool ok = static_cast<int>(perm.size()) == x.rank();
  for (std::size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < x.rank() && !seen[static_cast<std::size_t>(perm[i])];
    if (ok) seen[static_cast<std::size_t>(perm[i])] = true;
  }
  MINIDL_CHECK_NODE(c, ok, "perm ", Shape(perm), " is not a permutation of the ", x.rank(),
                    " dimensions of ", x);
  std::vector<std::int64_t> dims;
  for (auto p : perm) dims.push_back(x[static_cast<int>(p)]);
  c.set_output(0, Shape(std::move(dims)));
}

// Output dimensions with the input stride of each; neighbours contiguous in x too are merged and
// dimensions of size 1 dropped, so a permutation that moves only those is one flat copy.
void permute_native(const ir::KernelArgs& k) {
  const Shape& x = k.in[0].shape();
  const auto perm = k.attrs().get<ir::Ints>("perm");
  std::vector<std::int64_t> in_stride(static_cast<std::size_t>(x.rank()), 1);
  for (int d = x.rank() - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * x[d + 1];
  std::vector<std::int64_t> dims, strides;
  for (auto p : perm) {
    const std::int64_t n = x[static_cast<int>(p)], s = in_stride[static_cast<std::size_t>(p)];
    if (n == 1) continue;
    if (!dims.empty() && strides.back() == s * n) {
      dims.back() *= n;
      strides.back() = s;
    } else {
      dims.push_back(n);
      strides.push_back(s);
    }
  }
  if (dims.empty()) {  // a single element
    dims = {1};
    strides = {1};
  }
  const int r = static_cast<int>(dims.size());
  const std::int64_t inner = dims[r - 1], si = strides[r - 1];
  const std::int64_t rows = k.out[0].numel() / inner;
  const float* src = k.in[0].data<float>();
  float* dst = k.out[0].data<float>();
  parallel_for(rows, inner, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t row = r0; row < r1; ++row) {
      std::int64_t off = 0, rem = row;
      for (int d = r - 2; d >= 0; --d) {
        off += (rem % dims[d]) * strides[d];
        rem /= dims[d];
      }
      const float* s = src + off;
      float* y = dst + row * inner;
      for (std::int64_t j = 0; j < inner; ++j) y[j] = s[j * si];
    }
  });
}

void grad(ir::GradCtx& g) {
  const auto perm = g.attrs().get<ir::Ints>("perm");
  ir::Ints inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = i;
  g.set_input_grad(0, g.op(op_permute, {g.out_grad(0)}, {{"perm", inverse}}));
}

}  // namespace

MINIDL_OP(permute)
    .inputs({"x"})
    .attr<ir::Ints>("perm")
    .infer(infer)
    .kernel(ir::Backend::Native, permute_native)
    .grad(grad);

}  // namespace minidl::ops

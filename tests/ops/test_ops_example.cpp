// The example of docs/ops.md, as it is written there: a layer norm over the last dimension and a
// mean squared error, built from ops:: builders, differentiated, and checked against finite
// differences and a hand-written forward.
#include <gtest/gtest.h>

#include <cmath>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {

// --- docs/ops.md, "Writing a layer" ---
// y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta, over the last dimension of x [N, D].
ir::Value* layer_norm(ir::Value* x, ir::Value* gamma, ir::Value* beta, float eps = 1e-5f) {
  ir::Value* mu = ops::mean(x, {-1}, /*keepdim=*/true);                  // [N, 1]
  ir::Value* xc = ops::sub(x, mu);                                       // [N, D] - [N, 1]
  ir::Value* var = ops::mean(ops::mul(xc, xc), {-1}, /*keepdim=*/true);  // [N, 1]
  ir::Value* sd = ops::sqrt(ops::add(var, ops::fill(x->graph(), {}, eps)));
  return ops::add(ops::mul(ops::div(xc, sd), gamma), beta);  // gamma, beta [D]
}

// Mean squared error: mean((y - target)^2), a scalar.
ir::Value* mse(ir::Value* y, ir::Value* target) {
  return ops::mean(ops::pow(ops::sub(y, target), 2.0));
}
// --- end of the example ---

}  // namespace

TEST(OpsExample, LayerNormAndMseDifferentiate) {
  constexpr int kN = 4, kD = 6;
  const CounterRng rng(3);
  Tensor x = Tensor::empty({kN, kD}), gamma = Tensor::empty({kD}), beta = Tensor::empty({kD});
  Tensor target = Tensor::empty({kN, kD});
  rng.fill_normal(x, 1, 0.0f, 1.0f);
  rng.fill_normal(gamma, 2, 1.0f, 0.2f);
  rng.fill_normal(beta, 3, 0.0f, 0.2f);
  rng.fill_normal(target, 4, 0.0f, 1.0f);

  ir::Graph g;
  ir::Value* px = ops::parameter(g, "x", x);
  ir::Value* pg = ops::parameter(g, "gamma", gamma);
  ir::Value* pb = ops::parameter(g, "beta", beta);
  ir::Value* y = layer_norm(px, pg, pb);
  ir::Value* loss = mse(y, ops::state(g, "target", target));
  g.add_output(y);
  g.add_output(loss);
  const std::vector<ir::Value*> grads = autograd::differentiate(g, loss, {px, pg, pb});
  for (ir::Value* v : grads) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();

  // The forward against a loop in double.
  for (int n = 0; n < kN; ++n) {
    double mu = 0.0, var = 0.0;
    for (int d = 0; d < kD; ++d) mu += x.at(n * kD + d) / double{kD};
    for (int d = 0; d < kD; ++d) var += std::pow(x.at(n * kD + d) - mu, 2) / kD;
    for (int d = 0; d < kD; ++d) {
      const double want =
          (x.at(n * kD + d) - mu) / std::sqrt(var + 1e-5) * gamma.at(d) + beta.at(d);
      EXPECT_NEAR(exe.value(y).at(n * kD + d), want, 1e-5);
    }
  }

  std::vector<Tensor> params{x, gamma, beta}, analytic;
  for (ir::Value* v : grads) analytic.push_back(exe.value(v).clone());
  const auto r = autograd::check_gradients(params, analytic, [&] {
    exe.run();
    return double{exe.value(loss).at(0)};
  });
  EXPECT_TRUE(r.ok) << r.report;
}

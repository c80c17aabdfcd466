#include "minidl/train/predict.hpp"

#include "minidl/ir/pass.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/relu_max_pool.hpp"
#include "minidl/train/step.hpp"

namespace minidl::train {

Tensor predict(Model& model, const Tensor& samples, const runtime::CompileOptions& options) {
  MINIDL_CHECK(
      samples.dtype() == DType::F32 && samples.shape().rank() >= 1 && samples.shape()[0] >= 1,
      "predict: expected f32 samples [N, ...] with N >= 1, got ", samples.dtype(), " ",
      samples.shape());
  ops::check_precision(options.precision);
  ir::Graph g;
  model.train(false);
  ir::Value* out = model.forward(ops::input(g, "x", samples.shape()));
  g.add_output(out);
  // An evaluation program's passes (step.cpp): nothing to differentiate, reduce or update.
  ir::PassManager pm({"gradients-reduced", "gradients-clipped", "updates-fused"});
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  pm.add(std::make_unique<ops::MixedPrecision>(options.precision));
  pm.add(std::make_unique<ops::ReluAfterMaxPool>());  // no autograd follows: a forward rewrite
  pm.add(std::make_unique<ops::FuseBiasActivation>());
  pm.add(std::make_unique<ops::FoldBatchNorm>());
  pm.add(std::make_unique<ops::FuseResidualIntoBatchNorm>());
  pm.add(std::make_unique<ops::PropagateLayouts>(options.backend));
  pm.run(g);
  std::unique_ptr<runtime::Executable> exe;
  try {
    exe = std::make_unique<runtime::Executable>(g, options);
  } catch (const Error& e) {
    MINIDL_FAIL("compiling the forward for ", samples.shape()[0], " samples: ", e.what());
  }
  Tensor x = exe->input("x");  // a handle on the executable's buffer
  x.copy_from(samples);
  exe->run();
  // A pass may replace the output value but keeps its place in the graph's outputs.
  return exe->value(g.outputs()[0]).clone();
}

std::vector<std::int64_t> predicted_classes(const Tensor& scores) {
  MINIDL_CHECK(scores.dtype() == DType::F32 && scores.shape().rank() == 2 && scores.shape()[1] >= 1,
               "predicted_classes: expected f32 scores [N, classes], got ", scores.dtype(), " ",
               scores.shape());
  const std::int64_t n = scores.shape()[0], c = scores.shape()[1];
  std::vector<std::int64_t> classes(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    classes[static_cast<std::size_t>(i)] = argmax(scores.data<float>() + i * c, c);
  return classes;
}

}  // namespace minidl::train

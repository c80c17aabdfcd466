// A model's loss and parameter gradients on one fixed batch, as one graph whose outputs are the
// loss and the gradients: what the pass tests compile before and after a rewrite.
#pragma once

#include <vector>

#include "minidl/autograd/autograd.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl::testing {

struct TrainingGraph {
  ir::Graph g;
  ir::Value* loss = nullptr;
  std::vector<ir::Value*> grads;

  TrainingGraph(nn::Module& model, const Dataset& batch) {
    ir::Value* x = ops::parameter(g, "x", batch.images);
    ir::Value* labels = ops::parameter(g, "labels", batch.labels);
    loss = ops::softmax_cross_entropy(model.forward(x), labels).first;
    std::vector<ir::Value*> params;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter" && n->name() != "x" && n->name() != "labels")
        params.push_back(n->output());
    grads = autograd::differentiate(g, loss, params);
    g.add_output(loss);
    for (ir::Value* v : grads) g.add_output(v);
  }

  /// Compiles for backend, runs once, and returns copies of the loss and the gradients: the
  /// graph's outputs, whose values a pass may have replaced (keeping their places).
  std::vector<Tensor> run(ir::Backend backend) const {
    runtime::Executable exe(g, {.backend = backend});
    exe.run();
    std::vector<Tensor> out;
    for (ir::Value* v : g.outputs()) out.push_back(exe.value(v).clone());
    return out;
  }
};

}  // namespace minidl::testing

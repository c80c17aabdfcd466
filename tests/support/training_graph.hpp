// A model's loss and parameter gradients on one fixed batch, as one graph whose outputs are the
// loss and the gradients, and a model's SGD training step on it: what the pass tests compile
// before and after a rewrite.
#pragma once

#include <vector>

#include "minidl/autograd/autograd.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/optimizer.hpp"

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

/// A model's training step with SGD (Nesterov momentum when momentum > 0) on one fixed batch: the
/// loss is the output, the updates write the model's parameters in place.
struct SgdStep {
  ir::Graph g;
  Tensor lr = Tensor::full({}, 0.1f);
  SgdStep(nn::Module& model, const Dataset& batch, double weight_decay = 0.0,
          double momentum = 0.0) {
    ir::Value* x = ops::parameter(g, "x", batch.images);
    ir::Value* labels = ops::parameter(g, "labels", batch.labels);
    ir::Value* loss = ops::softmax_cross_entropy(model.forward(x), labels).first;
    std::vector<ir::Value*> params;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter" && n->name() != "x" && n->name() != "labels")
        params.push_back(n->output());
    optim::Sgd sgd({.lr = 0.1,
                    .momentum = momentum,
                    .nesterov = momentum > 0.0,
                    .weight_decay = weight_decay});
    sgd.apply(g, params, autograd::differentiate(g, loss, params), {.lr = ops::state(g, "lr", lr)});
    g.add_output(loss);
  }
};

}  // namespace minidl::testing

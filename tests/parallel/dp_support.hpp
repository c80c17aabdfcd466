// Shared by the data-parallel tests: a small MLP training graph built as the trainer builds it
// (forward, autograd, SGD updates), and parameter comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "minidl/autograd/autograd.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/train/optimizer.hpp"
#include "support/synthetic.hpp"

namespace minidl::testing {

/// 64-32-10 MLP with momentum SGD on `batch` samples of [1,8,8], the whole step in one graph.
struct MlpStep {
  std::unique_ptr<nn::Sequential> model = small_mlp();
  optim::Sgd sgd{{.lr = 0.1, .momentum = 0.9}};
  Tensor lr = Tensor::full({}, 0.1f);  // the learning-rate input, bound as state
  ir::Graph g;
  ir::Value* loss = nullptr;
  std::vector<ir::Value*> params, grads;

  explicit MlpStep(std::int64_t batch) {
    model->reset(7);
    ir::Value* x = ops::input(g, "x", {batch, 1, 8, 8});
    ir::Value* labels = ops::input(g, "labels", {batch}, DType::I32);
    loss = ops::softmax_cross_entropy((*model)(x), labels).first;
    g.add_output(loss);
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter") params.push_back(n->output());
    grads = autograd::differentiate(g, loss, params);
    sgd.apply(g, params, grads, {.lr = ops::state(g, "lr", lr)});
  }
};

/// Copies samples [begin, end) of d into the executable's x and labels inputs.
inline void feed(const Dataset& d, std::int64_t begin, std::int64_t end, const Tensor& x,
                 const Tensor& labels) {
  const std::int64_t row = 64;
  std::memcpy(x.data<float>(), d.images.data<float>() + begin * row,
              static_cast<std::size_t>((end - begin) * row) * sizeof(float));
  std::memcpy(labels.data<std::int32_t>(), d.labels.data<std::int32_t>() + begin,
              static_cast<std::size_t>(end - begin) * sizeof(std::int32_t));
}

/// Whether every parameter of a and b is bitwise equal.
inline bool bitwise_equal(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t k = 0; k < pa.size(); ++k) {
    if (pa[k].second.nbytes() != pb[k].second.nbytes() ||
        std::memcmp(pa[k].second.raw(), pb[k].second.raw(), pa[k].second.nbytes()) != 0)
      return false;
  }
  return true;
}

/// The largest |a - b| / (1e-3 + |b|) over all parameters.
inline double max_rel_diff(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0.0;
  for (std::size_t k = 0; k < pa.size() && k < pb.size(); ++k) {
    for (std::int64_t i = 0; i < pa[k].second.numel(); ++i) {
      const double x = pa[k].second.at(i), y = pb[k].second.at(i);
      worst = std::max(worst, std::fabs(x - y) / (1e-3 + std::fabs(y)));
    }
  }
  return worst;
}

/// How many ranks hold parameters that differ (bitwise) from rank 0's; every rank learns it.
inline std::int64_t ranks_that_differ(parallel::Communicator& comm, nn::Module& m) {
  std::int64_t differ = 0;
  for (auto& [name, t] : m.parameters()) {
    Tensor root = t.clone();
    comm.broadcast(root.raw(), static_cast<std::int64_t>(root.nbytes()), 0);
    differ |= std::memcmp(t.raw(), root.raw(), t.nbytes()) != 0;
  }
  comm.allreduce_sum(&differ, 1);
  return differ;
}

}  // namespace minidl::testing

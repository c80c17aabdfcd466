// Thread replicas: a training graph with one forward per replica, run as a parallel section,
// gives the gradients of the whole batch, and the gradient sums become balanced trees.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/modules.hpp"
#include "../support/synthetic.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/thread_replicas.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {

// Loss and parameter gradients of `model` over `batch`, the batch split into `replicas` slices,
// each slice's forward built separately and weighted by its share of the batch.
struct ReplicatedGraph {
  ir::Graph g;
  ir::Value* loss = nullptr;
  std::vector<ir::Value*> grads;

  ReplicatedGraph(nn::Module& model, const Dataset& batch, int replicas) {
    const std::int64_t n = batch.size();
    std::vector<ir::Value*> terms;
    for (int r = 0; r < replicas; ++r) {
      const std::int64_t b = n * r / replicas, e = n * (r + 1) / replicas;
      Tensor x = Tensor::empty({e - b, 1, 8, 8}), y = Tensor::empty({e - b}, DType::I32);
      std::copy_n(batch.images.data<float>() + b * 64, (e - b) * 64, x.data<float>());
      std::copy_n(batch.labels.data<std::int32_t>() + b, e - b, y.data<std::int32_t>());
      ir::Value* xv = ops::parameter(g, "x" + std::to_string(r), x);
      ir::Value* yv = ops::parameter(g, "y" + std::to_string(r), y);
      xv->producer()->set_replica(r);
      yv->producer()->set_replica(r);
      ir::NameScope scope(g, "r" + std::to_string(r));
      ir::Value* l = ops::softmax_cross_entropy(model.forward(xv), yv).first;
      terms.push_back(ops::scale(l, static_cast<double>(e - b) / static_cast<double>(n)));
    }
    loss = terms[0];
    for (std::size_t i = 1; i < terms.size(); ++i) loss = ops::add(loss, terms[i]);
    std::vector<ir::Value*> params;
    for (ir::Node* p : g.nodes())
      if (p->op() == "parameter" && p->replica() < 0) params.push_back(p->output());
    grads = autograd::differentiate(g, loss, params);
    g.add_output(loss);
    for (ir::Value* v : grads) g.add_output(v);
  }

  std::vector<std::vector<float>> run() const {
    runtime::Executable exe(g);
    exe.run();
    std::vector<std::vector<float>> out;
    for (ir::Value* v : g.outputs()) {
      const Tensor& t = exe.value(v);
      out.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    }
    return out;
  }
};

void expect_close(const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (std::size_t j = 0; j < want[i].size(); ++j)
      ASSERT_NEAR(got[i][j], want[i][j], 1e-6f + 1e-4f * std::abs(want[i][j]))
          << "output " << i << ", element " << j;
  }
}

}  // namespace

TEST(ThreadReplicas, ParallelSectionMatchesTheWholeBatch) {
  const Dataset batch = minidl::testing::blobs(24, 5);
  auto model = minidl::testing::small_mlp();
  model->reset(3);
  const auto whole = ReplicatedGraph(*model, batch, 1).run();
  for (int replicas : {2, 3, 4}) {
    SCOPED_TRACE(replicas);
    ReplicatedGraph rg(*model, batch, replicas);
    ASSERT_TRUE(parallel::ThreadReplicas().run(rg.g));
    // The replica nodes form one run in the order; nothing after it is annotated.
    const auto& order = rg.g.nodes();
    auto annotated = [](const ir::Node* n) { return !n->def().is_source() && n->replica() >= 0; };
    auto first = std::find_if(order.begin(), order.end(), annotated);
    auto last = std::find_if(order.rbegin(), order.rend(), annotated).base();
    ASSERT_LT(first, last);
    EXPECT_TRUE(std::all_of(first, last, annotated)) << ir::to_text(rg.g);
    // Each sum over the replicas (4 parameter gradients and the loss) is a balanced tree of
    // replicas - 1 adds.
    const auto adds = std::count_if(order.begin(), order.end(), [](const ir::Node* n) {
      return n->op() == "add" && n->name().find(".tree") != std::string::npos;
    });
    EXPECT_EQ(adds, replicas >= 3 ? 5 * (replicas - 1) : 0) << ir::to_text(rg.g);
    expect_close(rg.run(), whole);
    // Without the pass the same graph runs serially: the parallel section changes nothing.
    expect_close(ReplicatedGraph(*model, batch, replicas).run(), rg.run());
  }
}

// A statistic of the whole batch (cross_replica_sum) read by every replica: each replica's copies
// become one sum over the replicas, and the replicas run as one section per level, before and
// after each sum, forward and backward.
TEST(ThreadReplicas, CrossReplicaSumsJoinTheReplicas) {
  const Dataset batch = minidl::testing::blobs(24, 5);
  auto model = minidl::testing::globally_shifted_mlp();
  const auto whole = ReplicatedGraph(*model, batch, 1).run();
  for (int replicas : {2, 3, 4}) {
    SCOPED_TRACE(replicas);
    ReplicatedGraph rg(*model, batch, replicas);
    ASSERT_TRUE(parallel::ThreadReplicas().run(rg.g));
    ASSERT_NO_THROW(ir::verify(rg.g)) << ir::to_text(rg.g);
    // One sum forward, one for its gradient, each of no replica.
    int sums = 0;
    for (const ir::Node* n : rg.g.nodes()) {
      if (n->op() != "cross_replica_sum") continue;
      ++sums;
      EXPECT_EQ(n->replica(), -1);
    }
    EXPECT_EQ(sums, 2) << ir::to_text(rg.g);
    // Runs of replica nodes: before the forward sum, between the sums, after the backward one.
    int runs = 0;
    bool in_run = false;
    for (const ir::Node* n : rg.g.nodes()) {
      const bool annotated = !n->def().is_source() && n->replica() >= 0;
      runs += annotated && !in_run;
      in_run = annotated;
    }
    EXPECT_EQ(runs, 3) << ir::to_text(rg.g);
    expect_close(rg.run(), whole);
    // Without the pass the copies are not joined: each replica sums only its own slice.
    const auto unjoined = ReplicatedGraph(*model, batch, replicas).run();
    EXPECT_NE(unjoined[0], whole[0]);
  }
}

TEST(ThreadReplicas, RuntimeRejectsReadsAcrossReplicas) {
  Tensor t = Tensor::full({4}, 1.0f);
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", t);
  ir::Value* a = ops::scale(x, 2.0);
  ir::Value* b = ops::scale(a, 3.0);
  a->producer()->set_replica(0);
  b->producer()->set_replica(1);  // replica 1 reads replica 0's value
  g.add_output(b);
  try {
    runtime::Executable exe(g);
    FAIL() << "compiled a section with a cross-replica read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("of replica 0 in the same parallel section"),
              std::string::npos)
        << e.what();
  }
}

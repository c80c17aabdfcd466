// Every collective op under mpirun (ctest runs 2 and 3 ranks) against the same computation done
// serially from the formula each rank's data follows, and the node/leader split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/reduction_tree.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {

// Rank r's contribution: x_r[i] = 100 r + i + 0.5 (exact in f32 and in every sum here).
float value(int r, std::int64_t i) { return 100.0f * static_cast<float>(r) + i + 0.5f; }

Tensor contribution(int r, Shape s) {
  Tensor t = Tensor::empty(std::move(s));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value(r, i);
  return t;
}

}  // namespace

TEST(MpiCollectives, EveryOpMatchesTheSerialComputation) {
  parallel::Communicator& world = parallel::world();
  const int p = world.size(), r = world.rank();
  ASSERT_GT(p, 1) << "run this test under mpirun with at least 2 ranks";
  const int last = p - 1, second = 1;
  Tensor a = contribution(r, {3, 4}), b = contribution(r, {5}), c = contribution(r, {2, 3}),
         d = contribution(r, {2, 2}), e = contribution(r, {1000}), f = contribution(r, {7}),
         s = contribution(r, {6});
  ir::Graph g;
  ir::Value* ya = parallel::allreduce(ops::parameter(g, "a", a), 0.5);
  ir::Value* yb = parallel::reduce(ops::parameter(g, "b", b), 2.0, last);
  ir::Value* yc = parallel::broadcast(ops::parameter(g, "c", c), second);
  ir::Value* yd = parallel::allgather(ops::parameter(g, "d", d));
  // Two reductions in flight at once, work and polling in between, waited in the other order.
  const parallel::InFlight fe = parallel::allreduce_start(ops::parameter(g, "e", e), 0.25);
  const parallel::InFlight ff = parallel::allreduce_start(ops::parameter(g, "f", f), 1.0);
  ir::Value* work = ops::scale(ops::fill(g, {8}, 1.0f), 2.0);
  parallel::comm_progress(g);
  ir::Value* yf = parallel::allreduce_wait(ff);
  parallel::comm_progress(g);
  ir::Value* ye = parallel::allreduce_wait(fe);
  // A ring: rank 0 sends first, every other rank receives first, so no blocking send waits on
  // a rank that is itself sending.
  ir::Value* ys = nullptr;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  if (r == 0) {
    parallel::send(ops::parameter(g, "s", s), next, 7);
    ys = parallel::recv(g, {6}, DType::F32, prev, 7);
  } else {
    ys = parallel::recv(g, {6}, DType::F32, prev, 7);
    parallel::send(ops::parameter(g, "s", s), next, 7);
  }
  for (ir::Value* v : {ya, yb, yc, yd, ye, yf, ys, work}) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();

  auto sum = [&](std::int64_t i) {
    double t = 0;
    for (int q = 0; q < p; ++q) t += value(q, i);
    return t;
  };
  for (std::int64_t i = 0; i < 12; ++i) ASSERT_EQ(a.at(i), 0.5 * sum(i)) << "allreduce " << i;
  for (std::int64_t i = 0; i < 5; ++i)
    ASSERT_EQ(b.at(i), r == last ? 2.0 * sum(i) : 2.0 * value(r, i)) << "reduce " << i;
  for (std::int64_t i = 0; i < 6; ++i) ASSERT_EQ(c.at(i), value(second, i)) << "broadcast " << i;
  const Tensor& gathered = exe.value(yd);
  ASSERT_EQ(gathered.shape(), (Shape{2 * p, 2}));
  for (int q = 0; q < p; ++q)
    for (std::int64_t i = 0; i < 4; ++i)
      ASSERT_EQ(gathered.at(q * 4 + i), value(q, i)) << "allgather rank " << q << " " << i;
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(e.at(i), 0.25 * sum(i)) << "start/wait " << i;
  for (std::int64_t i = 0; i < 7; ++i) ASSERT_EQ(f.at(i), sum(i)) << "start/wait " << i;
  EXPECT_EQ(world.progress(), 0);
  const Tensor& got = exe.value(ys);
  for (std::int64_t i = 0; i < 6; ++i) ASSERT_EQ(got.at(i), value(prev, i)) << "recv " << i;
}

// tree_allreduce: leaves whose sums round differently in other orders; each rank's part is the
// tree over its own leaves, and every rank must end with the bits of the whole tree summed by one
// process, whatever the number of ranks (2 and 3 here; 3 owns subtrees of unequal size).
// With by_node (shared memory inside each node, then across the nodes' leaders), the same. ctest
// also runs it with MINIDL_RANKS_PER_NODE=1 and =2 on 3 ranks: nodes of one rank, of two and one.
void tree_allreduce_has_the_bits_of_the_whole_tree(bool by_node) {
  parallel::Communicator& world = parallel::world();
  const int p = world.size(), r = world.rank();
  ASSERT_GT(p, 1) << "run this test under mpirun with at least 2 ranks";
  const std::int64_t leaves = 2 * p + 1, n = 257;
  // Leaf l, element i: magnitudes over many binades.
  auto leaf = [](std::int64_t l, std::int64_t i) {
    return std::ldexp(1.0f + 0.1f * static_cast<float>((l * 7 + i * 3) % 11),
                      static_cast<int>((l * 13 + i * 5) % 41) - 20) *
           ((l + i) % 3 == 0 ? -1.0f : 1.0f);
  };
  auto tree = [&](auto& self, std::int64_t lo, std::int64_t len, std::int64_t i) -> float {
    if (len == 1) return leaf(lo, i);
    const std::int64_t left = parallel::tree_left(len);
    return self(self, lo, left, i) + self(self, lo + left, len - left, i);
  };
  const auto [lo, hi] = parallel::tree_owners(leaves, p)[static_cast<std::size_t>(r)];
  Tensor x = Tensor::empty({n});
  for (std::int64_t i = 0; i < n; ++i) x.data<float>()[i] = tree(tree, lo, hi - lo, i);
  ir::Graph g;
  g.add_output(parallel::tree_allreduce(ops::parameter(g, "x", x), leaves, 0, "", by_node));
  runtime::Executable exe(g);
  exe.run();
  int order_mattered = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float whole = tree(tree, 0, leaves, i);
    float sequential = 0.0f;
    for (std::int64_t l = 0; l < leaves; ++l) sequential += leaf(l, i);
    order_mattered += sequential != whole;
    ASSERT_EQ(std::memcmp(&x.data<float>()[i], &whole, sizeof whole), 0)
        << "element " << i << ": " << x.data<float>()[i] << " against " << whole;
  }
  EXPECT_GT(order_mattered, 10) << "the data does not tell summation orders apart";
}

TEST(MpiCollectives, TreeAllreduceHasTheBitsOfTheWholeTree) {
  tree_allreduce_has_the_bits_of_the_whole_tree(false);
}
TEST(MpiCollectives, TreeAllreduceByNodeHasTheBitsOfTheWholeTree) {
  tree_allreduce_has_the_bits_of_the_whole_tree(true);
}

// hierarchical_allreduce: sums in each node's shared memory, then across the leaders; two of
// them in one graph (the shared region is reused, and grown for the larger), run twice.
TEST(MpiCollectives, HierarchicalAllreduceSumsOverAllRanks) {
  parallel::Communicator& world = parallel::world();
  const int p = world.size(), r = world.rank();
  ASSERT_GT(p, 1) << "run this test under mpirun with at least 2 ranks";
  Tensor a = contribution(r, {37}), b = contribution(r, {3001});
  ir::Graph g;
  ir::Value* ya = parallel::hierarchical_allreduce(ops::parameter(g, "a", a), 0.5);
  ir::Value* yb = parallel::hierarchical_allreduce(ops::parameter(g, "b", b), 2.0);
  g.add_output(ya);
  g.add_output(yb);
  runtime::Executable exe(g);
  auto sum = [&](std::int64_t i) {
    double t = 0;
    for (int q = 0; q < p; ++q) t += value(q, i);
    return t;
  };
  exe.run();
  for (std::int64_t i = 0; i < 37; ++i) ASSERT_EQ(a.at(i), 0.5 * sum(i)) << "a " << i;
  for (std::int64_t i = 0; i < 3001; ++i) ASSERT_EQ(b.at(i), 2.0 * sum(i)) << "b " << i;
  // Again, on the sums: every rank holds the same, so the result is p times it, scaled.
  exe.run();
  for (std::int64_t i = 0; i < 37; ++i) ASSERT_EQ(a.at(i), 0.25 * p * sum(i)) << "a again " << i;
  for (std::int64_t i = 0; i < 3001; ++i) ASSERT_EQ(b.at(i), 4.0 * p * sum(i)) << "b again " << i;
}

// MINIDL_RANKS_PER_NODE=k pretends nodes of k consecutive ranks; without it all ranks of this
// one-machine job share a node.
TEST(MpiCollectives, SplitIntoNodesAndLeaders) {
  parallel::Communicator& world = parallel::world();
  const int p = world.size(), r = world.rank();
  const char* env = std::getenv("MINIDL_RANKS_PER_NODE");
  const int k = env ? std::atoi(env) : p;
  const auto& s = world.split_shared();
  const int node_first = r / k * k;
  EXPECT_EQ(s.node->size(), std::min(k, p - node_first));
  EXPECT_EQ(s.node->rank(), r - node_first);
  EXPECT_EQ(s.leader, r % k == 0);
  EXPECT_EQ(s.nodes, (p + k - 1) / k);
  EXPECT_EQ(s.leaders->size(), s.leader ? s.nodes : 1);
  EXPECT_EQ(&world.split_shared(), &s) << "the split is made once";

  // The two levels through the ops: rank r contributes r + 1.
  Tensor x = Tensor::full({4}, static_cast<float>(r + 1));
  ir::Graph g;
  const int node = parallel::register_group(s.node), leaders = parallel::register_group(s.leaders);
  ir::Value* v = parallel::reduce(ops::parameter(g, "x", x), 1.0, 0, node);
  v = parallel::allreduce(v, 1.0, leaders);
  parallel::broadcast(v, 0, node);
  runtime::Executable exe(g);
  exe.run();
  for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(x.at(i), p * (p + 1) / 2);

  // An explicit value wins over the environment.
  const auto& ones = world.split_shared(1);
  EXPECT_EQ(ones.node->size(), 1);
  EXPECT_EQ(ones.nodes, p);
}

// ZeRO's collectives: reduce_scatter (MPI's sum, and the tree's) gives each rank its shard of
// the sum, allgatherv every rank's shard in rank order, on uneven shards (3 ranks).
TEST(MpiCollectives, ReduceScatterAndAllgathervOnUnevenShards) {
  parallel::Communicator& world = parallel::world();
  const int p = world.size(), r = world.rank();
  ASSERT_GT(p, 1) << "run this test under mpirun with at least 2 ranks";
  const std::int64_t n = 7;
  ir::Ints bounds;
  for (int k = 0; k <= p; ++k) bounds.push_back(k * n / p);
  const std::int64_t lo = bounds[r], len = bounds[r + 1] - lo;
  Tensor x = contribution(r, {n}), shard = contribution(r, {len});
  ir::Graph g;
  parallel::register_ops();
  ir::Value* px = ops::parameter(g, "x", x);
  const ir::Attrs shards = {{"bounds", bounds}, {"rank", std::int64_t{r}}};
  const ir::Attrs mpi = {
      {"bounds", bounds}, {"rank", std::int64_t{r}}, {"leaves", std::int64_t{0}}};
  const ir::Attrs tree = {
      {"bounds", bounds}, {"rank", std::int64_t{r}}, {"leaves", std::int64_t{p + 1}}};
  ir::Value* sum = g.add_node(ops::op("reduce_scatter"), {px}, mpi, "rs")->output();
  ir::Value* tree_sum = g.add_node(ops::op("reduce_scatter"), {px}, tree, "rs_tree")->output();
  ir::Value* all =
      g.add_node(ops::op("allgatherv"), {ops::parameter(g, "shard", shard)}, shards, "ag")
          ->output();
  EXPECT_EQ(sum->shape(), (Shape{len}));
  EXPECT_EQ(all->shape(), (Shape{n}));
  for (ir::Value* v : {sum, tree_sum, all}) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();
  for (std::int64_t i = 0; i < len; ++i) {
    float want = 0.0f;
    for (int q = 0; q < p; ++q) want += value(q, lo + i);
    EXPECT_EQ(exe.value(sum).at(i), want) << "element " << i;
    EXPECT_EQ(exe.value(tree_sum).at(i), want) << "element " << i;
  }
  for (int q = 0; q < p; ++q)
    for (std::int64_t i = bounds[q]; i < bounds[q + 1]; ++i)
      EXPECT_EQ(exe.value(all).at(i), value(q, i - bounds[q])) << "rank " << q << " element " << i;
}

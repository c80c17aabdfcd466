#include "minidl/parallel/collectives.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "minidl/core/clock.hpp"
#include "minidl/core/idle.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/parallel/reduction_tree.hpp"
#include "minidl/parallel/traffic.hpp"

namespace minidl::parallel {
namespace {

constexpr const char* kNoGrad = "communication is inserted after differentiation";
// MPI guarantees tags up to 32767 (MPI_TAG_UB may allow more).
constexpr std::int64_t kMaxTag = 32767;

// The communicator a node names, looked up once when its kernel is compiled.
Communicator* comm_of(const ir::Node& node) {
  const auto id = node.attrs().get<std::int64_t>("group");
  try {
    return &group(static_cast<int>(id));
  } catch (const Error& e) {
    MINIDL_FAIL(node.describe(), ": ", e.what());
  }
}

Communicator* comm_with_rank(const ir::Node& node, const char* attr) {
  Communicator* comm = comm_of(node);
  const auto r = node.attrs().get<std::int64_t>(attr);
  MINIDL_CHECK(r < comm->size(), node.describe(), ": ", attr, "=", r, " but communicator group ",
               node.attrs().get<std::int64_t>("group"), " has ", comm->size(), " ranks");
  return comm;
}

void scale_in_place(float* x, std::int64_t n, float scale) {
  if (scale == 1.0f) return;
  ops::elementwise(n, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) x[i] *= scale;
  });
}

void check_rank_attr(ir::InferCtx& c, const char* attr) {
  const auto r = c.attr<std::int64_t>(attr);
  MINIDL_CHECK_NODE(c, r >= 0, attr, " must be a rank (>= 0), got ", r);
}

/// A collective's kernel factory whose kernels name their node in the errors they throw (a
/// collective timeout, an MPI failure): the communicator itself knows no nodes.
ir::KernelFactory naming(ir::Kernel (*make)(const ir::Node&)) {
  return [make](const ir::Node& node) -> ir::Kernel {
    return [kernel = make(node)](const ir::KernelArgs& k) {
      try {
        kernel(k);
      } catch (const Error& e) {
        MINIDL_FAIL(k.node->describe(), ": ", e.what());
      }
    };
  };
}

void check_tag(ir::InferCtx& c) {
  const auto tag = c.attr<std::int64_t>("tag");
  MINIDL_CHECK_NODE(c, tag >= 0 && tag <= kMaxTag, "tag must be in [0, ", kMaxTag, "], got ", tag);
}

// ---- allreduce, reduce, broadcast, allgather ------------------------------------------------

// src/dst [...] in place: dst = sum_ranks(scale * src). The scale is applied before the sum so
// that ranks with different shares of a batch weight their gradients by their share.
ir::Kernel make_allreduce(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const float scale = node.attrs().get<float>("scale");
  return [comm, scale](const ir::KernelArgs& k) {
    float* x = k.out[0].data<float>();
    scale_in_place(x, k.out[0].numel(), scale);
    comm->allreduce_sum(x, k.out[0].numel());
  };
}

void infer_reduce(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  check_rank_attr(c, "root");
}

ir::Kernel make_reduce(const ir::Node& node) {
  Communicator* comm = comm_with_rank(node, "root");
  const float scale = node.attrs().get<float>("scale");
  const int root = static_cast<int>(node.attrs().get<std::int64_t>("root"));
  return [comm, scale, root](const ir::KernelArgs& k) {
    float* x = k.out[0].data<float>();
    scale_in_place(x, k.out[0].numel(), scale);
    comm->reduce_sum(x, k.out[0].numel(), root);
  };
}

void infer_broadcast(ir::InferCtx& c) {
  ops::infer_like_input0(c);
  check_rank_attr(c, "root");
}

ir::Kernel make_broadcast(const ir::Node& node) {
  Communicator* comm = comm_with_rank(node, "root");
  const int root = static_cast<int>(node.attrs().get<std::int64_t>("root"));
  return [comm, root](const ir::KernelArgs& k) {
    comm->broadcast(k.out[0].raw(), static_cast<std::int64_t>(k.out[0].nbytes()), root);
  };
}

// x [d0, ...] -> y [ranks * d0, ...]; a scalar gives [ranks].
void infer_allgather(ir::InferCtx& c) {
  const auto ranks = c.attr<std::int64_t>("ranks");
  MINIDL_CHECK_NODE(c, ranks >= 1, "ranks must be at least 1, got ", ranks);
  std::vector<std::int64_t> dims = c.input(0).dims();
  if (dims.empty())
    dims.push_back(ranks);
  else
    dims[0] *= ranks;
  c.set_output(0, Shape(dims), c.dtype(0));
}

ir::Kernel make_allgather(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto ranks = node.attrs().get<std::int64_t>("ranks");
  MINIDL_CHECK(ranks == comm->size(), node.describe(), ": ranks=", ranks,
               " but communicator group ", node.attrs().get<std::int64_t>("group"), " has ",
               comm->size(), " ranks");
  return [comm](const ir::KernelArgs& k) {
    comm->allgather(k.in[0].raw(), k.out[0].raw(), static_cast<std::int64_t>(k.in[0].nbytes()));
  };
}

// ---- tree_allreduce ---------------------------------------------------------------------------

void infer_tree_allreduce(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  const auto leaves = c.attr<std::int64_t>("leaves");
  MINIDL_CHECK_NODE(c, leaves >= 1, "leaves must be at least 1, got ", leaves);
}

// src/dst [...] in place: every rank's x is the sum over its subtree of the tree over `leaves`
// micro-shards (reduction_tree.hpp); the ranks' parts are gathered and every rank joins them in
// the tree's order, so all end with the same bits, whatever MPI's own reduction order.
ir::Kernel make_tree_allreduce(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto leaves = node.attrs().get<std::int64_t>("leaves");
  MINIDL_CHECK(leaves >= comm->size(), node.describe(), ": a tree over ", leaves,
               " micro-shard(s) cannot give each of the ", comm->size(), " ranks of group ",
               node.attrs().get<std::int64_t>("group"), " one");
  const Communicator::SharedSplit* split = nullptr;
  if (node.attrs().get<std::int64_t>("by_node") != 0)
    split = &comm->split_shared(static_cast<int>(node.attrs().get<std::int64_t>("ranks_per_node")));
  auto tree = std::make_shared<TreeAllreduce>(*comm, leaves, node.output()->shape().numel(), split);
  return [tree](const ir::KernelArgs& k) { (*tree)(k.out[0].data<float>()); };
}

void infer_ranks_per_node(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  const auto k = c.attr<std::int64_t>("ranks_per_node");
  MINIDL_CHECK_NODE(c, k >= 0, "ranks_per_node must be >= 0 (0: the real nodes), got ", k);
}

void infer_tree_by_node(ir::InferCtx& c) {
  infer_tree_allreduce(c);
  infer_ranks_per_node(c);
}

// ---- hierarchical_allreduce ---------------------------------------------------------------

ir::Kernel make_hierarchical_allreduce(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const Communicator::SharedSplit& split =
      comm->split_shared(static_cast<int>(node.attrs().get<std::int64_t>("ranks_per_node")));
  auto reduce = std::make_shared<NodeAllreduce>(split, node.output()->shape().numel(),
                                                node.attrs().get<float>("scale"));
  return [reduce](const ir::KernelArgs& k) { (*reduce)(k.out[0].data<float>()); };
}

/// The elements [lo, hi) of n that rank r of k works on in shared memory.
std::pair<std::int64_t, std::int64_t> slice_of(std::int64_t n, int r, int k) {
  return {n * r / k, n * (r + 1) / k};
}

/// dst[i] += src[i] for i in [lo, hi).
void add_range(float* dst, const float* src, std::int64_t lo, std::int64_t hi) {
  ops::elementwise(hi - lo, [&](std::int64_t b, std::int64_t e) {
    float* d = dst + lo;
    const float* s = src + lo;
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) d[i] += s[i];
  });
}

// ---- allreduce_start / allreduce_wait ---------------------------------------------------------

void infer_start(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  c.set_output(1, Shape{1}, DType::I64);
}

// The buffer is in flight between start and wait: MPI may write it at any time, so only the wait
// may read it. The memory plan keeps it alive until the wait because the wait's output shares it.
ir::Kernel make_start(const ir::Node& node) {
  const ir::Node* wait = nullptr;
  for (const ir::Value* v : node.outputs()) {
    for (const ir::Node* u : v->users()) {
      MINIDL_CHECK(&u->def() == &op_allreduce_wait && (wait == nullptr || wait == u),
                   node.describe(), ": only its allreduce_wait may read the in-flight value ",
                   v->ref(), ", but ", u->describe(), " reads it");
      wait = u;
    }
  }
  MINIDL_CHECK(wait != nullptr, node.describe(), ": no allreduce_wait completes this allreduce");
  Communicator* comm = comm_of(node);
  const float scale = node.attrs().get<float>("scale");
  return [comm, scale](const ir::KernelArgs& k) {
    float* x = k.out[0].data<float>();
    scale_in_place(x, k.out[0].numel(), scale);
    k.out[1].data<std::int64_t>()[0] = comm->start_allreduce_sum(x, k.out[0].numel()).id;
  };
}

// Both inputs must be the outputs of one allreduce_start: the request says which operation.
void infer_wait(ir::InferCtx& c) {
  const ir::Node& n = c.node();
  const ir::Node* start = n.input(0)->producer();
  MINIDL_CHECK_NODE(c,
                    &start->def() == &op_allreduce_start && n.input(0)->index() == 0 &&
                        n.input(1) == start->output(1),
                    "expected the in-flight value and the request of one allreduce_start");
  c.set_output(0, c.input(0));
}

ir::Kernel make_wait(const ir::Node& node) {
  Communicator* comm = comm_of(*node.input(0)->producer());
  return [comm](const ir::KernelArgs& k) {
    comm->wait(Communicator::Request{k.in[1].data<std::int64_t>()[0]});
  };
}

// ---- send / recv ------------------------------------------------------------------------------

void infer_send(ir::InferCtx& c) {
  check_rank_attr(c, "peer");
  check_tag(c);
}

// A value in a channel-blocked layout (ir::Value::layout) travels in the plain one, so that the
// two ends may keep their own layouts (each pipeline stage chooses its values' alone); the
// reorders only move elements, so no bit changes.
struct Blocking {
  std::int64_t N = 0, C = 0, S = 0, B = 1;  // [N, C, H*W], channels in blocks of B
  bool blocked() const { return B > 1; }
  std::int64_t numel() const { return N * C * S; }
};

Blocking blocking_of(const ir::Value* v) {
  const std::int64_t b = ir::channel_block(v->layout());
  if (b <= 1) return {};
  const Shape& s = v->shape();
  return {s[0], s[1], s[2] * s[3], b};
}

// 4-byte elements (f32, i32: the dtypes a blocked value may have). to_plain: blocked -> plain;
// else plain -> blocked.
void reorder(const Blocking& g, const std::uint32_t* from, std::uint32_t* to, bool to_plain) {
  for (std::int64_t n = 0; n < g.N; ++n)
    for (std::int64_t c = 0; c < g.C; ++c)
      for (std::int64_t sp = 0; sp < g.S; ++sp) {
        const std::int64_t plain = (n * g.C + c) * g.S + sp;
        const std::int64_t blocked = ((n * (g.C / g.B) + c / g.B) * g.S + sp) * g.B + c % g.B;
        if (to_plain)
          to[plain] = from[blocked];
        else
          to[blocked] = from[plain];
      }
}

ir::Kernel make_send(const ir::Node& node) {
  Communicator* comm = comm_with_rank(node, "peer");
  const int peer = static_cast<int>(node.attrs().get<std::int64_t>("peer"));
  const int tag = static_cast<int>(node.attrs().get<std::int64_t>("tag"));
  const Blocking g = blocking_of(node.input(0));
  auto plain = std::make_shared<std::vector<std::uint32_t>>(
      static_cast<std::size_t>(g.blocked() ? g.numel() : 0));
  return [comm, peer, tag, g, plain](const ir::KernelArgs& k) {
    const auto bytes = static_cast<std::int64_t>(k.in[0].nbytes());
    if (!g.blocked()) return comm->send(k.in[0].raw(), bytes, peer, tag);
    reorder(g, static_cast<const std::uint32_t*>(k.in[0].raw()), plain->data(), true);
    comm->send(plain->data(), bytes, peer, tag);
  };
}

void infer_recv(ir::InferCtx& c) {
  check_rank_attr(c, "peer");
  check_tag(c);
  const auto dims = c.attr<ir::Ints>("shape");
  for (auto d : dims) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", Shape(dims));
  DType t = DType::F32;
  try {
    t = ops::parse_dtype(c.attr<std::string>("dtype"));
  } catch (const Error& e) {
    c.fail(e.what());
  }
  c.set_output(0, Shape(dims), t);
}

ir::Kernel make_recv(const ir::Node& node) {
  Communicator* comm = comm_with_rank(node, "peer");
  const int peer = static_cast<int>(node.attrs().get<std::int64_t>("peer"));
  const int tag = static_cast<int>(node.attrs().get<std::int64_t>("tag"));
  const Blocking g = blocking_of(node.output());
  auto plain = std::make_shared<std::vector<std::uint32_t>>(
      static_cast<std::size_t>(g.blocked() ? g.numel() : 0));
  return [comm, peer, tag, g, plain](const ir::KernelArgs& k) {
    // Waiting for the message to arrive is idle time (the sender is still computing it: a
    // pipeline's bubble); receiving and reordering it is this kernel's work.
    if (idle_wanted()) {
      const Clock::time_point t = Clock::now();
      comm->probe(peer, tag);
      note_idle(std::chrono::duration<double>(Clock::now() - t).count());
    }
    const auto bytes = static_cast<std::int64_t>(k.out[0].nbytes());
    if (!g.blocked()) return comm->recv(k.out[0].raw(), bytes, peer, tag);
    comm->recv(plain->data(), bytes, peer, tag);
    reorder(g, plain->data(), static_cast<std::uint32_t*>(k.out[0].raw()), false);
  };
}

// ---- buckets ----------------------------------------------------------------------------------

// bucket [n], x [...] -> bucket [n] with x's elements at [offset, offset + x.numel()).
void infer_pack(ir::InferCtx& c) {
  const Shape& b = c.input(0);
  const auto offset = c.attr<std::int64_t>("offset");
  MINIDL_CHECK_NODE(c, b.rank() == 1 && c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
                    "expected a flat f32 bucket and an f32 value");
  MINIDL_CHECK_NODE(c, offset >= 0 && offset + c.input(1).numel() <= b.numel(), "offset ", offset,
                    " + ", c.input(1).numel(), " elements exceeds the bucket's ", b.numel());
  c.set_output(0, b);
}

void pack_native(const ir::KernelArgs& k) {
  const auto offset = k.attrs().get<std::int64_t>("offset");
  std::memcpy(k.out[0].data<float>() + offset, k.in[1].raw(), k.in[1].nbytes());
}

// bucket [...] -> y [shape], the elements [offset, offset + numel) of the bucket, read flat (a
// bucket, or any f32 value: ZeRO's piece of a parameter).
void infer_unpack(ir::InferCtx& c) {
  const Shape& b = c.input(0);
  const Shape y(c.attr<ir::Ints>("shape"));
  const auto offset = c.attr<std::int64_t>("offset");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected an f32 bucket");
  MINIDL_CHECK_NODE(c, offset >= 0 && offset + y.numel() <= b.numel(), "offset ", offset, " + ", y,
                    " exceeds the bucket's ", b.numel(), " elements");
  c.set_output(0, y);
}

void unpack_native(const ir::KernelArgs& k) {
  const auto offset = k.attrs().get<std::int64_t>("offset");
  std::memcpy(k.out[0].raw(), k.in[0].data<float>() + offset, k.out[0].nbytes());
}

void infer_nothing(ir::InferCtx&) {}

ir::Kernel make_progress(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  return [comm](const ir::KernelArgs&) { comm->progress(); };
}

}  // namespace

// ---- the ops ----------------------------------------------------------------------------------

MINIDL_OP(allreduce)
    .inputs({"x"})
    .attr<float>("scale", 1.0f)
    .attr<int>("group", 0)
    .infer(ops::infer_unary_f32)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_allreduce))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(reduce)
    .inputs({"x"})
    .attr<float>("scale", 1.0f)
    .attr<int>("root", 0)
    .attr<int>("group", 0)
    .infer(infer_reduce)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_reduce))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(broadcast)
    .inputs({"x"})
    .attr<int>("root", 0)
    .attr<int>("group", 0)
    .infer(infer_broadcast)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_broadcast))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(allgather)
    .inputs({"x"})
    .attr<int>("ranks")
    .attr<int>("group", 0)
    .infer(infer_allgather)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_allgather))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(tree_allreduce)
    .inputs({"x"})
    .attr<int>("leaves")
    .attr<int>("group", 0)
    .attr<int>("by_node", 0)
    .attr<int>("ranks_per_node", 0)
    .infer(infer_tree_by_node)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_tree_allreduce))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(hierarchical_allreduce)
    .inputs({"x"})
    .attr<float>("scale", 1.0f)
    .attr<int>("group", 0)
    .attr<int>("ranks_per_node", 0)
    .infer(infer_ranks_per_node)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_hierarchical_allreduce))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(allreduce_start)
    .inputs({"x"})
    .outputs({"in_flight", "request"})
    .attr<float>("scale", 1.0f)
    .attr<int>("group", 0)
    .infer(infer_start)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_start))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(allreduce_wait)
    .inputs({"in_flight", "request"})
    .infer(infer_wait)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_wait))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Wait)
    .no_grad(kNoGrad);

MINIDL_OP(send)
    .inputs({"x"})
    .outputs({})
    .attr<int>("peer")
    .attr<int>("tag", 0)
    .attr<int>("group", 0)
    .infer(infer_send)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_send))
    .layout_aware()
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(recv)
    .inputs({})
    .attr<ir::Ints>("shape")
    .attr<std::string>("dtype", "f32")
    .attr<int>("peer")
    .attr<int>("tag", 0)
    .attr<int>("group", 0)
    .infer(infer_recv)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_recv))
    .layout_aware()
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(bucket_pack)
    .inputs({"bucket", "x"})
    .attr<int>("offset")
    .infer(infer_pack)
    .kernel(ir::Backend::Native, pack_native)
    .inplace(0, 0)
    .no_grad(kNoGrad);

MINIDL_OP(bucket_unpack)
    .inputs({"bucket"})
    .attr<int>("offset")
    .attr<ir::Ints>("shape")
    .infer(infer_unpack)
    .kernel(ir::Backend::Native, unpack_native)
    .no_grad(kNoGrad);

MINIDL_OP(comm_progress)
    .inputs({})
    .outputs({})
    .attr<int>("group", 0)
    .infer(infer_nothing)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_progress))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

void register_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const ir::OpDef* d : op_table()) ops::register_op(*d);
  });
}

namespace {

ir::Node* add(const ir::OpDef& def, std::vector<ir::Value*> inputs, ir::Attrs attrs,
              const std::string& name, ir::Graph* g = nullptr) {
  register_ops();
  ir::Graph& graph = g ? *g : inputs.at(0)->graph();
  return graph.add_node(def, std::move(inputs), std::move(attrs), name);
}

}  // namespace

ir::Value* allreduce(ir::Value* x, double scale, int group, const std::string& name) {
  return add(op_allreduce, {x}, {{"scale", scale}, {"group", std::int64_t{group}}}, name)->output();
}

ir::Value* reduce(ir::Value* x, double scale, int root, int group, const std::string& name) {
  return add(op_reduce, {x},
             {{"scale", scale}, {"root", std::int64_t{root}}, {"group", std::int64_t{group}}}, name)
      ->output();
}

ir::Value* broadcast(ir::Value* x, int root, int group, const std::string& name) {
  return add(op_broadcast, {x}, {{"root", std::int64_t{root}}, {"group", std::int64_t{group}}},
             name)
      ->output();
}

ir::Value* allgather(ir::Value* x, int group, const std::string& name) {
  const std::int64_t ranks = parallel::group(group).size();
  return add(op_allgather, {x}, {{"ranks", ranks}, {"group", std::int64_t{group}}}, name)->output();
}

TreeAllreduce::TreeAllreduce(Communicator& comm, std::int64_t leaves, std::int64_t n,
                             const Communicator::SharedSplit* split)
    : comm_(comm), n_(n), split_(split) {
  MINIDL_CHECK(leaves >= comm.size(), "a tree over ", leaves,
               " micro-shard(s) cannot give each of the ", comm.size(), " ranks one");
  tree_combine_order(leaves, comm.size(), [&](int a, int b) { joins_.emplace_back(a, b); });
  if (!joins_.empty()) parts_.resize(static_cast<std::size_t>(n * comm.size()));
}

void TreeAllreduce::operator()(float* x) {
  if (joins_.empty()) return;  // one rank: its part is the whole tree
  if (split_ != nullptr) {
    by_node(x);
    return;
  }
  float* all = parts_.data();
  comm_.allgather(x, all, n_ * static_cast<std::int64_t>(sizeof(float)));
  const std::int64_t n = n_;
  for (const auto& [a, b] : joins_) {
    float* dst = all + a * n;
    const float* src = all + b * n;
    ops::elementwise(n, [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
      for (std::int64_t i = lo; i < hi; ++i) dst[i] += src[i];
    });
  }
  std::memcpy(x, all, static_cast<std::size_t>(n) * sizeof(float));
}

void TreeAllreduce::plan_nodes() {
  const int ranks = comm_.size();
  Communicator& node = *split_->node;
  // Every rank's node (named by its leader's rank) and its rank inside the node.
  std::int64_t leader = comm_.rank();
  node.broadcast(&leader, sizeof(leader), 0);
  const std::int64_t mine[2] = {leader, node.rank()};
  std::vector<std::int64_t> all(static_cast<std::size_t>(2 * ranks));
  comm_.allgather(mine, all.data(), sizeof(mine));
  std::vector<int> node_of(static_cast<std::size_t>(ranks));
  local_of_.resize(static_cast<std::size_t>(ranks));
  std::vector<int> leaders;
  for (int r = 0; r < ranks; ++r) {
    node_of[r] = static_cast<int>(all[2 * r]);
    local_of_[r] = static_cast<int>(all[2 * r + 1]);
    if (local_of_[r] == 0) leaders.push_back(r);  // in rank order, as in the leaders' group
  }
  auto index_of = [&](int leader_rank) {
    return static_cast<int>(std::find(leaders.begin(), leaders.end(), leader_rank) -
                            leaders.begin());
  };
  // Walk the joins: a join of two parts that lie wholly in one node runs inside that node;
  // any other join runs on the gathered parts, which the nodes hand over as they are then.
  std::vector<int> part_node = node_of;  // -1: the part spans several nodes
  std::vector<std::vector<int>> exports(leaders.size());
  auto hand_over = [&](int w) {
    if (part_node[w] < 0) return;
    exports[index_of(part_node[w])].push_back(w);
    part_node[w] = -1;
  };
  const int my_node = node_of[comm_.rank()];
  for (const auto& [a, b] : joins_) {
    if (part_node[a] >= 0 && part_node[a] == part_node[b]) {
      if (part_node[a] == my_node) local_joins_.emplace_back(a, b);
      continue;
    }
    hand_over(a);
    hand_over(b);
    global_joins_.emplace_back(a, b);
  }
  most_exported_ = 0;
  for (const auto& e : exports)
    most_exported_ = std::max(most_exported_, static_cast<std::int64_t>(e.size()));
  gathered_at_.assign(static_cast<std::size_t>(ranks), -1);
  for (std::size_t i = 0; i < exports.size(); ++i)
    for (std::size_t j = 0; j < exports[i].size(); ++j)
      gathered_at_[exports[i][j]] =
          static_cast<std::int64_t>(i) * most_exported_ + static_cast<std::int64_t>(j);
  exported_ = exports[index_of(my_node)];
  MINIDL_CHECK(static_cast<int>(leaders.size()) == split_->nodes,
               "tree_allreduce: ", leaders.size(), " node leaders among the ranks, the split has ",
               split_->nodes);
  planned_ = true;
}

// Shared region of the node: one slot of n floats per rank of the node (its part, then the
// node's joins in place), the node's parts for the leaders, and every node's parts gathered.
// Each rank joins its slice of the elements; a sync separates the steps (none after the last
// read: the next call writes to the region's other half, see NodeAllreduce). Element by element
// the joins are those of the flat tree, in an order that respects it, so the bits are the same.
void TreeAllreduce::by_node(float* x) {
  if (!planned_) plan_nodes();
  Communicator& node = *split_->node;
  const int k = node.size(), me = node.rank();
  const std::int64_t n = n_, e = most_exported_;
  const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
  auto* slots = static_cast<float*>(
      node.shared_region((k + e + static_cast<std::int64_t>(split_->nodes) * e) * n *
                         static_cast<std::int64_t>(sizeof(float))));
  float* staged = slots + k * n;
  float* gathered = staged + e * n;
  auto slot = [&](int rank) { return slots + local_of_[rank] * n; };
  const auto range = slice_of(n, me, k);
  const std::int64_t lo = range.first, hi = range.second;

  std::memcpy(slots + me * n, x, bytes);
  count_collective_bytes(static_cast<std::int64_t>(bytes));
  node.shared_sync();
  for (const auto& [a, b] : local_joins_) add_range(slot(a), slot(b), lo, hi);
  node.shared_sync();
  if (global_joins_.empty()) {  // one node: the tree's root is rank 0's slot
    std::memcpy(x, slot(0), bytes);
    return;
  }
  for (std::size_t j = 0; j < exported_.size(); ++j)
    std::memcpy(staged + static_cast<std::int64_t>(j) * n + lo, slot(exported_[j]) + lo,
                static_cast<std::size_t>(hi - lo) * sizeof(float));
  node.shared_sync();
  if (split_->leader)
    split_->leaders->allgather(staged, gathered, e * n * static_cast<std::int64_t>(sizeof(float)));
  node.shared_sync();
  auto part = [&](int rank) { return gathered + gathered_at_[rank] * n; };
  for (const auto& [a, b] : global_joins_) add_range(part(a), part(b), lo, hi);
  node.shared_sync();
  std::memcpy(x, part(0), bytes);
}

NodeAllreduce::NodeAllreduce(const Communicator::SharedSplit& split, std::int64_t n, float scale)
    : split_(split), n_(n), scale_(scale) {}

// Shared region of the node: one slot of n floats per rank of the node, then the node's sum.
// The next call writes to the other half of the region (Communicator::shared_region), so the
// ranks may read the result and leave without waiting for each other: the call after that
// writes here again only past its first sync, which every rank enters after reading.
void NodeAllreduce::operator()(float* x) {
  Communicator& node = *split_.node;
  const int k = node.size(), me = node.rank();
  const std::int64_t n = n_;
  if (k == 1) {  // alone on the node: nothing to share
    scale_in_place(x, n, scale_);
    if (split_.nodes > 1) split_.leaders->allreduce_sum(x, n);
    return;
  }
  auto* slots = static_cast<float*>(
      node.shared_region((k + 1) * n * static_cast<std::int64_t>(sizeof(float))));
  float* sum = slots + k * n;
  float* mine = slots + me * n;
  const float scale = scale_;
  ops::elementwise(n, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) mine[i] = scale * x[i];
  });
  count_collective_bytes(n * static_cast<std::int64_t>(sizeof(float)));
  node.shared_sync();
  const auto range = slice_of(n, me, k);
  const std::int64_t lo = range.first, hi = range.second;
  ops::elementwise(hi - lo, [&](std::int64_t b, std::int64_t e) {
    float* d = sum + lo;
    const float* s0 = slots + lo;
    const float* s1 = slots + n + lo;
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) d[i] = s0[i] + s1[i];
    for (int r = 2; r < k; ++r) {
      const float* sr = slots + r * n + lo;
#pragma omp simd
      for (std::int64_t i = b; i < e; ++i) d[i] += sr[i];
    }
  });
  node.shared_sync();
  if (split_.nodes > 1) {
    if (split_.leader) split_.leaders->allreduce_sum(sum, n);
    node.shared_sync();
  }
  std::memcpy(x, sum, static_cast<std::size_t>(n) * sizeof(float));
}

ir::Value* tree_allreduce(ir::Value* x, std::int64_t leaves, int group, const std::string& name,
                          bool by_node, int ranks_per_node) {
  return add(op_tree_allreduce, {x},
             {{"leaves", leaves},
              {"group", std::int64_t{group}},
              {"by_node", std::int64_t{by_node ? 1 : 0}},
              {"ranks_per_node", std::int64_t{ranks_per_node}}},
             name)
      ->output();
}

ir::Value* hierarchical_allreduce(ir::Value* x, double scale, int group, int ranks_per_node,
                                  const std::string& name) {
  return add(op_hierarchical_allreduce, {x},
             {{"scale", scale},
              {"group", std::int64_t{group}},
              {"ranks_per_node", std::int64_t{ranks_per_node}}},
             name)
      ->output();
}

InFlight allreduce_start(ir::Value* x, double scale, int group, const std::string& name) {
  ir::Node* n =
      add(op_allreduce_start, {x}, {{"scale", scale}, {"group", std::int64_t{group}}}, name);
  return {n->output(0), n->output(1)};
}

ir::Value* allreduce_wait(InFlight f, const std::string& name) {
  return add(op_allreduce_wait, {f.data, f.request}, {}, name)->output();
}

ir::Node* send(ir::Value* x, int peer, int tag, int group, const std::string& name) {
  return add(
      op_send, {x},
      {{"peer", std::int64_t{peer}}, {"tag", std::int64_t{tag}}, {"group", std::int64_t{group}}},
      name);
}

ir::Value* recv(ir::Graph& g, const Shape& shape, DType dtype, int peer, int tag, int group,
                const std::string& name) {
  return add(op_recv, {},
             {{"shape", shape.dims()},
              {"dtype", std::string(dtype_name(dtype))},
              {"peer", std::int64_t{peer}},
              {"tag", std::int64_t{tag}},
              {"group", std::int64_t{group}}},
             name, &g)
      ->output();
}

ir::Value* bucket_pack(ir::Value* bucket, ir::Value* x, std::int64_t offset,
                       const std::string& name) {
  return add(op_bucket_pack, {bucket, x}, {{"offset", offset}}, name)->output();
}

ir::Value* bucket_unpack(ir::Value* bucket, std::int64_t offset, const Shape& shape,
                         const std::string& name) {
  return add(op_bucket_unpack, {bucket}, {{"offset", offset}, {"shape", shape.dims()}}, name)
      ->output();
}

ir::Node* comm_progress(ir::Graph& g, int group, const std::string& name) {
  return add(op_comm_progress, {}, {{"group", std::int64_t{group}}}, name, &g);
}

}  // namespace minidl::parallel

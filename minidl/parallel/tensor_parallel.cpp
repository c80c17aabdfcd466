#include "minidl/parallel/tensor_parallel.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "minidl/ops/common.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/parallel/traffic.hpp"

namespace minidl::parallel {
namespace {

Communicator* comm_of(const ir::Node& node) {
  const auto id = node.attrs().get<std::int64_t>("group");
  try {
    return &group(static_cast<int>(id));
  } catch (const Error& e) {
    MINIDL_FAIL(node.describe(), ": ", e.what());
  }
}

// Kernels name their node in the errors they throw (a collective timeout, an MPI failure).
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

Communicator* comm_of_size(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto ranks = node.attrs().get<std::int64_t>("ranks");
  MINIDL_CHECK(ranks == comm->size(), node.describe(), ": ranks=", ranks,
               " but communicator group ", node.attrs().get<std::int64_t>("group"), " has ",
               comm->size(), " ranks");
  return comm;
}

// x [...] with `axis` (negative from the end) cut as outer x dims[axis] x inner.
struct Cut {
  std::int64_t outer = 1, row = 1;  // row: dims[axis] * inner, the elements of one outer index
};

int normalized_axis(ir::InferCtx& c, const Shape& x) {
  const auto axis = c.attr<std::int64_t>("axis");
  const auto rank = static_cast<std::int64_t>(x.rank());
  MINIDL_CHECK_NODE(c, rank >= 1 && axis >= -rank && axis < rank, "axis ", axis,
                    " is outside the input's ", rank, " dimension(s)");
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

Cut cut_of(const Shape& x, std::int64_t axis) {
  const auto rank = static_cast<std::int64_t>(x.rank());
  if (axis < 0) axis += rank;
  Cut c;
  for (std::int64_t d = 0; d < axis; ++d) c.outer *= x[d];
  for (std::int64_t d = axis; d < rank; ++d) c.row *= x[d];
  return c;
}

void check_ranks(ir::InferCtx& c) {
  const auto ranks = c.attr<std::int64_t>("ranks");
  MINIDL_CHECK_NODE(c, ranks >= 1, "ranks must be at least 1, got ", ranks);
}

void infer_copy_reduce(ir::InferCtx& c) { ops::infer_unary_f32(c); }

// x [.., d, ..] -> [.., d / ranks, ..] along axis.
void infer_scatter(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  check_ranks(c);
  const auto ranks = c.attr<std::int64_t>("ranks");
  std::vector<std::int64_t> dims = c.input(0).dims();
  const int axis = normalized_axis(c, c.input(0));
  MINIDL_CHECK_NODE(c, dims[axis] % ranks == 0, "dimension ", axis, " of ", c.input(0), " (",
                    dims[axis], ") does not split into ", ranks, " equal parts");
  dims[axis] /= ranks;
  c.set_output(0, Shape(dims));
}

// x [.., d, ..] -> [.., ranks * d, ..] along axis.
void infer_gather(ir::InferCtx& c) {
  ops::infer_unary_f32(c);
  check_ranks(c);
  std::vector<std::int64_t> dims = c.input(0).dims();
  dims[normalized_axis(c, c.input(0))] *= c.attr<std::int64_t>("ranks");
  c.set_output(0, Shape(dims));
}

// Every shard's x gathered, then added in shard order on every rank: the same bits everywhere,
// whatever the MPI library would do. Shards that share a node (and are not told otherwise by
// --ranks-per-node) gather through the node's shared memory instead of MPI's transport: each
// writes its x to its slot, one sync, and each adds the slots. No sync after the reads: the
// next call writes to the region's other half (Communicator::shared_region), and the call after
// that writes here only past its sync, which every shard enters after reading.
ir::Kernel make_reduce(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const std::int64_t n = node.input(0)->shape().numel();
  const int ranks = comm->size();
  auto add_parts = [n, ranks](const float* all, float* y) {
    ops::elementwise(n, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        float s = all[i];
        for (int r = 1; r < ranks; ++r) s += all[r * n + i];
        y[i] = s;
      }
    });
  };
  const auto bytes = static_cast<std::int64_t>(sizeof(float)) * n;
  if (ranks == 1)
    return [](const ir::KernelArgs& k) {
      std::memcpy(k.out[0].raw(), k.in[0].raw(), k.in[0].nbytes());
    };
  // Collective, as kernels are built in the same order on every shard.
  const Communicator::SharedSplit& split = comm->split_shared();
  if (split.nodes == 1 && split.node->size() == ranks) {
    Communicator* shared = split.node;
    return [shared, n, bytes, add_parts](const ir::KernelArgs& k) {
      auto* all = static_cast<float*>(shared->shared_region(bytes * shared->size()));
      std::memcpy(all + shared->rank() * n, k.in[0].raw(), static_cast<std::size_t>(bytes));
      count_collective_bytes(bytes);
      shared->shared_sync();
      add_parts(all, k.out[0].data<float>());
    };
  }
  auto parts = std::make_shared<std::vector<float>>(static_cast<std::size_t>(n * ranks));
  return [comm, bytes, parts, add_parts](const ir::KernelArgs& k) {
    float* all = parts->data();
    comm->allgather(k.in[0].raw(), all, bytes);
    add_parts(all, k.out[0].data<float>());
  };
}

ir::Kernel make_scatter(const ir::Node& node) {
  Communicator* comm = comm_of_size(node);
  const Cut cut = cut_of(node.input(0)->shape(), node.attrs().get<std::int64_t>("axis"));
  const std::int64_t piece = cut.row / comm->size();
  const std::int64_t first = piece * comm->rank();
  return [cut, piece, first](const ir::KernelArgs& k) {
    const float* x = k.in[0].data<float>();
    float* y = k.out[0].data<float>();
    for (std::int64_t o = 0; o < cut.outer; ++o)
      std::memcpy(y + o * piece, x + o * cut.row + first,
                  static_cast<std::size_t>(piece) * sizeof(float));
  };
}

ir::Kernel make_gather(const ir::Node& node) {
  Communicator* comm = comm_of_size(node);
  const Cut cut = cut_of(node.input(0)->shape(), node.attrs().get<std::int64_t>("axis"));
  const int ranks = comm->size();
  auto parts =
      std::make_shared<std::vector<float>>(static_cast<std::size_t>(cut.outer * cut.row * ranks));
  return [comm, cut, ranks, parts](const ir::KernelArgs& k) {
    const std::int64_t n = cut.outer * cut.row;
    float* all = parts->data();
    comm->allgather(k.in[0].raw(), all, n * static_cast<std::int64_t>(sizeof(float)));
    float* y = k.out[0].data<float>();
    for (std::int64_t o = 0; o < cut.outer; ++o)
      for (int r = 0; r < ranks; ++r)
        std::memcpy(y + (o * ranks + r) * cut.row, all + r * n + o * cut.row,
                    static_cast<std::size_t>(cut.row) * sizeof(float));
  };
}

ir::Attrs group_attrs(const ir::GradCtx& g) {
  return {{"group", g.attrs().get<std::int64_t>("group")}};
}

void grad_copy(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_tp_reduce, {g.out_grad(0)}, group_attrs(g)));
}
void grad_reduce(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_tp_copy, {g.out_grad(0)}, group_attrs(g)));
}
void grad_scatter(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_tp_gather, {g.out_grad(0)}, g.attrs()));
}
void grad_gather(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_tp_scatter, {g.out_grad(0)}, g.attrs()));
}

}  // namespace

MINIDL_OP(tp_copy)
    .inputs({"x"})
    .attr<int>("group", 0)
    .infer(infer_copy_reduce)
    .alias(0, 0)  // the forward is the identity: x's buffer, no kernel
    .grad(grad_copy);

MINIDL_OP(tp_reduce)
    .inputs({"x"})
    .attr<int>("group", 0)
    .infer(infer_copy_reduce)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_reduce))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .grad(grad_reduce);

MINIDL_OP(tp_scatter)
    .inputs({"x"})
    .attr<int>("axis", -1)
    .attr<int>("ranks")
    .attr<int>("group", 0)
    .infer(infer_scatter)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_scatter))
    .grad(grad_scatter);

MINIDL_OP(tp_gather)
    .inputs({"x"})
    .attr<int>("axis", -1)
    .attr<int>("ranks")
    .attr<int>("group", 0)
    .infer(infer_gather)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_gather))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .grad(grad_gather);

namespace {

ir::Value* add(const ir::OpDef& def, ir::Value* x, ir::Attrs attrs, const std::string& name) {
  register_ops();
  return x->graph().add_node(def, {x}, std::move(attrs), name)->output();
}

}  // namespace

ir::Value* tp_copy(ir::Value* x, int group, const std::string& name) {
  return add(op_tp_copy, x, {{"group", std::int64_t{group}}}, name);
}

ir::Value* tp_reduce(ir::Value* x, int group, const std::string& name) {
  return add(op_tp_reduce, x, {{"group", std::int64_t{group}}}, name);
}

ir::Value* tp_scatter(ir::Value* x, int axis, int group, const std::string& name) {
  const std::int64_t ranks = parallel::group(group).size();
  return add(op_tp_scatter, x,
             {{"axis", std::int64_t{axis}}, {"ranks", ranks}, {"group", std::int64_t{group}}},
             name);
}

ir::Value* tp_gather(ir::Value* x, int axis, int group, const std::string& name) {
  const std::int64_t ranks = parallel::group(group).size();
  return add(op_tp_gather, x,
             {{"axis", std::int64_t{axis}}, {"ranks", ranks}, {"group", std::int64_t{group}}},
             name);
}

ir::Value* TensorParallelPlan::piece_of(ir::Value* param) const {
  for (const TensorParallelPiece& p : pieces)
    if (p.param == param) return p.piece;
  return param;
}

// ---- the rewrite ------------------------------------------------------------------------------

namespace {

bool is_parameter(const ir::Value* v) { return v->producer()->op() == "parameter"; }

// A parameter as a graph reads it whole: the parameter itself, or tp_gather of the part this
// rank stores (train::read_parameter).
bool is_stored(const ir::Value* v) {
  const ir::Node* n = v->producer();
  return is_parameter(v) || (n->op() == "tp_gather" && is_parameter(n->input(0)));
}

ir::Node* only_user(const ir::Value* v) {
  return v->users().size() == 1 ? v->users().front() : nullptr;
}

// A Linear's product: matmul(x, weight [out, in], trans_b), no bias input yet (fusion comes
// later), the weight a parameter.
bool linear_product(const ir::Node* n) {
  return n != nullptr && n->op() == "matmul" && n->inputs().size() == 2 &&
         !n->attrs().get<bool>("trans_a") && n->attrs().get<bool>("trans_b") &&
         n->attrs().get<std::string>("activation") == "none" && is_stored(n->input(1)) &&
         n->input(1)->shape().rank() == 2;
}

// bias_add(v, a parameter) reading v.
ir::Node* bias_of(const ir::Value* v) {
  ir::Node* u = only_user(v);
  return u != nullptr && u->op() == "bias_add" && u->input(0) == v && is_stored(u->input(1))
             ? u
             : nullptr;
}

struct Pair {
  ir::Node* first = nullptr;  // column-parallel product
  ir::Node* first_bias = nullptr;
  ir::Node* activation = nullptr;
  ir::Node* second = nullptr;  // row-parallel product
  ir::Node* second_bias = nullptr;
};

// The pair starting at product a, if there is one.
std::optional<Pair> pair_at(ir::Node* a) {
  if (!linear_product(a)) return std::nullopt;
  Pair p{.first = a};
  ir::Value* v = a->output();
  if (only_user(v) == nullptr) return std::nullopt;
  if ((p.first_bias = bias_of(v))) v = p.first_bias->output();
  ir::Node* u = only_user(v);
  if (u != nullptr && u->def().is_elementwise() && u->inputs().size() == 1 &&
      u->outputs().size() == 1) {
    p.activation = u;
    v = u->output();
    u = only_user(v);
  }
  if (!linear_product(u) || u->input(0) != v) return std::nullopt;
  p.second = u;
  p.second_bias = bias_of(u->output());
  return p;
}

// Every pair of g, matched before anything is rewritten; each pair's hidden width checked.
std::vector<Pair> match_pairs(ir::Graph& g, int shards) {
  std::vector<Pair> pairs;
  std::set<const ir::Node*> taken;
  for (ir::Node* n : g.nodes()) {
    if (taken.count(n)) continue;
    const std::optional<Pair> p = pair_at(n);
    if (!p) continue;
    for (ir::Node* m : {p->first, p->first_bias, p->activation, p->second, p->second_bias})
      if (m) taken.insert(m);
    pairs.push_back(*p);
  }
  MINIDL_CHECK(!pairs.empty(), "--tensor-parallel ", shards,
               ": the model has no pair of Linear layers (matmul, optional bias and activation, "
               "matmul) to split");
  for (const Pair& p : pairs) {
    const std::int64_t hidden = p.first->input(1)->shape()[0];
    MINIDL_CHECK(hidden % shards == 0, "--tensor-parallel ", shards, ": ", p.first->describe(),
                 " has ", hidden, " output features, which do not split into ", shards,
                 " equal shards");
  }
  return pairs;
}

// The parameter node of a stored value (is_stored).
const ir::Node* parameter_node(const ir::Value* v) {
  return is_parameter(v) ? v->producer() : v->producer()->input(0)->producer();
}

// The values a pair splits: its weights and first bias, each with the axis it is cut along.
std::vector<std::pair<ir::Value*, int>> split_values(const Pair& p) {
  std::vector<std::pair<ir::Value*, int>> out{{p.first->input(1), 0}};
  if (p.first_bias) out.emplace_back(p.first_bias->input(1), 0);
  out.emplace_back(p.second->input(1), 1);
  return out;
}

// This shard's part of the stored value w along axis: the parameter holding it. A parameter
// stored as this shard's part is read whole by tp_gather (train::read_parameter), whose input
// is the part; a parameter stored whole is its own part only with one shard.
ir::Value* part_of(ir::Value* w, int axis, const TensorParallelOptions& o) {
  const ir::Node* n = w->producer();
  const std::string& name = parameter_node(w)->name();
  if (n->op() == "parameter") {
    MINIDL_CHECK(o.shards == 1, "--tensor-parallel ", o.shards, ": parameter '", name, "' ",
                 w->shape(),
                 " is stored whole; the parameters of the layers it splits must be stored as "
                 "shards first (train::shard_split_parameters)");
    return w;
  }
  const auto& a = n->attrs();
  const auto stored_axis = a.get<std::int64_t>("axis");
  const auto rank = static_cast<std::int64_t>(w->shape().rank());
  MINIDL_CHECK((stored_axis < 0 ? stored_axis + rank : stored_axis) == axis &&
                   a.get<std::int64_t>("ranks") == o.shards &&
                   a.get<std::int64_t>("group") == o.group,
               "--tensor-parallel ", o.shards, ": parameter '", name, "' is stored as one of ",
               a.get<std::int64_t>("ranks"), " parts along axis ", stored_axis, " of group ",
               a.get<std::int64_t>("group"), "; the split needs one of ", o.shards, " along axis ",
               axis, " of group ", o.group);
  return n->input(0);
}

}  // namespace

std::vector<SplitParameter> plan_split(ir::Graph& g, int shards) {
  MINIDL_CHECK(shards >= 1, "--tensor-parallel must be at least 1, got ", shards);
  register_ops();
  std::vector<SplitParameter> out;
  std::set<std::string> seen;
  for (const Pair& p : match_pairs(g, shards)) {
    for (const auto& [w, axis] : split_values(p)) {
      const std::string& name = parameter_node(w)->name();
      if (seen.insert(name).second) out.push_back({name, axis});
    }
  }
  return out;
}

TensorParallelPlan split_matmul_pairs(ir::Graph& g, const TensorParallelOptions& o) {
  MINIDL_CHECK(o.shards >= 1 && o.rank >= 0 && o.rank < o.shards, "tensor parallelism: shard ",
               o.rank, " of ", o.shards);
  register_ops();
  const std::vector<Pair> pairs = match_pairs(g, o.shards);  // match first, then rewrite
  TensorParallelPlan plan;
  // One piece per parameter, read by every replica's pair (thread replicas, micro-shards).
  std::map<ir::Value*, ir::Value*> pieces;
  std::vector<ir::Node*> gathers;  // the whole reads the pieces replace
  for (const Pair& p : pairs) {
    ir::Node* last = p.second_bias ? p.second_bias : p.second;
    ir::Value* old_out = last->output();
    const std::size_t before = g.nodes().size();
    const std::string base = p.first->name();
    auto piece = [&](ir::Value* w, int axis) {
      auto [it, added] = pieces.try_emplace(w, nullptr);
      if (!added) return it->second;
      ir::Value* v = part_of(w, axis, o);
      if (v != w) gathers.push_back(w->producer());
      plan.pieces.push_back({parameter_node(w)->name(), w, v, axis});
      return it->second = v;
    };
    // The rebuilt nodes (new -> old) take the names of the nodes they replace, so profiles and
    // logs name them by their layers.
    std::vector<std::pair<ir::Node*, const ir::Node*>> renamed;
    ir::Value* y = tp_copy(p.first->input(0), o.group, base + ".tp_copy");
    y = ops::matmul(y, piece(p.first->input(1), 0), false, true);
    set_shard(*y->producer(), o.rank);
    renamed.emplace_back(y->producer(), p.first);
    if (p.first_bias) {
      y = ops::bias_add(y, piece(p.first_bias->input(1), 0));
      renamed.emplace_back(y->producer(), p.first_bias);
    }
    if (p.activation) {
      y = g.add_node(p.activation->def(), {y}, p.activation->attrs(),
                     p.activation->name() + ".shard")
              ->output();
    }
    y = ops::matmul(y, piece(p.second->input(1), 1), false, true);
    set_shard(*y->producer(), o.rank);
    renamed.emplace_back(y->producer(), p.second);
    y = tp_reduce(y, o.group, p.second->name() + ".tp_reduce");
    if (p.second_bias) {
      y = ops::bias_add(y, p.second_bias->input(1));
      renamed.emplace_back(y->producer(), p.second_bias);
    }
    const std::vector<ir::Node*> added(g.nodes().begin() + static_cast<std::ptrdiff_t>(before),
                                       g.nodes().end());
    for (ir::Node* n : added) {
      n->set_phase(p.first->phase());
      n->set_replica(p.first->replica());
      g.move_before(n, last);
    }
    g.replace_uses(old_out, y);
    std::vector<ir::Node*> old;
    for (ir::Node* m : {p.second_bias, p.second, p.activation, p.first_bias, p.first})
      if (m) old.push_back(m);
    g.remove(old);
    for (const auto& [node, was] : renamed) g.take_name(node, was);
    plan.pairs.push_back(base + " + " + p.second->name());
  }
  // The whole reads of the split parameters are read by nothing now; each is a collective,
  // which dead-code elimination would keep.
  std::erase_if(gathers, [](const ir::Node* n) { return !n->output()->users().empty(); });
  g.remove(gathers);
  return plan;
}

// ---- pieces of tensors ------------------------------------------------------------------------

int piece_axis(const Shape& whole, const Shape& piece) {
  MINIDL_CHECK(whole.rank() == piece.rank(), "tensor parallelism: a piece ", piece, " of ", whole);
  int axis = -1;
  for (int d = 0; d < whole.rank(); ++d) {
    if (whole[d] == piece[d]) continue;
    MINIDL_CHECK(axis < 0 && piece[d] > 0 && whole[d] % piece[d] == 0,
                 "tensor parallelism: ", piece, " is not a piece of ", whole,
                 " along one dimension");
    axis = d;
  }
  return axis;
}

Tensor take_piece(const Tensor& whole, const Shape& piece, int rank, int shards) {
  const int axis = piece_axis(whole.shape(), piece);
  Tensor out = Tensor::empty(piece);
  if (axis < 0) {
    out.copy_from(whole);
    return out;
  }
  MINIDL_CHECK(whole.shape()[axis] == piece[axis] * shards, "tensor parallelism: ", piece,
               " is not one of ", shards, " pieces of ", whole.shape());
  const Cut cut = cut_of(whole.shape(), axis);
  const std::int64_t part = cut.row / shards;
  for (std::int64_t o = 0; o < cut.outer; ++o)
    std::memcpy(out.data<float>() + o * part, whole.data<float>() + o * cut.row + rank * part,
                static_cast<std::size_t>(part) * sizeof(float));
  return out;
}

Tensor gather_pieces(Communicator& comm, const Tensor& piece, const Shape& whole) {
  const int axis = piece_axis(whole, piece.shape());
  Tensor out = Tensor::empty(whole);
  if (axis < 0) {
    out.copy_from(piece);
    return out;
  }
  const int ranks = comm.size();
  MINIDL_CHECK(whole[axis] == piece.shape()[axis] * ranks, "tensor parallelism: ", piece.shape(),
               " is not one of ", ranks, " pieces of ", whole);
  const Cut cut = cut_of(piece.shape(), axis);
  const std::int64_t n = cut.outer * cut.row;
  std::vector<float> all(static_cast<std::size_t>(n * ranks));
  comm.allgather(piece.raw(), all.data(), n * static_cast<std::int64_t>(sizeof(float)));
  for (std::int64_t o = 0; o < cut.outer; ++o)
    for (int r = 0; r < ranks; ++r)
      std::memcpy(out.data<float>() + (o * ranks + r) * cut.row, all.data() + r * n + o * cut.row,
                  static_cast<std::size_t>(cut.row) * sizeof(float));
  return out;
}

// ---- communicators ----------------------------------------------------------------------------

namespace {

// A communicator whose rank and size are known before it exists; every operation needs the
// split made by connect().
class Deferred final : public Communicator {
 public:
  Deferred(int rank, int size) : rank_(rank), size_(size) {}
  void connect(std::unique_ptr<Communicator> c) {
    MINIDL_CHECK(c->rank() == rank_ && c->size() == size_,
                 "tensor parallelism: the split gave rank ", c->rank(), " of ", c->size(),
                 ", the layout expects ", rank_, " of ", size_);
    inner_ = std::move(c);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return inner_ ? inner_->kind() : "unconnected"; }
  void allreduce_sum(float* d, std::int64_t n) override { get().allreduce_sum(d, n); }
  void allreduce_sum(double* d, std::int64_t n) override { get().allreduce_sum(d, n); }
  void allreduce_sum(std::int64_t* d, std::int64_t n) override { get().allreduce_sum(d, n); }
  void reduce_sum(float* d, std::int64_t n, int root) override { get().reduce_sum(d, n, root); }
  void broadcast(void* d, std::int64_t bytes, int root) override {
    get().broadcast(d, bytes, root);
  }
  void allgather(const void* in, void* out, std::int64_t bytes) override {
    get().allgather(in, out, bytes);
  }
  void allgatherv(const void* in, void* out, const std::vector<std::int64_t>& bytes) override {
    get().allgatherv(in, out, bytes);
  }
  void reduce_scatter_sum(const float* d, float* out,
                          const std::vector<std::int64_t>& counts) override {
    get().reduce_scatter_sum(d, out, counts);
  }
  void barrier() override { get().barrier(); }
  Request start_allreduce_sum(float* d, std::int64_t n) override {
    return get().start_allreduce_sum(d, n);
  }
  void wait(Request r) override { get().wait(r); }
  int progress() override { return get().progress(); }
  void send(const void* d, std::int64_t bytes, int peer, int tag) override {
    get().send(d, bytes, peer, tag);
  }
  void recv(void* d, std::int64_t bytes, int peer, int tag) override {
    get().recv(d, bytes, peer, tag);
  }
  void probe(int peer, int tag) override { get().probe(peer, tag); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return get().split(color, key);
  }
  const SharedSplit& split_shared(int ranks_per_node) override {
    return get().split_shared(ranks_per_node);
  }
  void* shared_region(std::int64_t bytes) override { return get().shared_region(bytes); }
  void shared_sync() override { get().shared_sync(); }
  std::string host() const override { return inner_ ? inner_->host() : std::string("?"); }
  [[noreturn]] void abort(int code) override {
    if (inner_) inner_->abort(code);
    std::exit(code);
  }
  void set_timeout(double seconds) override { get().set_timeout(seconds); }

 private:
  Communicator& get() {
    MINIDL_CHECK(inner_ != nullptr,
                 "tensor parallelism: a communicator of the layout used before it was connected");
    return *inner_;
  }
  int rank_, size_;
  std::unique_ptr<Communicator> inner_;
};

}  // namespace

TensorParallelComms::TensorParallelComms(Communicator& world, int shards)
    : world_(world), shards_(shards) {
  MINIDL_CHECK(shards >= 1, "--tensor-parallel must be at least 1, got ", shards);
  MINIDL_CHECK(world.size() % shards == 0, "--tensor-parallel ", shards,
               " needs a rank count divisible by ", shards, ", got ", world.size(), " rank(s)");
  const int r = world.rank();
  data_ = std::make_unique<Deferred>(r / shards, world.size() / shards);
  tensor_ = std::make_unique<Deferred>(r % shards, shards);
}

TensorParallelComms::~TensorParallelComms() = default;

void TensorParallelComms::connect() {
  const int r = world_.rank();
  static_cast<Deferred&>(*data_).connect(world_.split(r % shards_, r));
  static_cast<Deferred&>(*tensor_).connect(world_.split(r / shards_, r));
}

}  // namespace minidl::parallel

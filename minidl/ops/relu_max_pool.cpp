// Why relu(max_pool2d(x)) computes what max_pool2d(relu(x)) did, with relu(v) = v > 0 ? v : +0
// (the native kernel; oneDNN's relu forward alike) and the pooling's rule (the first maximum of
// a window in tap order, a NaN winning):
//
// Forward. relu is monotone, so the maximum of relu over a window is relu of the maximum: when
// the window's maximum m is positive, the relu'd elements equal to m are exactly the elements
// equal to m, and the rest are smaller; when m <= 0, every relu'd element is +0 and so is
// relu(m). Same value, same bits (+0 in both: relu yields +0, never -0, for v <= 0).
//
// Backward, dx for one window with output gradient dy (a relu_bwd that masks by y > 0):
// - m > 0: before, the pooling of relu(x) picked the first element equal to m, the same element
//   as the first maximum of x now; relu_bwd passed dy there (x > 0), so both give dx = 0 + dy at
//   that element and 0 elsewhere.
// - m <= 0: before, the pooling picked the window's first element (all ties at +0) and relu_bwd
//   zeroed its gradient (x <= 0); now relu_bwd zeroes dy before the pooling routes it to the
//   maximum of x. Both give 0 everywhere in the window.
// Overlapping windows sum these per element in output order in both graphs, over the same
// windows for an element with x > 0 and over zeros otherwise. A zero may differ in sign: a relu
// backward that computes 0 * dy (oneDNN's) gives -0 for a negative dy, which before reached dx
// through the element the first tap names and now through the pooling, which adds it to +0
// (+0 as a result; the oneDNN pooling backward may write -0). -0 and +0 are equal as every later
// sum, product or update uses them, unless every term of a sum is a zero.
//
// NaN is where the two differ: before, relu turned a NaN into +0 before the pooling saw it; now
// the NaN wins its window and relu turns the window's output into +0, so a window holding a NaN
// and a positive number gives +0 instead of that number. The step's loss is checked for NaN
// anyway (a non-finite activation has already spoilt the run).
#include "minidl/ops/relu_max_pool.hpp"

#include <algorithm>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/op_table.hpp"

namespace minidl::ops {

bool ReluAfterMaxPool::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* relu;
    ir::Node* pool;
  };
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "relu") continue;
    ir::Value* r = n->output(0);
    if (r->users().size() != 1 ||
        std::find(g.outputs().begin(), g.outputs().end(), r) != g.outputs().end())
      continue;
    ir::Node* pool = r->users()[0];
    if (pool->op() != "max_pool2d" || pool->input(0) != r ||
        pool->attrs().get<std::string>("activation") != "none")
      continue;
    matches.push_back({n, pool});
  }
  for (const Match& m : matches) {
    ir::Node* pool = g.add_node(op_max_pool2d, {m.relu->input(0)}, m.pool->attrs(), m.pool->name());
    pool->take_marks(*m.pool);
    ir::Node* relu = g.add_node(op_relu, {pool->output(0)}, m.relu->attrs(), m.relu->name());
    relu->take_marks(*m.relu);
    // x is defined before the old relu, the pooling's readers come after the old pooling.
    g.move_before(pool, m.pool);
    g.move_before(relu, m.pool);
    g.replace_uses(m.pool->output(0), relu->output(0));
    g.replace_uses(m.pool->output(1), pool->output(1));
    g.remove({m.pool, m.relu});
    g.take_name(pool, m.pool);
    g.take_name(relu, m.relu);
  }
  return !matches.empty();
}

}  // namespace minidl::ops

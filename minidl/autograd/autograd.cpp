#include "minidl/autograd/autograd.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "minidl/ops/op_table.hpp"
#include "minidl/ops/ops.hpp"

namespace minidl::autograd {
namespace {

class Differentiator;

class Ctx final : public ir::GradCtx {
 public:
  Ctx(Differentiator& d, const ir::Node& n) : d_(d), n_(n) {}
  const ir::Node& node() const override { return n_; }
  ir::Value* out_grad(int i) const override;
  bool needs_input_grad(int i) const override;
  void set_input_grad(int i, ir::Value* grad) override;
  ir::Value* op(const ir::OpDef& def, std::vector<ir::Value*> inputs, ir::Attrs attrs,
                int output) override;

 private:
  Differentiator& d_;
  const ir::Node& n_;
};

class Differentiator {
 public:
  explicit Differentiator(ir::Graph& g) : g_(g) {}

  std::vector<ir::Value*> run(const std::vector<ir::Value*>& losses,
                              const std::vector<std::pair<ir::Value*, ir::Value*>>& seeds,
                              const std::vector<ir::Value*>& params) {
    MINIDL_CHECK(!losses.empty() || !seeds.empty(), "differentiate: no loss given");
    const std::size_t first_new = g_.nodes().size();
    std::vector<ir::Value*> ends = losses;
    for (const auto& [v, grad] : seeds) ends.push_back(v);
    mark_active(ends, params);
    for (ir::Value* loss : losses) {
      MINIDL_CHECK(loss->shape().numel() == 1 && loss->dtype() == DType::F32,
                   "differentiate: loss ", loss->ref(), " of ", loss->producer()->describe(),
                   " must be a single f32 element, got ", loss->shape(), " ", loss->dtype());
      accumulate(loss, ops::fill(g_, loss->shape(), 1.0f));
    }
    for (const auto& [v, grad] : seeds) {
      MINIDL_CHECK(grad->shape() == v->shape() && grad->dtype() == v->dtype(),
                   "differentiate: the gradient ", grad->ref(), " given for ", v->ref(), " of ",
                   v->producer()->describe(), " is ", grad->shape(), " ", grad->dtype(),
                   ", the value ", v->shape(), " ", v->dtype());
      accumulate(v, grad);
    }
    // Reverse order of the forward nodes only; backward nodes are appended as we go.
    const std::vector<ir::Node*> forward(g_.nodes().begin(), g_.nodes().begin() + first_new);
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      ir::Node* n = *it;
      // A node without inputs (a source, a recv) has nothing to pass its gradient to.
      if (!active_.count(n) || n->def().is_source() || n->inputs().empty()) continue;
      bool any = false;
      for (ir::Value* out : n->outputs()) any |= grads_.count(out) > 0;
      if (!any) continue;
      MINIDL_CHECK(n->def().grad_fn() != nullptr, n->describe(),
                   ": cannot differentiate through this op: ", n->def().no_grad_reason());
      Ctx ctx(*this, *n);
      n->def().grad_fn()(ctx);
    }
    for (std::size_t i = first_new; i < g_.nodes().size(); ++i)
      g_.nodes()[i]->set_phase(ir::Phase::Backward);

    std::vector<ir::Value*> result;
    for (ir::Value* p : params) {
      auto it = grads_.find(p);
      MINIDL_CHECK(it != grads_.end(), "differentiate: ", p->producer()->describe(),
                   " does not affect the loss");
      result.push_back(it->second);
    }
    return result;
  }

  void accumulate(ir::Value* v, ir::Value* grad) {
    MINIDL_ASSERT(grad->shape() == v->shape(), "gradient of ", v->ref(), " has shape ",
                  grad->shape(), ", value has ", v->shape());
    auto [it, inserted] = grads_.try_emplace(v, grad);
    if (!inserted) {
      it->second =
          g_.add_node(ops::op_add, {it->second, grad}, {}, v->producer()->name() + ".grad_sum")
              ->output();
    }
  }

  ir::Value* grad_of(ir::Value* v) const {
    auto it = grads_.find(v);
    return it == grads_.end() ? nullptr : it->second;
  }
  bool needs_grad(const ir::Value* v) const { return requires_.count(v) > 0; }
  ir::Graph& graph() { return g_; }

 private:
  // Active nodes lie on a path from a parameter to a loss.
  void mark_active(const std::vector<ir::Value*>& losses, const std::vector<ir::Value*>& params) {
    std::unordered_set<const ir::Node*> reaches_loss;
    std::vector<const ir::Node*> stack;
    for (ir::Value* l : losses)
      if (reaches_loss.insert(l->producer()).second) stack.push_back(l->producer());
    while (!stack.empty()) {
      const ir::Node* n = stack.back();
      stack.pop_back();
      for (const ir::Value* in : n->inputs())
        if (reaches_loss.insert(in->producer()).second) stack.push_back(in->producer());
    }
    for (ir::Value* p : params) requires_.insert(p);
    for (const ir::Node* n : g_.nodes()) {
      bool depends = false;
      for (const ir::Value* in : n->inputs()) depends |= requires_.count(in) > 0;
      if (depends)
        for (const ir::Value* out : n->outputs()) requires_.insert(out);
      if ((depends ||
           (!n->outputs().empty() && std::count(params.begin(), params.end(), n->output(0)) > 0)) &&
          reaches_loss.count(n))
        active_.insert(n);
    }
  }

  ir::Graph& g_;
  std::unordered_set<const ir::Value*> requires_;
  std::unordered_set<const ir::Node*> active_;
  std::unordered_map<const ir::Value*, ir::Value*> grads_;
};

ir::Value* Ctx::out_grad(int i) const { return d_.grad_of(n_.output(i)); }
bool Ctx::needs_input_grad(int i) const { return d_.needs_grad(n_.input(i)); }
void Ctx::set_input_grad(int i, ir::Value* grad) {
  if (needs_input_grad(i)) d_.accumulate(n_.input(i), grad);
}
ir::Value* Ctx::op(const ir::OpDef& def, std::vector<ir::Value*> inputs, ir::Attrs attrs,
                   int output) {
  return d_.graph()
      .add_node(def, std::move(inputs), std::move(attrs), n_.name() + ".bwd")
      ->output(output);
}

}  // namespace

std::vector<ir::Value*> differentiate(ir::Graph& g, const std::vector<ir::Value*>& losses,
                                      const std::vector<ir::Value*>& params) {
  return Differentiator(g).run(losses, {}, params);
}

std::vector<ir::Value*> differentiate(ir::Graph& g, const std::vector<ir::Value*>& losses,
                                      const std::vector<std::pair<ir::Value*, ir::Value*>>& seeds,
                                      const std::vector<ir::Value*>& params) {
  return Differentiator(g).run(losses, seeds, params);
}

GradCheckResult check_gradients(std::span<Tensor> params, std::span<const Tensor> analytic,
                                const std::function<double()>& eval_loss,
                                const GradCheckOptions& options) {
  GradCheckResult result;
  int failures = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    float* x = params[t].data<float>();
    const float* a = analytic[t].data<float>();
    const std::int64_t n = params[t].numel();
    const std::int64_t step = std::max<std::int64_t>(1, n / options.max_elements);
    for (std::int64_t i = 0; i < n; i += step) {
      const float saved = x[i];
      // The perturbed values are what the f32 kernels actually see, so divide by their
      // real distance rather than by 2h.
      const float h = static_cast<float>(options.eps * std::max(1.0, std::fabs(double{saved})));
      const float up = saved + h, down = saved - h;
      x[i] = up;
      const double lp = eval_loss();
      x[i] = down;
      const double lm = eval_loss();
      x[i] = saved;
      const double numeric = (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
      const double analytic_v = a[i];
      const double diff = std::fabs(numeric - analytic_v);
      const double scale =
          std::max({std::fabs(numeric), std::fabs(analytic_v), options.atol / options.rtol});
      const double err = diff / scale;
      result.max_error = std::max(result.max_error, err);
      if (err > options.rtol && diff > options.atol) {
        result.ok = false;
        if (failures++ < 8) {
          result.report += fmt::format("tensor {} element {}: analytic {:.6g}, numeric {:.6g}\n", t,
                                       i, analytic_v, numeric);
        }
      }
    }
  }
  return result;
}

}  // namespace minidl::autograd

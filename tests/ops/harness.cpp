#include "harness.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <map>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl::testing {
namespace {

std::map<std::string, std::vector<OpCase>>& registered() {
  static std::map<std::string, std::vector<OpCase>> r;
  return r;
}

DType dtype_at(const std::vector<DType>& d, std::size_t i) {
  return i < d.size() ? d[i] : DType::F32;
}

Tensor random_input(const Shape& s, DType t, const OpCase& c, std::uint64_t stream) {
  Tensor x = Tensor::empty(s, t);
  const CounterRng rng(c.seed);
  if (t == DType::F32 && c.distinct) {
    const std::int64_t n = x.numel();
    const double step = 4.0 / static_cast<double>(n);
    const std::vector<std::int64_t> order = permutation(n, c.seed * 1000 + stream);
    for (std::int64_t i = 0; i < n; ++i) {
      x.data<float>()[i] =
          static_cast<float>((static_cast<double>(order[i]) - 0.5 * (n - 1)) * step);
    }
  } else if (t == DType::F32) {
    rng.fill_normal(x, stream, 0.0f, 1.0f);
    float* p = x.data<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (std::fabs(p[i]) < c.kink_margin) p[i] = p[i] < 0 ? -c.kink_margin : c.kink_margin;
      if (c.positive_margin >= 0.0) p[i] = std::fabs(p[i]) + static_cast<float>(c.positive_margin);
    }
  } else {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const auto v = static_cast<std::int64_t>(rng.bits(stream, i) % c.int_high);
      if (t == DType::I32)
        x.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
      else
        x.data<std::int64_t>()[i] = v;
    }
  }
  return x;
}

/// The case's graph: inputs as parameters, the node under test, and L = sum_i sum(y_i * w_i).
struct CaseGraph {
  ir::Graph g;
  std::vector<Tensor> inputs, weights;
  std::vector<ir::Value*> in_values, outs, grads;
  std::vector<int> diff_inputs;
  ir::Node* node = nullptr;
  ir::Value* loss = nullptr;
};

void build(const std::string& op, const OpCase& c, CaseGraph& cg) {
  for (std::size_t i = 0; i < c.in_shapes.size(); ++i) {
    cg.inputs.push_back(random_input(c.in_shapes[i], dtype_at(c.in_dtypes, i), c, 100 + i));
    if (c.prepare) c.prepare(i, cg.inputs.back());
    cg.in_values.push_back(ops::parameter(cg.g, fmt::format("in{}", i), cg.inputs.back()));
  }
  cg.node = cg.g.add_node(ops::op(op), cg.in_values, c.attributes, "case");
  std::vector<int> outs = c.outputs_in_loss;
  if (outs.empty()) {
    for (std::size_t i = 0; i < cg.node->outputs().size(); ++i)
      if (cg.node->output(static_cast<int>(i))->dtype() == DType::F32)
        outs.push_back(static_cast<int>(i));
  }
  const CounterRng rng(c.seed + 7);
  for (int o : outs) {
    ir::Value* y = cg.node->output(o);
    cg.weights.push_back(Tensor::empty(y->shape()));
    rng.fill_uniform(cg.weights.back(), 200 + o, -1.0f, 1.0f);
    ir::Value* w = ops::parameter(cg.g, fmt::format("w{}", o), cg.weights.back());
    ir::Value* term = ops::sum(ops::mul(y, w));
    cg.loss = cg.loss ? ops::add(cg.loss, term) : term;
    cg.outs.push_back(y);
    cg.g.add_output(y);
  }
  cg.g.add_output(cg.loss);
  std::vector<ir::Value*> diff;
  for (std::size_t i = 0; i < cg.inputs.size(); ++i) {
    const bool constant = std::count(c.constant_inputs.begin(), c.constant_inputs.end(), i) > 0;
    if (cg.inputs[i].dtype() == DType::F32 && !constant) {
      cg.diff_inputs.push_back(static_cast<int>(i));
      diff.push_back(cg.in_values[i]);
    }
  }
  if (!diff.empty() && cg.node->def().grad_fn() != nullptr) {
    cg.grads = autograd::differentiate(cg.g, cg.loss, diff);
    for (ir::Value* gv : cg.grads) cg.g.add_output(gv);
  }
}

double host_loss(const runtime::Executable& exe, const CaseGraph& cg) {
  double l = 0.0;
  for (std::size_t k = 0; k < cg.outs.size(); ++k) {
    const Tensor& y = exe.value(cg.outs[k]);
    const float* w = cg.weights[k].data<float>();
    for (std::int64_t i = 0; i < y.numel(); ++i) l += double{y.data<float>()[i]} * w[i];
  }
  return l;
}

}  // namespace

bool register_op_test(const std::string& op, std::vector<OpCase> cases) {
  registered()[op] = std::move(cases);
  return true;
}

std::set<std::string> ops_covered_by_tests() {
  std::set<std::string> covered;
  for (const auto& [op, cases] : registered()) {
    covered.insert(op);
    for (const OpCase& c : cases) {
      CaseGraph cg;
      build(op, c, cg);
      for (const ir::Node* n : cg.g.nodes()) covered.insert(n->op());
    }
  }
  return covered;
}

void run_op_cases(const std::string& op, const std::vector<OpCase>& cases,
                  const std::vector<BadCase>& bad) {
  const ir::OpDef& def = ops::op(op);
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const OpCase& c = cases[ci];
    SCOPED_TRACE(fmt::format("{} case {} shapes {}", op, ci,
                             c.in_shapes.empty() ? "" : c.in_shapes[0].str()));
    CaseGraph cg;
    build(op, c, cg);
    runtime::Executable native(cg.g, {.backend = ir::Backend::Native});
    native.run();

    // Every other backend against native, forward and gradients.
    for (const ir::KernelDef& k : def.kernels()) {
      if (k.backend == ir::Backend::Native) continue;
      std::string why;
      if (k.supports && !k.supports(*cg.node, &why)) continue;
      // The same graph with every node pinned to the backend (its "backend" annotation), so
      // that a kernel declared preferred (OpDef::preferred) does not stand in for it.
      CaseGraph ocg;
      build(op, c, ocg);
      for (ir::Node* n : ocg.g.nodes())
        n->annotations().set("backend", std::string(ir::backend_name(k.backend)));
      runtime::Executable other(ocg.g, {.backend = k.backend});
      other.run();
      std::vector<ir::Value*> check = cg.outs, ocheck = ocg.outs;
      check.insert(check.end(), cg.grads.begin(), cg.grads.end());
      ocheck.insert(ocheck.end(), ocg.grads.begin(), ocg.grads.end());
      for (std::size_t vi = 0; vi < check.size(); ++vi) {
        ir::Value* v = check[vi];
        const Tensor& a = native.value(v);
        const Tensor& b = other.value(ocheck[vi]);
        for (std::int64_t i = 0; i < a.numel(); ++i) {
          ASSERT_NEAR(a.at(i), b.at(i), 1e-4 * (1.0 + std::fabs(a.at(i))))
              << k.name << " vs native, " << v->ref() << " element " << i;
        }
      }
    }

    if (cg.grads.empty()) continue;
    std::vector<Tensor> analytic;
    for (ir::Value* gv : cg.grads) analytic.push_back(native.value(gv).clone());
    std::vector<Tensor> params;
    for (int i : cg.diff_inputs) params.push_back(cg.inputs[i]);
    autograd::GradCheckOptions opt;
    opt.rtol = c.rtol;
    const auto r = autograd::check_gradients(
        params, analytic,
        [&] {
          native.run();
          return host_loss(native, cg);
        },
        opt);
    EXPECT_TRUE(r.ok) << op << ": gradient mismatch (max scaled error " << r.max_error << ")\n"
                      << r.report;
  }

  for (const BadCase& b : bad) {
    ir::Graph g;
    std::vector<ir::Value*> in;
    for (std::size_t i = 0; i < b.in_shapes.size(); ++i) {
      const DType t = dtype_at(b.in_dtypes, i);
      in.push_back(ops::input(g, fmt::format("in{}", i), b.in_shapes[i], t));
    }
    try {
      g.add_node(def, in, b.attributes, "bad_case");
      ADD_FAILURE() << op << " accepted bad inputs; expected an error containing '" << b.expect
                    << "'";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("'bad_case'"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(op));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(b.expect));
    }
  }
}

std::vector<OpCase> broadcast_cases() {
  return {
      OpCase().shapes({{4, 5}, {4, 5}}),
      OpCase().shapes({{3, 2, 2, 7}, {3, 2, 2, 7}}),
      OpCase().shapes({{4, 5}, {5}}),
      OpCase().shapes({{4, 1}, {1, 5}}),
      OpCase().shapes({{2, 3, 4, 5}, {1, 3, 1, 1}}),
      OpCase().shapes({{3}, {2, 1, 3}}),
      OpCase().shapes({{}, {3, 2}}),
  };
}

std::vector<BadCase> broadcast_bad_cases() {
  return {{{{4, 5}, {5, 4}}, {}, {}, "cannot broadcast [4,5] with [5,4]"}};
}

}  // namespace minidl::testing

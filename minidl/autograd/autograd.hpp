// Reverse-mode differentiation as a graph transformation.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::autograd {

/// Appends to g the nodes that compute d(sum of losses)/d(param) for each param, using each op's
/// gradient rule, and returns one gradient value per param, in order. Gradients of values used
/// several times are summed (fan-out). Each loss must hold one element. New nodes are annotated
/// phase=backward. Throws when a param does not reach any loss or an op on the path has no
/// gradient rule.
std::vector<ir::Value*> differentiate(ir::Graph& g, const std::vector<ir::Value*>& losses,
                                      const std::vector<ir::Value*>& params);
inline std::vector<ir::Value*> differentiate(ir::Graph& g, ir::Value* loss,
                                             const std::vector<ir::Value*>& params) {
  return differentiate(g, std::vector<ir::Value*>{loss}, params);
}

/// Same, but the backward starts from given gradients: seeds[i].second is the gradient of
/// seeds[i].first (a pipeline stage's, received from the next stage), besides the losses.
std::vector<ir::Value*> differentiate(ir::Graph& g, const std::vector<ir::Value*>& losses,
                                      const std::vector<std::pair<ir::Value*, ir::Value*>>& seeds,
                                      const std::vector<ir::Value*>& params);

struct GradCheckOptions {
  double eps = 1e-3;   // step, relative to max(1, |x|)
  double rtol = 2e-2;  // allowed |analytic - numeric| / max(|analytic|, |numeric|, atol_floor)
  double atol = 2e-3;  // absolute floor below which differences are ignored
  std::int64_t max_elements = 64;  // elements checked per tensor (spread evenly)
};

struct GradCheckResult {
  bool ok = true;
  double max_error = 0.0;  // worst scaled error seen
  std::string report;      // first failures: tensor, element, analytic, numeric
};

/// Central finite differences in double precision: for each checked element x of params[t],
/// numeric = (loss(x + h) - loss(x - h)) / 2h with loss evaluated by eval_loss (which must read
/// params' current values) and compared with analytic[t].
GradCheckResult check_gradients(std::span<Tensor> params, std::span<const Tensor> analytic,
                                const std::function<double()>& eval_loss,
                                const GradCheckOptions& options = {});

}  // namespace minidl::autograd

// Passes rewrite a graph; the pass manager runs them in order, verifies after each, and dumps
// the graph after the pass named by MINIDL_DUMP_AFTER (text on stderr, or DOT when
// MINIDL_DUMP_FORMAT=dot).
//
// A pipeline is declared, not hand-ordered: each pass states the facts about the graph it needs
// ("gradients-reduced") and those it provides, and PassManager::add refuses a pass whose needs
// no earlier pass (or the pipeline's starting facts) provides. A misordered pipeline is an
// error when it is built, not a comment.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::ir {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  /// Returns true if the graph changed.
  virtual bool run(Graph& g) = 0;
  /// Facts that must hold before the pass runs.
  virtual std::vector<std::string> needs() const { return {}; }
  /// Facts that hold after it ran (whether or not it changed anything).
  virtual std::vector<std::string> provides() const { return {}; }
};

class PassManager {
 public:
  /// facts: what holds of the graphs this pipeline will run on ("differentiated").
  explicit PassManager(std::vector<std::string> facts = {});
  /// Appends a pass; throws minidl::Error naming the pass, the missing fact and the pipeline so
  /// far when a fact it needs is not provided before it.
  PassManager& add(std::unique_ptr<Pass> pass);
  /// The passes' names in order, "dce -> fuse-bias-activation -> ...".
  std::string describe() const;
  /// Runs every pass once, in order. Returns true if any changed the graph.
  bool run(Graph& g);
  void set_verify(bool on) { verify_ = on; }

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  std::vector<std::string> facts_;
  bool verify_ = true;
};

/// Removes nodes that neither feed a graph output nor have a side effect.
class DeadCodeElimination final : public Pass {
 public:
  std::string_view name() const override { return "dce"; }
  bool run(Graph& g) override;
};

/// Runs each optimizer update as soon as its inputs allow: right after its gradient is made and
/// the last reader of the parameter's old value ran, instead of after the whole backward. The
/// gradient's buffer (and a fused update's factors) is then free for the rest of the backward.
/// No value changes: an update reads only its parameter, gradient, state and the step's
/// scalars. The sources move to the front; every other node keeps its order (collectives
/// included). Graphs of thread replicas keep their updates last (their parallel sections would
/// split around them).
class UpdatesWhenReady final : public Pass {
 public:
  std::string_view name() const override { return "updates-when-ready"; }
  std::vector<std::string> needs() const override { return {"updates-fused"}; }
  bool run(Graph& g) override;
};

}  // namespace minidl::ir

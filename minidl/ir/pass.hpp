// Passes rewrite a graph; the pass manager runs them in order, verifies after each, and dumps
// the graph after the pass named by MINIDL_DUMP_AFTER (text on stderr, or DOT when
// MINIDL_DUMP_FORMAT=dot).
#pragma once

#include <memory>
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
};

class PassManager {
 public:
  PassManager& add(std::unique_ptr<Pass> pass);
  /// Runs every pass once, in order. Returns true if any changed the graph.
  bool run(Graph& g);
  void set_verify(bool on) { verify_ = on; }

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  bool verify_ = true;
};

/// Removes nodes that neither feed a graph output nor have a side effect.
class DeadCodeElimination final : public Pass {
 public:
  std::string_view name() const override { return "dce"; }
  bool run(Graph& g) override;
};

}  // namespace minidl::ir

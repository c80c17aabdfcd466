#include "minidl/ir/printer.hpp"

namespace minidl::ir {

namespace {

std::string phase_of(const Node& n) {
  if (n.def().is_source()) return "source";
  return std::string(phase_name(n.phase()));
}

std::string outputs_text(const Node& n) {
  std::string s;
  for (const Value* v : n.outputs()) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {}", v->shape(), v->dtype());
    if (v->stored() != v->dtype()) s += fmt::format(" (stored {})", v->stored());
    if (!v->layout().empty()) s += " " + v->layout();
  }
  return s;
}

}  // namespace

std::string to_text(const Graph& g) {
  std::string s = fmt::format("graph: {} nodes\n", g.nodes().size());
  for (const Node* n : g.nodes()) {
    std::string lhs;
    for (const Value* v : n->outputs()) lhs += (lhs.empty() ? "" : ", ") + v->ref();
    std::string args;
    for (const Value* v : n->inputs()) args += (args.empty() ? "" : ", ") + v->ref();
    std::string attrs;
    for (const auto& [k, v] : n->attrs().items())
      attrs += fmt::format(" {}={}", k, attr_to_string(v));
    for (const auto& [k, v] : n->annotations().items())
      attrs += fmt::format(" @{}={}", k, attr_to_string(v));
    if (n->replica() >= 0) attrs += fmt::format(" @replica={}", n->replica());
    s += fmt::format("  {} = {}({}){} -> {}  # {} [{}]\n", lhs, n->op(), args, attrs,
                     outputs_text(*n), n->name(), phase_of(*n));
  }
  std::string outs;
  for (const Value* v : g.outputs()) outs += (outs.empty() ? "" : ", ") + v->ref();
  s += fmt::format("  outputs: {}\n", outs);
  return s;
}

std::string to_dot(const Graph& g) {
  std::string s =
      "digraph minidl {\n  rankdir=TB;\n  node [shape=box, style=filled, "
      "fontname=\"Helvetica\"];\n";
  for (const Node* n : g.nodes()) {
    const std::string phase = phase_of(*n);
    const char* color = phase == "source"     ? "#e8e8e8"
                        : phase == "backward" ? "#f9d9b6"
                        : phase == "update"   ? "#c9e7c4"
                                              : "#cfe0f7";
    std::string label = fmt::format("{}\\n{}", n->op(), n->name());
    for (const auto& [k, v] : n->attrs().items()) {
      std::string val = attr_to_string(v);
      for (char& c : val)
        if (c == '"') c = '\'';
      label += fmt::format("\\n{}={}", k, val);
    }
    // Pipeline stage and tensor-parallel shard (the text form shows them as @stage=, @shard=).
    for (const char* key : {"stage", "shard"}) {
      if (const AttrValue* a = n->annotations().find(key))
        label += fmt::format("\\n{} {}", key, attr_to_string(*a));
    }
    label += fmt::format("\\n[{}]", phase);
    s += fmt::format("  n{} [label=\"{}\", fillcolor=\"{}\"];\n", n->id(), label, color);
  }
  for (const Node* n : g.nodes()) {
    for (const Value* in : n->inputs()) {
      s += fmt::format("  n{} -> n{} [label=\"{} {}\", fontsize=9];\n", in->producer()->id(),
                       n->id(), in->ref(), in->shape());
    }
  }
  s += "}\n";
  return s;
}

}  // namespace minidl::ir

#include "minidl/ir/order.hpp"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "minidl/core/error.hpp"

namespace minidl::ir {

std::vector<Node*> ordered_by(const Graph& g, const std::function<std::int64_t(const Node*)>& key,
                              const std::vector<std::pair<const Node*, const Node*>>& extra,
                              std::string_view what) {
  const std::vector<Node*>& nodes = g.nodes();
  std::unordered_map<const Node*, std::size_t> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  std::unordered_map<const Node*, std::vector<const Node*>> next;
  std::unordered_map<const Node*, int> waits;
  auto edge = [&](const Node* from, const Node* to) {
    next[from].push_back(to);
    ++waits[to];
  };
  for (const Node* n : nodes) {
    std::unordered_set<const Node*> from;
    for (const Value* in : n->inputs()) from.insert(in->producer());
    for (std::size_t o = 0; o < n->outputs().size(); ++o) {
      const int in = n->def().shares_input(static_cast<int>(o));
      if (in < 0 || n->def().is_alias()) continue;
      for (const Node* reader : n->input(in)->users())
        if (reader != n) from.insert(reader);
    }
    for (const Node* f : from) edge(f, n);
  }
  for (const auto& [from, to] : extra) edge(from, to);
  using Key = std::pair<std::int64_t, std::size_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (const Node* n : nodes)
    if (waits[n] == 0) ready.push({key(n), index.at(n)});
  std::vector<Node*> order;
  order.reserve(nodes.size());
  while (!ready.empty()) {
    Node* n = nodes[ready.top().second];
    ready.pop();
    order.push_back(n);
    for (const Node* m : next[n])
      if (--waits[m] == 0) ready.push({key(m), index.at(m)});
  }
  MINIDL_ASSERT(order.size() == nodes.size(), what, ": the graph has a cycle");
  return order;
}

}  // namespace minidl::ir

// A store shared by all simulated ranks of a run under SimGrid's SMPI. smpirun loads the
// program once per rank, each copy with globals of its own; this store lives in a shared
// library of its own (minidl_simulated_store), which the process loads once, so every rank sees
// the same entries. Only in a simulated build.
#pragma once

#include <memory>
#include <string>

namespace minidl {

/// The object kept under key, or null.
std::shared_ptr<void> simulated_store_get(const std::string& key);
/// Keeps value under key until the process ends (never destroyed: the copy of the program
/// whose code would destroy it may be unloaded first).
void simulated_store_put(const std::string& key, std::shared_ptr<void> value);

}  // namespace minidl

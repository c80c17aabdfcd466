// Parameter files in the .safetensors format (the one PyTorch / Hugging Face tools read).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "minidl/core/tensor.hpp"

namespace minidl {

/// Named tensors; the order is kept (it is the order of the data in a file).

/// Writes the .safetensors format (8-byte little-endian header length, JSON header with
/// dtype/shape/data_offsets per tensor and optional "__metadata__" string map, then data, each
/// tensor's bytes in the given order). Writes to "<path>.tmp" (same directory), fsyncs it,
/// renames it over path and fsyncs the directory, so no half-written file is ever left at path;
/// removes the temp file on failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;
};

/// Reads and validates a .safetensors file (F32, I32, I64 tensors); anything malformed throws
/// minidl::Error naming the file, the tensor and the field.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace minidl

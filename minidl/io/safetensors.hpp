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
/// tensor's bytes in the given order), through write_file_atomically: an exclusive temporary
/// file in path's directory, fsynced and renamed over path, so no half-written file is ever left
/// at path; the temporary file is removed on failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;
};

/// Reads and validates a .safetensors file (F32, I32, I64 tensors); anything malformed throws
/// minidl::Error naming the file, the tensor and the field. Only a regular file is read; the
/// header's length is checked against the file and its nesting (at most 32 deep) before it is
/// parsed, and the tensors' extents against the file before their data are allocated.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace minidl

// Tensor: a shape, a dtype and a pointer into 64-byte aligned storage. Copies share storage;
// clone() copies data. A view wraps memory owned elsewhere (a planned runtime buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "minidl/core/dtype.hpp"
#include "minidl/core/error.hpp"
#include "minidl/core/shape.hpp"

namespace minidl {

inline constexpr std::size_t kAlignment = 64;

/// What a container's memory cgroup still allows: the smallest of (limit - usage) over the
/// process's memory cgroup and its ancestors, for cgroup v2 (memory.max, memory.current) and v1
/// (memory/.../memory.limit_in_bytes, memory.usage_in_bytes). root: where the cgroup file
/// system is mounted (/sys/fs/cgroup); self: the text of /proc/self/cgroup. nullopt: no limit.
std::optional<std::size_t> cgroup_available_memory(const std::string& root,
                                                   const std::string& self);

/// Where the memory a process may still take comes from, and how much.
struct MemoryBudget {
  std::size_t bytes = 0;  // 0: unknown
  std::string source;     // "MemAvailable", "the memory cgroup's limit less its usage"
  int ranks = 1;          // the ranks of the job on this host, which share it
};

/// Bytes this process can still take without swapping or the OOM killer: the smaller of
/// Linux's MemAvailable and the memory cgroup's room (cgroup_available_memory, from
/// MINIDL_CGROUP_ROOT when set, else /sys/fs/cgroup), or 0 when unknown.
MemoryBudget memory_budget();
std::size_t available_memory();
/// Throws minidl::Error when bytes, taken by each of the job's ranks on this host
/// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS), exceed memory_budget(): "<what> needs 3.1 GiB,
/// more than the 2.0 GiB of memory available (MemAvailable)", or "... needs 3.1 GiB per rank,
/// 12.4 GiB for the 4 ranks on this host, more than ...". Cheap for small sizes (reads nothing
/// below 64 MiB).
void check_fits_in_memory(std::size_t bytes, const std::string& what);
/// "3.1 GiB", "512.0 MiB", "12.0 KiB", "100 B".
std::string format_bytes(std::size_t bytes);

/// Where Storage takes its memory. By default std::aligned_alloc and std::free; a simulated run
/// whose kernels do not run (its compute time injected from a table) installs one that maps
/// large blocks of every simulated rank onto the same memory (minidl/app/simulated.cpp).
struct StorageAllocator {
  /// A block of at least bytes bytes, 64-byte aligned, or nullptr when out of memory.
  void* (*allocate)(std::size_t bytes);
  void (*release)(void* data, std::size_t bytes);
};
/// Storage made from now on uses a (nullptr: the default); each block is released by the
/// allocator that made it.
void set_storage_allocator(const StorageAllocator* a);

/// An owned, 64-byte aligned block of bytes.
class Storage {
 public:
  explicit Storage(std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  const StorageAllocator* allocator_ = nullptr;  // nullptr: the default
};

class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised tensor with fresh storage.
  static Tensor empty(Shape shape, DType dtype = DType::F32);
  static Tensor zeros(Shape shape, DType dtype = DType::F32);
  static Tensor full(Shape shape, float value);
  /// Non-owning view of memory that outlives the tensor.
  static Tensor view(void* data, Shape shape, DType dtype);
  template <typename T>
  static Tensor from(Shape shape, const std::vector<T>& values) {
    MINIDL_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(), "tensor of shape ",
                 shape, " needs ", shape.numel(), " values, got ", values.size());
    Tensor t = empty(std::move(shape), dtype_of<T>());
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  bool defined() const { return data_ != nullptr || shape_.numel() == 0; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  void* raw() const { return data_; }

  /// Typed pointer; the dtype must match T.
  template <typename T>
  T* data() const {
    MINIDL_ASSERT(dtype_of<T>() == dtype_, "tensor of dtype ", dtype_, " read as ", dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <typename T>
  std::span<T> span() const {
    return {data<T>(), static_cast<std::size_t>(numel())};
  }
  /// Element i of an f32 tensor (tests and small reads, not hot loops).
  float at(std::int64_t i) const { return data<float>()[i]; }

  /// Same data, another shape with the same number of elements.
  Tensor reshaped(Shape shape) const;
  /// Deep copy into fresh storage.
  Tensor clone() const;
  /// Copies src's bytes into this tensor; shapes' element counts and dtypes must match.
  void copy_from(const Tensor& src);

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
};

/// Tensors with names, in a fixed order (parameters, checkpoint contents).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace minidl

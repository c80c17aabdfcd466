#include "minidl/core/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <sstream>
#include <string>

#include "minidl/core/threading.hpp"

namespace minidl {

namespace {

/// The first number in the file at path (or "max"): nullopt when absent, unreadable or "max".
std::optional<std::uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  std::uint64_t v = 0;
  for (char ch : word) {
    if (ch < '0' || ch > '9' || v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  return v;
}

}  // namespace

std::optional<std::size_t> cgroup_available_memory(const std::string& root,
                                                   const std::string& self) {
  std::optional<std::size_t> best;
  // A limit this large means none (cgroup v1 writes "unlimited" as a page-rounded 2^63).
  constexpr std::uint64_t kNoLimit = std::uint64_t{1} << 60;
  std::istringstream lines(self);
  for (std::string line; std::getline(lines, line);) {
    // "hierarchy-id:controllers:path"; v2 has id 0 and no controllers.
    const std::size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    std::string base, limit_file, usage_file;
    if (controllers.empty() && line.substr(0, c1) == "0") {
      base = root;
      limit_file = "memory.max";
      usage_file = "memory.current";
    } else {
      bool memory = false;
      std::istringstream names(controllers);
      for (std::string n; std::getline(names, n, ',');) memory = memory || n == "memory";
      if (!memory) continue;
      base = root + "/memory";
      limit_file = "memory.limit_in_bytes";
      usage_file = "memory.usage_in_bytes";
    }
    // The cgroup and every ancestor up to the mount's root: in a container the mount is often
    // the container's own cgroup while the path names it from the host.
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
      const std::string dir = base + path + "/";
      const std::optional<std::uint64_t> limit = read_number(dir + limit_file);
      if (limit && *limit < kNoLimit) {
        const std::uint64_t used = read_number(dir + usage_file).value_or(0);
        const std::size_t room = static_cast<std::size_t>(*limit > used ? *limit - used : 0);
        best = best ? std::min(*best, room) : room;
      }
      if (path.empty()) break;
      path.erase(path.rfind('/'));
    }
  }
  return best;
}

MemoryBudget memory_budget() {
  MemoryBudget b;
  b.ranks = ranks_on_host();
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    std::size_t kib = 0;
    while (in >> key >> kib >> unit) {
      if (key == "MemAvailable:") {
        b.bytes = kib * 1024;
        b.source = "MemAvailable";
        break;
      }
    }
  }
  const char* env = std::getenv("MINIDL_CGROUP_ROOT");
  const std::string root = env != nullptr && *env != '\0' ? env : "/sys/fs/cgroup";
  std::ifstream in("/proc/self/cgroup");
  const std::string self((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::optional<std::size_t> room = cgroup_available_memory(root, self);
  if (room && (b.bytes == 0 || *room < b.bytes)) {
    b.bytes = *room;
    b.source = "the memory cgroup's limit less its usage";
  }
  return b;
}

std::size_t available_memory() { return memory_budget().bytes; }

std::string format_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30)) return fmt::format("{:.1f} GiB", b / (1 << 30));
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (std::size_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

void check_fits_in_memory(std::size_t bytes, const std::string& what) {
  if (bytes < (std::size_t{64} << 20)) return;
  const MemoryBudget b = memory_budget();
  if (b.bytes == 0) return;
  const auto ranks = static_cast<std::size_t>(b.ranks);
  const std::size_t total = bytes > SIZE_MAX / ranks ? SIZE_MAX : bytes * ranks;
  if (total <= b.bytes) return;
  if (ranks == 1) {
    MINIDL_FAIL(what, " needs ", format_bytes(bytes), ", more than the ", format_bytes(b.bytes),
                " of memory available (", b.source, ")");
  }
  MINIDL_FAIL(what, " needs ", format_bytes(bytes), " per rank, ", format_bytes(total), " for the ",
              ranks, " ranks on this host, more than the ", format_bytes(b.bytes),
              " of memory available (", b.source, ")");
}

namespace {
std::atomic<const StorageAllocator*> storage_allocator{nullptr};
}  // namespace

void set_storage_allocator(const StorageAllocator* a) { storage_allocator.store(a); }

Storage::Storage(std::size_t nbytes)
    : nbytes_(nbytes), allocator_(storage_allocator.load(std::memory_order_relaxed)) {
  std::size_t rounded =
      (std::max<std::size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  data_ = allocator_ != nullptr ? allocator_->allocate(rounded)
                                : std::aligned_alloc(kAlignment, rounded);
  MINIDL_CHECK(data_ != nullptr, "cannot allocate ", format_bytes(nbytes), ": out of memory");
}

Storage::~Storage() {
  if (allocator_ != nullptr) {
    allocator_->release(
        data_, (std::max<std::size_t>(nbytes_, 1) + kAlignment - 1) / kAlignment * kAlignment);
  } else {
    std::free(data_);
  }
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (auto d : shape.dims()) MINIDL_CHECK(d >= 0, "negative dimension in shape ", shape);
  std::size_t bytes = dtype_size(dtype);
  for (auto d : shape.dims()) {
    MINIDL_CHECK(d == 0 || bytes <= SIZE_MAX / static_cast<std::size_t>(d), "a tensor of shape ",
                 shape, " ", dtype, " has more bytes than memory can address");
    bytes *= static_cast<std::size_t>(d);
  }
  check_fits_in_memory(bytes, fmt::format("a tensor of shape {} {}", shape, dtype));
  Tensor t;
  t.storage_ =
      std::make_shared<Storage>(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  t.data_ = t.storage_->data();
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, float value) {
  Tensor t = empty(std::move(shape), DType::F32);
  std::fill_n(t.data<float>(), t.numel(), value);
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  MINIDL_CHECK(shape.numel() == numel(), "cannot reshape ", shape_, " (", numel(), " elements) to ",
               shape, " (", shape.numel(), " elements)");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MINIDL_CHECK(src.numel() == numel() && src.dtype() == dtype_, "cannot copy a ", src.dtype(),
               " tensor of shape ", src.shape(), " into a ", dtype_, " tensor of shape ", shape_);
  if (nbytes() > 0) std::memcpy(data_, src.data_, nbytes());
}

}  // namespace minidl

#include "minidl/ops/reduce/axes.hpp"

namespace minidl::ops {
namespace {

// Empty when the axes are valid, else what is wrong with them.
std::string check_axes(const ir::Ints& axes, int rank, std::vector<bool>& reduced) {
  reduced.assign(static_cast<std::size_t>(rank), axes.empty());
  for (std::int64_t a : axes) {
    if (a < -rank || a >= rank) return fmt::format("axis {} is out of range for rank {}", a, rank);
    const auto d = static_cast<std::size_t>(a < 0 ? a + rank : a);
    if (reduced[d]) return fmt::format("axis {} is given twice in axes {}", a, Shape(axes));
    reduced[d] = true;
  }
  return {};
}

}  // namespace

std::vector<bool> reduced_axes(ir::InferCtx& c, const Shape& x) {
  std::vector<bool> reduced;
  const std::string why = check_axes(c.attr<ir::Ints>("axes"), x.rank(), reduced);
  MINIDL_CHECK_NODE(c, why.empty(), why);
  return reduced;
}

std::vector<bool> reduced_axes(const ir::Attrs& attrs, const Shape& x) {
  std::vector<bool> reduced;
  const std::string why = check_axes(attrs.get<ir::Ints>("axes"), x.rank(), reduced);
  MINIDL_CHECK(why.empty(), why);
  return reduced;
}

Shape reduced_shape(const Shape& x, const std::vector<bool>& reduced, bool keepdim) {
  std::vector<std::int64_t> dims;
  for (int d = 0; d < x.rank(); ++d) {
    if (!reduced[static_cast<std::size_t>(d)])
      dims.push_back(x[d]);
    else if (keepdim)
      dims.push_back(1);
  }
  return Shape(std::move(dims));
}

ReducePlan reduce_plan(const Shape& x, const std::vector<bool>& reduced) {
  // Merge neighbours of the same kind (dimensions of size 1 join either), from the back.
  struct Dim {
    std::int64_t size, stride;
    bool reduced;
  };
  std::vector<Dim> dims;
  std::int64_t stride = 1;
  for (int d = x.rank() - 1; d >= 0; --d) {
    const bool r = reduced[static_cast<std::size_t>(d)];
    if (x[d] != 1) {
      if (!dims.empty() && dims.back().reduced == r &&
          dims.back().stride * dims.back().size == stride)
        dims.back().size *= x[d];
      else
        dims.push_back({x[d], stride, r});
    }
    stride *= x[d];
  }
  std::reverse(dims.begin(), dims.end());
  ReducePlan p;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const Dim& d = dims[i];
    if (d.reduced) {
      p.red_dims.push_back(d.size);
      p.red_strides.push_back(d.stride);
      p.count *= d.size;
    } else if (i + 1 == dims.size()) {
      p.inner = d.size;  // stride 1
    } else {
      p.row_dims.push_back(d.size);
      p.row_strides.push_back(d.stride);
      p.rows *= d.size;
    }
  }
  return p;
}

}  // namespace minidl::ops
